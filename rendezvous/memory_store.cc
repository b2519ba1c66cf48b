#include "rendezvous/memory_store.h"

#include <algorithm>
#include <charconv>

#include "rendezvous/error.h"

namespace cxxlaunch::rendezvous {

void MemoryStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    data_[key] = value;
  }
  changed_.notify_all();
}

std::string MemoryStore::get(const std::string& key, Timeout timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  waitLocked(lock, {key}, timeout);
  return data_.at(key);
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t value = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = data_.find(key);
    if (it != data_.end()) {
      const std::string& text = it->second;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (ec != std::errc() || end != text.data() + text.size()) {
        throw InvalidArgument("add: the value at key '" + key + "' is not a counter");
      }
    }
    value += delta;
    data_[key] = std::to_string(value);
  }
  changed_.notify_all();
  return value;
}

std::string MemoryStore::compareSet(const std::string& key, const std::string& expected,
                                    const std::string& desired) {
  std::string result;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = data_.find(key);
    if (it == data_.end()) {
      if (!expected.empty()) return expected;
      data_[key] = desired;
    } else if (it->second == expected) {
      it->second = desired;
    } else {
      return it->second;
    }
    result = desired;
  }
  changed_.notify_all();
  return result;
}

void MemoryStore::wait(const std::vector<std::string>& keys, Timeout timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  waitLocked(lock, keys, timeout);
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::all_of(keys.begin(), keys.end(),
                     [&](const std::string& key) { return data_.count(key) != 0; });
}

bool MemoryStore::deleteKey(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return data_.erase(key) != 0;
}

int64_t MemoryStore::numKeys() {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(data_.size());
}

std::vector<std::string> MemoryStore::multiGet(const std::vector<std::string>& keys,
                                               Timeout timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  waitLocked(lock, keys, timeout);
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(data_.at(key));
  return values;
}

void MemoryStore::multiSet(const std::vector<std::string>& keys,
                           const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    throw InvalidArgument("multiSet: " + std::to_string(keys.size()) + " keys but " +
                          std::to_string(values.size()) + " values");
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < keys.size(); ++i) data_[keys[i]] = values[i];
  }
  changed_.notify_all();
}

void MemoryStore::waitLocked(std::unique_lock<std::mutex>& lock,
                             const std::vector<std::string>& keys, Timeout timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const auto& key : keys) {
    if (!changed_.wait_until(lock, deadline, [&] { return data_.count(key) != 0; })) {
      throw TimeoutError("store: key '" + key + "' did not appear within " +
                         std::to_string(timeout.count()) + " ms");
    }
  }
}

}  // namespace cxxlaunch::rendezvous
