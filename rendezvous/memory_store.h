#pragma once
// MemoryStore: the Store in one process's memory. It backs the embedded rendezvous server and
// multi-rank unit tests that run ranks as threads. Thread-safe; blocking calls wait on a
// condition variable, never poll.
//
// Limits: a store may be bounded (the daemon bounds each run's key space, so that one client
// cannot take the server's memory). A write that would pass a bound throws LimitExceeded naming
// it and changes nothing.

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

class MemoryStore final : public Store {
 public:
  explicit MemoryStore(StoreLimits limits = {}) : limits_(limits) {}

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

  // Throws LimitExceeded when writing `values` at `keys` (lock held) would pass a limit. A key
  // given twice counts twice: a bound may bite a little early, never late.
  void checkWriteLocked(const std::vector<std::string>& keys,
                        const std::vector<const std::string*>& values) const;
  void storeLocked(const std::string& key, const std::string& value);

  const StoreLimits limits_;
  int64_t bytes_ = 0;  // keys + values held
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> data_;
};

}  // namespace cxxlaunch::rendezvous
