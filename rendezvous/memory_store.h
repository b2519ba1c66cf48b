#pragma once
// MemoryStore: the Store in one process's memory. It backs the embedded rendezvous server and
// multi-rank unit tests that run ranks as threads. Thread-safe; blocking calls wait on a
// condition variable, never poll.

#include <condition_variable>
#include <map>
#include <mutex>

#include "rendezvous/store.h"

namespace cxxlaunch::rendezvous {

class MemoryStore final : public Store {
 public:
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

  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> data_;
};

}  // namespace cxxlaunch::rendezvous
