#include "rendezvous/memory_store.h"

#include <algorithm>
#include <charconv>

#include "common/error.h"

namespace cxxlaunch::rendezvous {

void MemoryBudget::refuse(const std::string& what) const {
  throw LimitExceeded(what + " would pass the server's total of " + std::to_string(limit_) +
                      " bytes over all runs (" + std::to_string(used_) + " held; cxxlaunchd " +
                      flag_ + ")");
}

bool MemoryBudget::fits(int64_t bytes) const { return limit_ <= 0 || used_ + bytes <= limit_; }

void MemoryBudget::take(int64_t bytes, const std::string& what) {
  int64_t used = used_;
  do {
    if (limit_ > 0 && used + bytes > limit_) refuse(what);
  } while (!used_.compare_exchange_weak(used, used + bytes));
}

MemoryStore::~MemoryStore() {
  if (budget_ != nullptr) budget_->adjust(-bytes_);
}

int64_t MemoryStore::checkWriteLocked(const std::vector<std::string>& keys,
                                      const std::vector<const std::string*>& values) const {
  auto exceeded = [](const std::string& what, int64_t limit, const char* flag) {
    throw LimitExceeded("store: " + what + " would pass the limit of " + std::to_string(limit) +
                        " (cxxlaunchd " + flag + ")");
  };
  int64_t keys_after = static_cast<int64_t>(data_.size());
  int64_t bytes_after = bytes_;
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string& key = keys[i];
    const auto key_size = static_cast<int64_t>(key.size());
    const auto value_size = static_cast<int64_t>(values[i]->size());
    if (limits_.max_key_bytes > 0 && key_size > limits_.max_key_bytes) {
      exceeded("a key of " + std::to_string(key_size) + " bytes", limits_.max_key_bytes,
               "--store-max-key-bytes");
    }
    if (limits_.max_value_bytes > 0 && value_size > limits_.max_value_bytes) {
      exceeded(
          "a value of " + std::to_string(value_size) + " bytes at key '" + key.substr(0, 64) + "'",
          limits_.max_value_bytes, "--store-max-value-bytes");
    }
    auto it = data_.find(key);
    if (it == data_.end()) {
      ++keys_after;
      bytes_after += key_size + value_size;
    } else {
      bytes_after += value_size - static_cast<int64_t>(it->second.size());
    }
  }
  if (limits_.max_keys > 0 && keys_after > limits_.max_keys) {
    exceeded("this run's keys (" + std::to_string(keys_after) + ")", limits_.max_keys,
             "--store-max-keys");
  }
  if (limits_.max_bytes > 0 && bytes_after > limits_.max_bytes && bytes_after > bytes_) {
    exceeded("this run's store bytes (" + std::to_string(bytes_after) + ")", limits_.max_bytes,
             "--store-max-bytes");
  }
  return bytes_after;
}

void MemoryStore::writeLocked(const std::vector<std::string>& keys,
                              const std::vector<const std::string*>& values) {
  const int64_t before = bytes_;
  const int64_t growth = checkWriteLocked(keys, values) - before;
  if (budget_ != nullptr && growth > 0) {
    budget_->take(growth, "a store write of " + std::to_string(growth) + " more bytes");
  }
  for (size_t i = 0; i < keys.size(); ++i) storeLocked(keys[i], *values[i]);
  // Gives back what the check counted twice (a key given twice) or what the write freed.
  if (budget_ != nullptr) budget_->adjust(bytes_ - before - std::max<int64_t>(growth, 0));
}

void MemoryStore::storeLocked(const std::string& key, const std::string& value) {
  auto [it, inserted] = data_.try_emplace(key);
  bytes_ +=
      static_cast<int64_t>(value.size()) -
      (inserted ? -static_cast<int64_t>(key.size()) : static_cast<int64_t>(it->second.size()));
  it->second = value;
}

void MemoryStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    writeLocked({key}, {&value});
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
    if (__builtin_add_overflow(value, delta, &value)) {
      throw InvalidArgument("add: the counter at key '" + key + "' would overflow (" + it->second +
                            " + " + std::to_string(delta) +
                            " is past the 64-bit range); it keeps its value");
    }
    const std::string text = std::to_string(value);
    writeLocked({key}, {&text});
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
      writeLocked({key}, {&desired});
    } else if (it->second == expected) {
      writeLocked({key}, {&desired});
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
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  const auto freed = static_cast<int64_t>(it->first.size() + it->second.size());
  bytes_ -= freed;
  if (budget_ != nullptr) budget_->adjust(-freed);
  data_.erase(it);
  return true;
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
    std::vector<const std::string*> pointers;
    pointers.reserve(values.size());
    for (const auto& value : values) pointers.push_back(&value);
    writeLocked(keys, pointers);
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
