#include "rendezvous/store.h"

#include "common/error.h"

namespace cxxlaunch::rendezvous {

std::vector<std::string> Store::multiGet(const std::vector<std::string>& keys, Timeout timeout) {
  wait(keys, timeout);
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(get(key, timeout));
  return values;
}

void Store::multiSet(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    throw InvalidArgument("multiSet: " + std::to_string(keys.size()) + " keys but " +
                          std::to_string(values.size()) + " values");
  }
  for (size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
}

}  // namespace cxxlaunch::rendezvous
