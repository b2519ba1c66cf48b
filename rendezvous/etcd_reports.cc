// EtcdRendezvous's reports of a run (rendezvous/etcd_rendezvous.h): `cxxlaunch status`, and
// what a join poll that found its round incomplete says it waits for.

#include <algorithm>
#include <map>
#include <set>

#include "common/error.h"
#include "proto/etcd_state.pb.h"
#include "rendezvous/etcd_rendezvous.h"
#include "rendezvous/etcd_rules.h"
#include "rendezvous/wire.h"

namespace cxxlaunch::rendezvous {
using State = rdzv::EtcdRunState;

namespace {
// How many ids a "waiting for" message lists (the rest are counted), and how many nodes
// expected back it looks up (one transaction; etcd's --max-txn-ops is 128).
constexpr int kListed = 16;
constexpr int kLookedUp = 100;
}  // namespace

// For the join timeout's message: the round, how many joined (the first few by id), and which
// of the nodes expected back (the first kLookedUp of them) have not.
std::string EtcdRendezvous::waitingFor(const State& s) {
  const auto& set = s.settings();
  const std::string nodes =
      std::to_string(set.min_nodes()) +
      (set.min_nodes() == set.max_nodes() ? "" : ".." + std::to_string(set.max_nodes()));
  if (s.phase() == State::RUNNING) {
    return "round " + std::to_string(s.round()) + " is running with " +
           std::to_string(s.participants_size()) + " of " + nodes +
           " nodes; this node waits for room (a restart or an eviction)";
  }
  EtcdOp listed = EtcdOp::prefix(roundPrefix(s.round()), false, /*keys_only=*/true);
  listed.limit = kListed;
  std::vector<EtcdOp> ops = {listed};
  const int looked_up = std::min(s.expected_size(), kLookedUp);
  for (int i = 0; i < looked_up; ++i) {
    ops.push_back(EtcdOp::get(roundPrefix(s.round()) + "node/" + s.expected(i)));
    ops.back().count_only = true;
  }
  const EtcdTxnResult r = client_->txn({}, ops);
  std::string joined;
  for (const auto& kv : r.results.at(0).kvs) {
    std::string name = kv.key.substr(roundPrefix(s.round()).size());
    if (name.rfind("node/", 0) == 0) name = name.substr(5);
    if (name.rfind("rank/", 0) == 0) name = "rank " + name.substr(5);
    joined += (joined.empty() ? "" : ", ") + name;
  }
  const int64_t count = r.results[0].count;
  if (count > static_cast<int64_t>(r.results[0].kvs.size())) {
    joined += " and " + std::to_string(count - r.results[0].kvs.size()) + " more";
  }
  std::string text = "round " + std::to_string(s.round()) + " has " + std::to_string(count) +
                     " of " + nodes + " nodes (joined: " + (joined.empty() ? "none" : joined) + ")";
  std::string missing;
  int listed_missing = 0;
  for (int i = 0; i < looked_up; ++i) {
    if (r.results.at(1 + i).count > 0 || listed_missing == kListed) continue;
    missing += (missing.empty() ? "" : ", ") + s.expected(i);
    ++listed_missing;
  }
  if (!missing.empty()) text += "; expected back: " + missing;
  if (s.expected_size() > looked_up) {
    text += " (of the first " + std::to_string(looked_up) + " of " +
            std::to_string(s.expected_size()) + " expected)";
  }
  return text;
}

RunStatus EtcdRendezvous::status() {
  const EtcdTxnResult read = client_->txn(
      {}, {EtcdOp::get(prefix_ + "state"), EtcdOp::prefix(prefix_ + "progress/", false),
           EtcdOp::prefix(prefix_ + "round/")});
  std::map<std::string, rdzv::EtcdNodeProgress> progress;  // by node id
  const size_t skip = prefix_.size() + std::string("progress/").size();
  for (const auto& kv : read.results.at(1).kvs) {
    rdzv::EtcdNodeProgress p;
    if (p.ParseFromString(kv.value)) progress[kv.key.substr(skip)] = std::move(p);
  }
  const int64_t now = etcd_rules::wallMs();
  auto withProgress = [&](NodeState& n) {
    auto it = progress.find(n.spec.id);
    if (it == progress.end()) return;
    n.heartbeat_age = Millis(std::max<int64_t>(0, now - it->second.written_ms()));
    for (const auto& w : it->second.workers()) n.workers.push_back(wire::fromProto(w));
  };
  State s;
  if (read.results.at(0).kvs.empty() || !s.ParseFromString(read.results[0].kvs[0].value)) {
    throw InvalidArgument("etcd at " + client_->endpointList() + " has no run '" + run_id_ +
                          "' (no key " + prefix_ + "state)");
  }
  if (s.phase() == State::JOINING) {  // who joined: the round's join keys
    for (const auto& kv : read.results.at(2).kvs) {
      rdzv::NodeInfo n;
      if (kv.key.rfind(roundPrefix(s.round()), 0) == 0 && n.ParseFromString(kv.value)) {
        *s.add_joined() = std::move(n);
      }
    }
  }
  static const char* const kPhases[] = {"joining", "running", "closed", "failed"};
  RunStatus out;
  out.round = s.round();
  out.state = kPhases[std::clamp(static_cast<int>(s.phase()), 0, 3)];
  out.restart_count = s.restart_count();
  out.settings = wire::fromProto(s.settings());
  const bool running = s.phase() == State::RUNNING;
  const std::set<std::string> finished(s.finished().begin(), s.finished().end());
  const auto& nodes = running ? s.participants() : s.joined();
  for (int i = 0; i < nodes.size(); ++i) {
    NodeState n;
    n.spec = wire::fromProto(nodes[i]);
    n.node_rank = running ? i : -1;
    n.finished = finished.count(n.spec.id) > 0;
    withProgress(n);
    out.participants.push_back(std::move(n));
  }
  for (const auto& w : s.waiting()) {
    NodeState n;
    n.spec = wire::fromProto(w);
    out.waiting.push_back(std::move(n));
  }
  return out;
}

}  // namespace cxxlaunch::rendezvous
