#pragma once
// PrefixStore: a view of another Store with every key under "<prefix>/". Rendezvous rounds and
// run ids use it so that keys of different rounds or jobs never meet. Thread-safe when the
// underlying store is.

#include <memory>

#include "rendezvous/store.h"

namespace cxxlaunch::rendezvous {

class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> store);

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Timeout timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override;
  void wait(const std::vector<std::string>& keys, Timeout timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool deleteKey(const std::string& key) override;
  // Counts every key of the underlying store, as c10d's PrefixStore does.
  int64_t numKeys() override;
  std::vector<std::string> multiGet(const std::vector<std::string>& keys, Timeout timeout) override;
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::string>& values) override;

 private:
  std::string join(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> join(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> store_;
};

}  // namespace cxxlaunch::rendezvous
