#pragma once
// MemoryStore: the Store in one process's memory. It backs the embedded rendezvous server and
// multi-rank unit tests that run ranks as threads. Thread-safe; blocking calls wait on a
// condition variable, never poll.
//
// Limits: a store may be bounded (the daemon bounds each run's key space, so that one client
// cannot take the server's memory), and several stores may share a MemoryBudget (the daemon's
// total over all runs). A write that would pass a bound throws LimitExceeded naming it and
// changes nothing.

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>

#include "rendezvous/store.h"

namespace cxxlaunch::rendezvous {

// Bounds on one key space; 0: no bound. Bytes count keys plus values.
struct StoreLimits {
  int64_t max_keys = 0;
  int64_t max_bytes = 0;
  int64_t max_key_bytes = 0;
  int64_t max_value_bytes = 0;
};

// Bytes held by several owners (the stores and run states of a server), against one limit.
// Thread-safe.
class MemoryBudget {
 public:
  // `limit`: 0 for none; `flag`: what sets it, named in refusals.
  MemoryBudget(int64_t limit, std::string flag) : limit_(limit), flag_(std::move(flag)) {}

  // Takes `bytes` (> 0), or throws LimitExceeded when the total would pass the limit; `what`
  // says what asked ("a store write of N bytes").
  void take(int64_t bytes, const std::string& what);
  // Whether `bytes` more would fit now (no guarantee for a later take()).
  bool fits(int64_t bytes) const;
  // Changes the total by `bytes` (either sign) unchecked: for what was already allocated, and to
  // give back.
  void adjust(int64_t bytes) { used_ += bytes; }
  int64_t used() const { return used_; }
  int64_t limit() const { return limit_; }
  // The refusal of `what`, naming the limit and its flag.
  [[noreturn]] void refuse(const std::string& what) const;

 private:
  const int64_t limit_;
  const std::string flag_;
  std::atomic<int64_t> used_ = 0;
};

class MemoryStore final : public Store {
 public:
  // `budget` (optional, outliving the store): also counts this store's keys and values.
  explicit MemoryStore(StoreLimits limits = {}, MemoryBudget* budget = nullptr)
      : limits_(limits), budget_(budget) {}
  ~MemoryStore() override;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Timeout timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override;
  void wait(const std::vector<std::string>& keys, Timeout timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  std::vector<std::string> multiGet(const std::vector<std::string>& keys, Timeout timeout) override;
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::string>& values) override;

 private:
  // Waits (lock held) until all keys exist; throws TimeoutError naming the first missing key.
  void waitLocked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                  Timeout timeout);

  // Writes `values` at `keys` (lock held), all or nothing: throws LimitExceeded when that would
  // pass a limit. A key given twice counts twice in the check: a bound may bite a little early,
  // never late.
  void writeLocked(const std::vector<std::string>& keys,
                   const std::vector<const std::string*>& values);
  // The bytes held after writing `values` at `keys`; throws LimitExceeded past a limit of ours.
  int64_t checkWriteLocked(const std::vector<std::string>& keys,
                           const std::vector<const std::string*>& values) const;
  void storeLocked(const std::string& key, const std::string& value);

  const StoreLimits limits_;
  MemoryBudget* const budget_;
  int64_t bytes_ = 0;  // keys + values held
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> data_;
};

}  // namespace cxxlaunch::rendezvous
