#include "rendezvous/etcd_store.h"

#include <algorithm>
#include <cctype>
#include <map>

#include "common/error.h"

namespace cxxlaunch::rendezvous {
using Clock = std::chrono::steady_clock;

namespace {
// etcd's default --max-txn-ops is 128; the fence takes one.
constexpr size_t kOpsPerTxn = 100;

int64_t parseCounter(const std::string& key, const std::string& text) {
  if (text.empty()) return 0;
  try {
    size_t used = 0;
    const int64_t v = std::stoll(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  throw InvalidArgument("store add: key '" + key + "' holds '" + text + "', not a counter");
}
}  // namespace

std::string etcdRunPrefix(const std::string& run_id, const std::string& root) {
  return root + run_id + "/";
}
std::string etcdRoundKey(const std::string& run_id, const std::string& root) {
  return etcdRunPrefix(run_id, root) + "round";
}
std::string etcdStorePrefix(const std::string& run_id, int64_t round, const std::string& root) {
  return etcdRunPrefix(run_id, root) + "store/" + std::to_string(round) + "/";
}

std::string etcdRoot(const std::string& prefix) {
  const bool blank = std::any_of(prefix.begin(), prefix.end(),
                                 [](unsigned char c) { return std::isspace(c) != 0; });
  if (prefix.empty() || prefix.front() != '/' || blank) {
    throw InvalidArgument("etcd_prefix '" + prefix +
                          "' is no key prefix: it must start with '/' and have no blanks "
                          "(e.g. /team/jobs)");
  }
  return prefix.back() == '/' ? prefix : prefix + "/";
}

std::string etcdRootOf(const std::string& url) {
  if (url.rfind(kEtcdScheme, 0) != 0) return kEtcdRoot;
  const size_t slash = url.find('/', sizeof(kEtcdScheme) - 1);
  return slash == std::string::npos ? kEtcdRoot : url.substr(slash);
}

EtcdStore::EtcdStore(std::shared_ptr<EtcdClient> client, std::string run_id, int64_t round,
                     const std::string& root)
    : client_(std::move(client)),
      run_id_(std::move(run_id)),
      round_(round),
      round_key_(etcdRoundKey(run_id_, root)),
      round_text_(std::to_string(round)),
      prefix_(etcdStorePrefix(run_id_, round, root)) {}

void EtcdStore::stale(const EtcdTxnResult& failed, const char* what) const {
  std::string now = "is over";
  if (!failed.results.empty() && !failed.results[0].kvs.empty()) {
    now = "is at round " + failed.results[0].kvs[0].value;
  }
  throw StaleError(std::string("store ") + what + ": round " + round_text_ + " of run '" + run_id_ +
                   "' is stale (the run " + now + ")");
}

EtcdTxnResult EtcdStore::fenced(const std::vector<EtcdCompare>& compares,
                                const std::vector<EtcdOp>& ops, const std::vector<EtcdOp>& failure,
                                const char* what) {
  std::vector<EtcdCompare> all = {EtcdCompare::valueIs(round_key_, round_text_)};
  all.insert(all.end(), compares.begin(), compares.end());
  std::vector<EtcdOp> otherwise = {EtcdOp::get(round_key_)};
  otherwise.insert(otherwise.end(), failure.begin(), failure.end());
  EtcdTxnResult r = client_->txn(all, ops, otherwise);
  if (!r.succeeded) {
    const auto& fence = r.results.at(0).kvs;
    if (fence.empty() || fence[0].value != round_text_) stale(r, what);
  }
  return r;
}

void EtcdStore::set(const std::string& key, const std::string& value) {
  fenced({}, {EtcdOp::put(prefix_ + key, value)}, {}, "set");
}

std::string EtcdStore::waitFor(const std::string& key, Clock::time_point deadline) {
  const std::string full = prefix_ + key;
  for (;;) {
    const EtcdTxnResult r = fenced({}, {EtcdOp::get(full)}, {}, "get");
    if (!r.results.at(0).kvs.empty()) return r.results[0].kvs[0].value;
    const auto left = std::chrono::duration_cast<Timeout>(deadline - Clock::now());
    if (left.count() <= 0) {
      throw TimeoutError("store: key '" + key + "' did not appear in round " + round_text_ +
                         " of run '" + run_id_ + "'");
    }
    // A new round does not wake this watch; the next fenced read, at most one watch slice
    // (10 s) later, turns it into StaleError.
    client_->waitForChange(full, "", r.revision, left);
  }
}

std::string EtcdStore::get(const std::string& key, Timeout timeout) {
  return waitFor(key, Clock::now() + timeout);
}

// Compare-and-swap on the key's mod revision (0: missing), until no one else wrote in between.
int64_t EtcdStore::add(const std::string& key, int64_t delta) {
  const std::string full = prefix_ + key;
  EtcdTxnResult r = fenced({}, {EtcdOp::get(full)}, {}, "add");
  for (;;) {
    const auto& kvs = r.results.at(r.succeeded ? 0 : 1).kvs;
    const int64_t mod = kvs.empty() ? 0 : kvs[0].mod_revision;
    const int64_t value = (kvs.empty() ? 0 : parseCounter(key, kvs[0].value)) + delta;
    r = fenced({EtcdCompare::modIs(full, mod)}, {EtcdOp::put(full, std::to_string(value))},
               {EtcdOp::get(full)}, "add");
    if (r.succeeded) return value;
  }
}

std::string EtcdStore::compareSet(const std::string& key, const std::string& expected,
                                  const std::string& desired) {
  const std::string full = prefix_ + key;
  // An existing key whose value is `expected` (etcd's value compare is false on a missing key).
  EtcdTxnResult r = fenced({EtcdCompare::valueIs(full, expected)}, {EtcdOp::put(full, desired)},
                           {EtcdOp::get(full)}, "compare_set");
  if (r.succeeded) return desired;
  const auto& kvs = r.results.at(1).kvs;
  if (!kvs.empty()) return kvs[0].value;
  if (!expected.empty()) return expected;
  // Missing, and `expected` is empty: create it, unless someone else just did.
  r = fenced({EtcdCompare::missing(full)}, {EtcdOp::put(full, desired)}, {EtcdOp::get(full)},
             "compare_set");
  if (r.succeeded) return desired;
  const auto& now = r.results.at(1).kvs;
  return now.empty() ? expected : now[0].value;
}

void EtcdStore::wait(const std::vector<std::string>& keys, Timeout timeout) {
  const auto deadline = Clock::now() + timeout;
  for (const auto& key : keys) waitFor(key, deadline);
}

bool EtcdStore::check(const std::vector<std::string>& keys) {
  for (size_t at = 0; at < keys.size(); at += kOpsPerTxn) {
    std::vector<EtcdOp> ops;
    for (size_t i = at; i < std::min(keys.size(), at + kOpsPerTxn); ++i) {
      ops.push_back(EtcdOp::get(prefix_ + keys[i]));
      ops.back().count_only = true;
    }
    const EtcdTxnResult r = fenced({}, ops, {}, "check");
    for (const auto& result : r.results) {
      if (result.count == 0) return false;
    }
  }
  if (keys.empty()) fenced({}, {}, {}, "check");
  return true;
}

bool EtcdStore::deleteKey(const std::string& key) {
  const EtcdTxnResult r = fenced({}, {EtcdOp::erase(prefix_ + key)}, {}, "delete");
  return r.results.at(0).deleted > 0;
}

int64_t EtcdStore::numKeys() {
  const EtcdTxnResult r =
      fenced({}, {EtcdOp::prefix(prefix_, /*count_only=*/true)}, {}, "num_keys");
  return r.results.at(0).count;
}

std::vector<std::string> EtcdStore::multiGet(const std::vector<std::string>& keys,
                                             Timeout timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(waitFor(key, deadline));
  return values;
}

void EtcdStore::multiSet(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    throw InvalidArgument("store multi_set: " + std::to_string(keys.size()) + " keys but " +
                          std::to_string(values.size()) + " values");
  }
  // etcd refuses a transaction that writes one key twice: the last value wins, as it would
  // one set after another.
  std::map<std::string, std::string> last;
  for (size_t i = 0; i < keys.size(); ++i) last[keys[i]] = values[i];
  std::vector<EtcdOp> ops;
  for (const auto& [key, value] : last) {
    ops.push_back(EtcdOp::put(prefix_ + key, value));
    if (ops.size() == kOpsPerTxn) {
      fenced({}, ops, {}, "multi_set");
      ops.clear();
    }
  }
  if (!ops.empty() || last.empty()) fenced({}, ops, {}, "multi_set");
}

}  // namespace cxxlaunch::rendezvous
