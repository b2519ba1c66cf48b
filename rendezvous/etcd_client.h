#pragma once
// EtcdClient: a small client of etcd's v3 gRPC API (proto/etcd.proto), what the etcd rendezvous
// backend (rendezvous/etcd_rendezvous.h) and the workers' EtcdStore (rendezvous/etcd_store.h)
// need: transactions, ranges, leases and watches, with user/password auth and TLS.
//
// Fail-over: the client is given every endpoint of the cluster and talks to one at a time; a
// call that finds it unreachable (UNAVAILABLE) is retried on the next one, so one member's loss
// costs one failed attempt, not the job. A call that reached etcd and failed is not retried:
// etcd may have applied it (an outcome etcd cannot tell), and the callers decide (every write of
// the rendezvous is a compare-and-swap, which re-reads and re-decides).
//
// Errors: a wrong user or password -> InvalidArgument (one line, what to fix); etcd unreachable
// on every endpoint -> CommunicationError naming them; a call past its deadline -> TimeoutError.
// Deadlines: each attempt on a member gets the call's `timeout`, where a method takes one (0:
// EtcdOptions::call_timeout).
//
// Thread-safety: every method may be called from many threads at once.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace cxxlaunch::rendezvous {

struct EtcdOptions {
  std::vector<std::string> endpoints;  // host:port of each member
  std::string user;                    // empty: no auth
  std::string password;
  std::string tls_ca_file;  // non-empty: TLS, trusting this CA
  std::string tls_cert_file;
  std::string tls_key_file;
  std::chrono::milliseconds call_timeout = std::chrono::seconds(5);
};

// The scheme that marks an etcd endpoint list in CXXLAUNCH_STORE_ENDPOINT ("etcd://h1:p1,h2:p2").
inline constexpr char kEtcdScheme[] = "etcd://";

// "h1:p1,h2:p2" (with or without the etcd:// scheme, whose URL may end in a key root:
// "etcd://h1:p1/root/") -> {"h1:p1", "h2:p2"}; a member without a port gets etcd's client port
// 2379. Throws InvalidArgument for an empty list or a bad member.
std::vector<std::string> parseEtcdEndpoints(const std::string& text);
// The other way: "etcd://h1:p1,h2:p2", followed by `root` (the runs' key root) when given.
std::string etcdEndpointUrl(const std::vector<std::string>& endpoints,
                            const std::string& root = "");

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

// One condition of a transaction. A missing key compares as revision/version 0; its value
// compares false against anything (etcd's rule).
struct EtcdCompare {
  enum class Target { kVersion, kCreate, kMod, kValue };
  enum class Result { kEqual, kGreater, kLess, kNotEqual };
  std::string key;
  Target target = Target::kValue;
  Result result = Result::kEqual;
  int64_t number = 0;  // for kVersion, kCreate, kMod
  std::string value;   // for kValue

  static EtcdCompare valueIs(std::string key, std::string value);
  static EtcdCompare modIs(std::string key, int64_t revision);
  static EtcdCompare missing(std::string key);  // create revision 0
};

// One operation of a transaction (or a plain call).
struct EtcdOp {
  enum class Kind { kRange, kPut, kDelete };
  Kind kind = Kind::kRange;
  std::string key;
  std::string range_end;  // empty: just `key`
  std::string value;      // put
  int64_t lease = 0;      // put
  bool count_only = false;
  bool keys_only = false;
  int64_t limit = 0;  // range: at most this many keys (0: all); `count` is still the whole range's

  static EtcdOp get(std::string key);
  static EtcdOp prefix(std::string prefix, bool count_only = false, bool keys_only = false);
  static EtcdOp put(std::string key, std::string value, int64_t lease = 0);
  static EtcdOp erase(std::string key);
  static EtcdOp erasePrefix(std::string prefix);
};

struct EtcdOpResult {
  std::vector<EtcdKeyValue> kvs;  // range
  int64_t count = 0;              // range
  int64_t deleted = 0;            // delete
};

struct EtcdTxnResult {
  bool succeeded = false;
  int64_t revision = 0;               // of the store after the transaction
  std::vector<EtcdOpResult> results;  // of the branch taken, in order
};

// The end of the range of all keys that start with `prefix` (etcd's "prefix + 1").
std::string prefixEnd(const std::string& prefix);

class EtcdClient {
 public:
  // Connects lazily; authenticates at the first call when a user is given.
  explicit EtcdClient(EtcdOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  const EtcdOptions& options() const;
  // "h1:p1,h2:p2", for messages.
  std::string endpointList() const;

  // If every compare holds, runs `success`, else `failure`, atomically. At most etcd's
  // --max-txn-ops (128 by default) operations per branch.
  EtcdTxnResult txn(const std::vector<EtcdCompare>& compares, const std::vector<EtcdOp>& success,
                    const std::vector<EtcdOp>& failure = {},
                    std::chrono::milliseconds timeout = {});
  // One operation, outside a transaction; `revision` gets the store's revision when given.
  EtcdOpResult run(const EtcdOp& op, int64_t* revision = nullptr,
                   std::chrono::milliseconds timeout = {});

  // A lease of at least `ttl` (etcd rounds up to whole seconds and to its minimum); its id.
  int64_t grantLease(std::chrono::milliseconds ttl, std::chrono::seconds* granted = nullptr);
  // Renews the lease once; false when etcd says it has expired (its keys are gone).
  bool keepLeaseAlive(int64_t lease, std::chrono::milliseconds timeout = {});
  void revokeLease(int64_t lease, std::chrono::milliseconds timeout = {});

  // Ends the calls in flight now (they throw CommunicationError): for an agent that stops
  // talking to etcd while one of its threads waits on a silent member.
  void cancelCalls();
  // Ends the waitForChange calls given `cancel` (which the caller set first) now.
  void cancelWaits(const std::atomic<bool>& cancel);

  // Blocks until something changes in [key, range_end) after `revision` (exclusive), at most
  // `timeout`, and then returns true (also when etcd compacted past `revision`: re-read). False
  // when the time ran out, or when `cancel` (may be null) is set and cancelWaits(*cancel) called.
  // One watch stream per 10 s of waiting.
  bool waitForChange(const std::string& key, const std::string& range_end, int64_t revision,
                     std::chrono::milliseconds timeout, const std::atomic<bool>* cancel = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cxxlaunch::rendezvous
