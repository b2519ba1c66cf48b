#pragma once
// EtcdStore: the Store of one rendezvous round kept in etcd, for the workers of a job whose
// launchers met through the etcd backend (rendezvous/etcd_rendezvous.h).
//
// Keys: /cxxlaunch/<run_id>/store/<round>/<key>. Fencing: every call is one etcd transaction
// that first compares /cxxlaunch/<run_id>/round with this store's round, so once the run moved
// on (a restart, an eviction, the end of the job) every call fails with StaleError, as GrpcStore
// does. Blocking calls (get, wait, multiGet) wait on etcd watches, not by polling. Counters
// (`add`) are a compare-and-swap on the key's mod revision, retried until it holds.
//
// Thread-safety: safe from many threads (the client is).

#include <memory>
#include <string>

#include "rendezvous/etcd_client.h"
#include "rendezvous/store.h"

namespace cxxlaunch::rendezvous {

// The documented key layout (docs/rendezvous.md, "etcd"): every run under a root, "/cxxlaunch/"
// unless --rdzv_conf etcd_prefix names another.
inline constexpr char kEtcdRoot[] = "/cxxlaunch/";
std::string etcdRunPrefix(const std::string& run_id,
                          const std::string& root = kEtcdRoot);  // <root><run>/
std::string etcdRoundKey(const std::string& run_id,
                         const std::string& root = kEtcdRoot);  // .../round
std::string etcdStorePrefix(const std::string& run_id, int64_t round,
                            const std::string& root = kEtcdRoot);  // .../store/<round>/
// An etcd_prefix as given ("/team/jobs") as a root ("/team/jobs/"); InvalidArgument unless it
// starts with '/' and has no blank.
std::string etcdRoot(const std::string& prefix);
// The root an etcd:// store endpoint carries after its members ("etcd://h:p/team/jobs/"), or
// kEtcdRoot when it carries none.
std::string etcdRootOf(const std::string& url);

class EtcdStore final : public Store {
 public:
  EtcdStore(std::shared_ptr<EtcdClient> client, std::string run_id, int64_t round,
            const std::string& root = kEtcdRoot);

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
  // One fenced transaction: `ops` run when the round is current and `compares` hold; StaleError
  // when the round is not current; otherwise (a compare of the caller's failed) the result of
  // `failure`, after the round key's range (results[0]).
  EtcdTxnResult fenced(const std::vector<EtcdCompare>& compares, const std::vector<EtcdOp>& ops,
                       const std::vector<EtcdOp>& failure, const char* what);
  [[noreturn]] void stale(const EtcdTxnResult& failed, const char* what) const;
  // Blocks until `key` exists; its value.
  std::string waitFor(const std::string& key, std::chrono::steady_clock::time_point deadline);

  std::shared_ptr<EtcdClient> client_;
  std::string run_id_;
  int64_t round_;
  std::string round_key_;
  std::string round_text_;
  std::string prefix_;
};

}  // namespace cxxlaunch::rendezvous
