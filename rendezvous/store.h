#pragma once
// Store: the key-value store through which nodes and workers meet, with c10d's semantics.
//
// Values are opaque bytes (std::string). Every blocking call takes a timeout and throws
// TimeoutError when it runs out; nothing waits forever. Counters written by `add` are stored as
// decimal text, so `get` on a counter returns e.g. "3", as in c10d.
//
// Thread-safety: every implementation is safe to call from many threads at once.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cxxlaunch::rendezvous {

using Timeout = std::chrono::milliseconds;

class Store {
 public:
  // c10d's default store timeout.
  static constexpr Timeout kDefaultTimeout = std::chrono::minutes(5);

  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;

  // Blocks until `key` exists, then returns its value.
  virtual std::string get(const std::string& key, Timeout timeout) = 0;

  // Atomically adds `delta` to the counter at `key` (missing counts as 0); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  // Sets `key` to `desired` when its value equals `expected`, or when it is missing and
  // `expected` is empty. Returns the value after the call: `desired` on success, else the current
  // value (or `expected` when the key is missing), exactly as c10d does.
  virtual std::string compareSet(const std::string& key, const std::string& expected,
                                 const std::string& desired) = 0;

  // Blocks until every key exists.
  virtual void wait(const std::vector<std::string>& keys, Timeout timeout) = 0;

  // Non-blocking: true when every key exists.
  virtual bool check(const std::vector<std::string>& keys) = 0;

  // Returns whether the key existed.
  virtual bool deleteKey(const std::string& key) = 0;

  virtual int64_t numKeys() = 0;

  // Blocks until every key exists; values in the order of `keys`.
  virtual std::vector<std::string> multiGet(const std::vector<std::string>& keys, Timeout timeout);

  virtual void multiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values);
};

}  // namespace cxxlaunch::rendezvous
