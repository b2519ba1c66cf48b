#include "rendezvous/prefix_store.h"

namespace cxxlaunch::rendezvous {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : prefix_(std::move(prefix)), store_(std::move(store)) {}

std::vector<std::string> PrefixStore::join(const std::vector<std::string>& keys) const {
  std::vector<std::string> joined;
  joined.reserve(keys.size());
  for (const auto& key : keys) joined.push_back(join(key));
  return joined;
}

void PrefixStore::set(const std::string& key, const std::string& value) {
  store_->set(join(key), value);
}

std::string PrefixStore::get(const std::string& key, Timeout timeout) {
  return store_->get(join(key), timeout);
}

int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return store_->add(join(key), delta);
}

std::string PrefixStore::compareSet(const std::string& key, const std::string& expected,
                                    const std::string& desired) {
  return store_->compareSet(join(key), expected, desired);
}

void PrefixStore::wait(const std::vector<std::string>& keys, Timeout timeout) {
  store_->wait(join(keys), timeout);
}

bool PrefixStore::check(const std::vector<std::string>& keys) { return store_->check(join(keys)); }

bool PrefixStore::deleteKey(const std::string& key) { return store_->deleteKey(join(key)); }

int64_t PrefixStore::numKeys() { return store_->numKeys(); }

std::vector<std::string> PrefixStore::multiGet(const std::vector<std::string>& keys,
                                               Timeout timeout) {
  return store_->multiGet(join(keys), timeout);
}

void PrefixStore::multiSet(const std::vector<std::string>& keys,
                           const std::vector<std::string>& values) {
  store_->multiSet(join(keys), values);
}

}  // namespace cxxlaunch::rendezvous
