#include "rendezvous/etcd_rendezvous.h"

#include <algorithm>
#include <map>
#include <set>

#include "common/error.h"
#include "proto/etcd_state.pb.h"
#include "rendezvous/etcd_store.h"
#include "rendezvous/wire.h"

namespace cxxlaunch::rendezvous {
using State = rdzv::EtcdRunState;
using Clock = std::chrono::steady_clock;

namespace {

int64_t wallMs() {
  return std::chrono::duration_cast<Millis>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

template <typename List>
bool hasId(const List& list, const std::string& id) {
  return std::any_of(list.begin(), list.end(), [&](const auto& n) {
    if constexpr (std::is_same_v<std::decay_t<decltype(n)>, std::string>) {
      return n == id;
    } else {
      return n.id() == id;
    }
  });
}

std::string ids(const google::protobuf::RepeatedPtrField<rdzv::NodeInfo>& nodes) {
  std::string out;
  for (const auto& n : nodes) out += (out.empty() ? "" : ", ") + n.id();
  return out.empty() ? "none" : out;
}

std::string describe(const RunSettings& s) {
  return "--nnodes " + std::to_string(s.min_nodes) + ":" + std::to_string(s.max_nodes) +
         ", --max_restarts " + std::to_string(s.max_restarts) + ", last_call_timeout " +
         std::to_string(s.last_call_timeout.count()) + " ms, keep_alive_interval " +
         std::to_string(s.keep_alive_interval.count()) + " ms x " +
         std::to_string(s.keep_alive_max_misses);
}

void complete(State& s) {
  std::vector<rdzv::NodeInfo> nodes(s.joined().begin(), s.joined().end());
  const bool static_ranks = !nodes.empty() && nodes.front().node_rank() >= 0;
  std::sort(nodes.begin(), nodes.end(), [&](const rdzv::NodeInfo& a, const rdzv::NodeInfo& b) {
    return static_ranks ? a.node_rank() < b.node_rank() : a.id() < b.id();
  });
  s.clear_participants();
  for (auto& n : nodes) *s.add_participants() = std::move(n);
  s.set_phase(State::RUNNING);
  s.clear_joined();
  s.clear_expected();
  s.clear_finished();
  s.set_last_call_deadline_ms(0);
}

// RunState::maybeComplete, with the last call as a wall-clock deadline in the state (every agent
// reads the same one; clocks that disagree by a second only move the moment a little).
void maybeComplete(State& s, int64_t now) {
  if (s.phase() != State::JOINING) return;
  const int n = s.joined_size();
  if (n >= s.settings().max_nodes()) return complete(s);
  if (n < s.settings().min_nodes()) {
    s.set_last_call_deadline_ms(0);
    return;
  }
  const bool all_expected_back =
      s.expected_size() > 0 &&
      std::all_of(s.expected().begin(), s.expected().end(),
                  [&](const std::string& id) { return hasId(s.joined(), id); });
  if (all_expected_back) return complete(s);
  if (s.last_call_deadline_ms() == 0) {
    s.set_last_call_deadline_ms(now + s.settings().last_call_timeout_ms());
  }
  if (now >= s.last_call_deadline_ms()) complete(s);
}

// RunState::startNextRound.
void startNextRound(State& s, const std::string& reason, int64_t now) {
  s.set_reason("round " + std::to_string(s.round()) + " ended: " + reason);
  s.set_round(s.round() + 1);
  s.set_phase(State::JOINING);
  s.clear_expected();
  for (const auto& n : s.participants()) s.add_expected(n.id());
  s.clear_participants();
  s.clear_finished();
  s.clear_joined();
  s.set_last_call_deadline_ms(0);
  const int max = s.settings().max_nodes();
  google::protobuf::RepeatedPtrField<rdzv::NodeInfo> still_waiting;
  for (auto& n : *s.mutable_waiting()) {
    if (s.expected_size() < max) s.add_expected(n.id());
    if (s.joined_size() < max) {
      *s.add_joined() = n;
    } else {
      *still_waiting.Add() = n;
    }
  }
  s.mutable_waiting()->Swap(&still_waiting);
  maybeComplete(s, now);
}

template <typename Field, typename Pred>
void eraseIf(Field* field, Pred pred) {
  field->erase(std::remove_if(field->begin(), field->end(), pred), field->end());
}

// RunState::tick with etcd's leases as the clock: a node is alive while its alive key exists.
void sanitize(State& s, const std::set<std::string>& alive, int64_t now) {
  if (s.phase() == State::CLOSED || s.phase() == State::FAILED) return;
  auto dead = [&](const rdzv::NodeInfo& n) { return alive.count(n.id()) == 0; };
  eraseIf(s.mutable_joined(), dead);
  eraseIf(s.mutable_waiting(), dead);
  eraseIf(s.mutable_expected(), [&](const std::string& id) { return alive.count(id) == 0; });
  if (s.phase() == State::RUNNING) {
    std::string evicted;
    for (const auto& n : s.participants()) {
      if (dead(n) && !hasId(s.finished(), n.id()))
        evicted += (evicted.empty() ? "" : ", ") + n.id();
    }
    if (!evicted.empty()) {
      eraseIf(s.mutable_participants(), dead);
      startNextRound(s,
                     "evicted " + evicted + " (its lease expired: no keep-alive for " +
                         std::to_string(s.settings().keep_alive_interval_ms() *
                                        s.settings().keep_alive_max_misses()) +
                         " ms)",
                     now);
    }
    return;
  }
  maybeComplete(s, now);
}

std::optional<Placement> placementOf(const State& s, const std::string& id) {
  if (s.phase() != State::RUNNING) return std::nullopt;
  int offset = 0, world = 0;
  std::optional<int> rank;
  for (int i = 0; i < s.participants_size(); ++i) {
    const auto& n = s.participants(i);
    if (n.id() == id) {
      rank = i;
      offset = world;
    }
    world += n.local_world_size();
  }
  if (!rank) return std::nullopt;
  Placement p;
  p.round = s.round();
  p.node_rank = *rank;
  p.num_nodes = s.participants_size();
  p.rank_offset = offset;
  p.world_size = world;
  p.master_addr = s.participants(0).addr();
  p.master_port = s.participants(0).master_port();
  p.restart_count = s.restart_count();
  return p;
}

std::string waitingFor(const State& s) {
  const auto& set = s.settings();
  std::string text =
      "round " + std::to_string(s.round()) + " has " + std::to_string(s.joined_size()) + " of " +
      std::to_string(set.min_nodes()) +
      (set.min_nodes() == set.max_nodes() ? "" : ".." + std::to_string(set.max_nodes())) +
      " nodes (joined: " + ids(s.joined()) + ")";
  std::vector<std::string> missing;
  for (const auto& id : s.expected()) {
    if (!hasId(s.joined(), id)) missing.push_back(id);
  }
  if (!missing.empty()) {
    text += "; expected back: ";
    for (size_t i = 0; i < missing.size(); ++i) text += (i ? ", " : "") + missing[i];
  }
  return text;
}

std::optional<FailureReport> rootCause(const State& s) {
  if (!s.has_root_cause()) return std::nullopt;
  return wire::fromProto(s.root_cause());
}

// RunState::keepAlive's answer (without recording anything: liveness is the lease).
Verdict verdictOf(const State& s, const std::string& node_id, int64_t round) {
  if (s.phase() == State::CLOSED) return {Action::kClosed, "every node finished", std::nullopt};
  if (s.phase() == State::FAILED) return {Action::kFail, "no restarts left", rootCause(s)};
  if (round > s.round()) {
    throw InvalidArgument("round " + std::to_string(round) +
                          " does not exist (the run is at round " + std::to_string(s.round()) +
                          ")");
  }
  if (round < s.round()) return {Action::kRestart, s.reason(), std::nullopt};
  if (s.phase() == State::RUNNING && hasId(s.participants(), node_id)) return {};
  return {Action::kRestart, "node " + node_id + " is not part of round " + std::to_string(round),
          std::nullopt};
}

}  // namespace

struct EtcdRendezvous::Snapshot {
  State state;
  bool exists = false;
  int64_t revision = 0;  // of the store when read (or written)
};

EtcdRendezvous::EtcdRendezvous(std::shared_ptr<EtcdClient> client, std::string run_id,
                               std::string root)
    : client_(std::move(client)),
      run_id_(std::move(run_id)),
      root_(std::move(root)),
      prefix_(etcdRunPrefix(run_id_, root_)) {}

EtcdRendezvous::~EtcdRendezvous() {
  try {
    close();
  } catch (const std::exception&) {
    // etcd is gone: the lease expires on its own.
  }
}

// One decision, as a compare-and-swap:
// 1. Read the state key and the alive keys in one transaction (one consistent revision).
// 2. `decide(state, exists, alive)` changes the state as the rules say (or leaves it).
// 3. Unchanged: done. Changed: write it in a transaction that holds only if the state key's mod
//    revision is still the one read (or the key still missing), together with what follows from
//    the change: a new round moves the `round` fencing key and drops the old round's store keys;
//    a final state drops the round key and every store key, and keeps the state only for
//    kEtcdFinalStateRetention (a lease of its own).
// 4. Someone else wrote first: read again and decide again.
template <typename Decide>
EtcdRendezvous::Snapshot EtcdRendezvous::update(Decide&& decide, Millis timeout) {
  const std::string state_key = prefix_ + "state";
  const std::string round_key = etcdRoundKey(run_id_, root_);
  for (;;) {
    const EtcdTxnResult read = client_->txn(
        {}, {EtcdOp::get(state_key), EtcdOp::prefix(prefix_ + "alive/", false, /*keys_only=*/true)},
        {}, timeout);
    Snapshot snap;
    snap.revision = read.revision;
    int64_t mod = 0;
    if (!read.results.at(0).kvs.empty()) {
      const auto& kv = read.results[0].kvs[0];
      if (!snap.state.ParseFromString(kv.value)) {
        throw CommunicationError("etcd key " + state_key +
                                 " does not hold a cxxlaunch rendezvous state: is another program "
                                 "using this prefix? Pick another --rdzv_id");
      }
      snap.exists = true;
      mod = kv.mod_revision;
    }
    std::set<std::string> alive;
    const size_t skip = prefix_.size() + std::string("alive/").size();
    for (const auto& kv : read.results.at(1).kvs) alive.insert(kv.key.substr(skip));
    const std::string before = snap.exists ? snap.state.SerializeAsString() : std::string();
    const State old = snap.state;
    decide(snap.state, snap.exists, alive);
    const std::string after = snap.state.SerializeAsString();
    if (snap.exists && after == before) return snap;
    if (!snap.exists && snap.state.round() == 0) return snap;  // nothing to create

    const bool final_now =
        snap.state.phase() == State::CLOSED || snap.state.phase() == State::FAILED;
    std::vector<EtcdOp> ops;
    int64_t retention = 0;
    if (final_now) retention = client_->grantLease(kEtcdFinalStateRetention);
    ops.push_back(EtcdOp::put(state_key, after, retention));
    if (final_now) {
      ops.push_back(EtcdOp::erase(round_key));
      ops.push_back(EtcdOp::erasePrefix(prefix_ + "store/"));
    } else if (!snap.exists || snap.state.round() != old.round()) {
      ops.push_back(EtcdOp::put(round_key, std::to_string(snap.state.round())));
      if (snap.exists)
        ops.push_back(EtcdOp::erasePrefix(etcdStorePrefix(run_id_, old.round(), root_)));
    }
    const EtcdCompare unchanged =
        snap.exists ? EtcdCompare::modIs(state_key, mod) : EtcdCompare::missing(state_key);
    const EtcdTxnResult wrote = client_->txn({unchanged}, ops);
    if (wrote.succeeded) {
      snap.exists = true;
      snap.revision = wrote.revision;
      return snap;
    }
    if (retention != 0) {
      try {
        client_->revokeLease(retention);
      } catch (const Error&) {
        // It expires on its own.
      }
    }
  }
}

void EtcdRendezvous::ensureLease(const NodeSpec& node, const RunSettings& settings) {
  std::lock_guard<std::mutex> lock(mu_);
  if (lease_ != 0) return;
  std::chrono::seconds granted{0};
  const int64_t lease = client_->grantLease(settings.evictionTimeout(), &granted);
  alive_key_ = prefix_ + "alive/" + node.id;
  alive_value_ = node.addr;
  // Only a lease with its alive key counts; a failed put is retried with the next join poll
  // (the unused lease expires on its own).
  client_->run(EtcdOp::put(alive_key_, alive_value_, lease));
  lease_ = lease;
  // Three renewals per TTL: one lost or late keep-alive costs nothing.
  lease_period_ = std::max(Millis(100), std::chrono::duration_cast<Millis>(granted) / 3);
  stop_ = false;
  keeper_ = std::thread([this] { keepLeaseLoop(); });
}

// Renews the lease every third of its TTL. A lease that etcd says expired (this agent was
// silent too long, e.g. etcd was down past the TTL) is replaced and the alive key written again:
// if the others evicted this node meanwhile, its next keep-alive hears of the new round.
void EtcdRendezvous::keepLeaseLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    wake_.wait_for(lock, lease_period_, [&] { return stop_.load(); });
    if (stop_) return;
    const int64_t lease = lease_;
    const Millis period = lease_period_;
    lock.unlock();
    try {
      // A renewal later than the next one is due is of no use: it waits at most a period, and
      // so does close() for it.
      if (!client_->keepLeaseAlive(lease, period)) {
        lease_lost_ = true;
        const int64_t fresh = client_->grantLease(period * 3);
        client_->run(EtcdOp::put(alive_key_, alive_value_, fresh));
        lock.lock();
        lease_ = fresh;
        continue;
      }
    } catch (const Error&) {
      // etcd unreachable: try again next period; the lease's TTL is the bound.
    }
    lock.lock();
  }
}

void EtcdRendezvous::close() {
  int64_t lease = 0;
  Millis period{0};
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    lease = lease_;
    lease_ = 0;
    period = lease_period_;
  }
  wake_.notify_all();
  if (etcd_silent_) client_->cancelCalls();  // the keeper may be waiting on it too
  if (keeper_.joinable()) keeper_.join();
  if (lease != 0 && !etcd_silent_) client_->revokeLease(lease, period);
}

void EtcdRendezvous::cancel() { cancelled_ = true; }

// One poll of a join:
// 1. This agent's lease and alive key exist (the first poll creates them).
// 2. Decide (update()): create the run's state if there is none; refuse a closed or failed run
//    or other settings; evict the dead; join the round (or wait for room); complete the round
//    when the rules say so.
// 3. Placed: done. Else wait on a watch of the state and alive keys, at most until the poll ends
//    or the last call passes, and decide again.
JoinPoll EtcdRendezvous::join(const NodeSpec& node, const RunSettings& settings, Millis poll) {
  node.validate();
  settings.validate();
  ensureLease(node, settings);
  const auto deadline = Clock::now() + poll;
  for (;;) {
    if (cancelled_) throw CommunicationError("rendezvous join cancelled");
    const Snapshot snap = update([&](State& s, bool exists, const std::set<std::string>& alive) {
      const int64_t now = wallMs();
      if (!exists) {
        s.set_round(1);
        s.set_phase(State::JOINING);
        wire::toProto(settings, s.mutable_settings());
      }
      const RunSettings theirs = wire::fromProto(s.settings());
      if (!(theirs == settings)) {
        throw InvalidArgument("run '" + run_id_ + "' was started with " + describe(theirs) +
                              "; this node asks for " + describe(settings) +
                              ": every node must use the same --nnodes, --max_restarts and "
                              "--rdzv_conf");
      }
      if (s.phase() == State::CLOSED) {
        throw StaleError("run '" + run_id_ +
                         "' is closed: its job finished (choose a new --rdzv_id for a new job)");
      }
      if (s.phase() == State::FAILED) {
        throw StaleError("run '" + run_id_ + "' has failed: no restarts left");
      }
      std::set<std::string> live = alive;
      live.insert(node.id);  // our own key may not be in this read yet
      sanitize(s, live, now);
      const int max = s.settings().max_nodes();
      if (s.phase() == State::RUNNING) {
        if (hasId(s.participants(), node.id)) return;
        if (!hasId(s.waiting(), node.id)) {
          wire::toProto(node, s.add_waiting());
          // Room for it: re-form the world with it now (scale-up costs no restart).
          if (s.participants_size() < max) startNextRound(s, "node " + node.id + " joined", now);
        }
        return;
      }
      if (!hasId(s.joined(), node.id) && !hasId(s.waiting(), node.id)) {
        if (s.joined_size() > 0 && (s.joined(0).node_rank() >= 0) != (node.node_rank >= 0)) {
          throw InvalidArgument("node " + node.id +
                                " mixes static and dynamic rendezvous: every node must use the "
                                "same --rdzv_backend");
        }
        if (node.node_rank >= max) {
          throw InvalidArgument("node rank " + std::to_string(node.node_rank) +
                                " is out of range for " + std::to_string(max) + " nodes");
        }
        for (const auto& other : s.joined()) {
          if (node.node_rank >= 0 && other.node_rank() == node.node_rank) {
            throw InvalidArgument("node rank " + std::to_string(node.node_rank) +
                                  " is already taken by node " + other.id());
          }
        }
        wire::toProto(node, s.joined_size() < max ? s.add_joined() : s.add_waiting());
      }
      maybeComplete(s, now);
    });
    if (auto placement = placementOf(snap.state, node.id)) return {placement, ""};
    const auto now = Clock::now();
    if (now >= deadline) return {std::nullopt, waitingFor(snap.state)};
    auto wait = std::chrono::duration_cast<Millis>(deadline - now);
    if (snap.state.last_call_deadline_ms() != 0) {
      wait = std::min(
          wait, Millis(std::max<int64_t>(1, snap.state.last_call_deadline_ms() - wallMs() + 5)));
    }
    // The state key and the alive keys, not the store: [alive/, state] in key order.
    client_->waitForChange(prefix_ + "alive/", prefix_ + "state" + std::string(1, '\0'),
                           snap.revision, wait, &cancelled_);
  }
}

RunStatus EtcdRendezvous::status() {
  const EtcdTxnResult read = client_->txn(
      {}, {EtcdOp::get(prefix_ + "state"), EtcdOp::prefix(prefix_ + "progress/", false)});
  std::map<std::string, rdzv::EtcdNodeProgress> progress;  // by node id
  const size_t skip = prefix_.size() + std::string("progress/").size();
  for (const auto& kv : read.results.at(1).kvs) {
    rdzv::EtcdNodeProgress p;
    if (p.ParseFromString(kv.value)) progress[kv.key.substr(skip)] = std::move(p);
  }
  const int64_t now = wallMs();
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
  static const char* const kPhases[] = {"joining", "running", "closed", "failed"};
  RunStatus out;
  out.round = s.round();
  out.state = kPhases[std::clamp(static_cast<int>(s.phase()), 0, 3)];
  out.restart_count = s.restart_count();
  out.settings = wire::fromProto(s.settings());
  const bool running = s.phase() == State::RUNNING;
  const auto& nodes = running ? s.participants() : s.joined();
  for (int i = 0; i < nodes.size(); ++i) {
    NodeState n;
    n.spec = wire::fromProto(nodes[i]);
    n.node_rank = running ? i : -1;
    n.finished = hasId(s.finished(), n.spec.id);
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

Verdict EtcdRendezvous::keepAlive(const std::string& node_id, int64_t round,
                                  const std::vector<WorkerProgress>& workers, Millis timeout) {
  Verdict verdict;
  try {
    update(
        [&](State& s, bool exists, const std::set<std::string>& alive) {
          if (!exists) {
            verdict = {Action::kFail, "the run's state is gone from etcd", std::nullopt};
            return;
          }
          sanitize(s, alive, wallMs());
          verdict = verdictOf(s, node_id, round);
        },
        timeout);
  } catch (const TimeoutError&) {
    etcd_silent_ = true;
    throw;
  } catch (const CommunicationError&) {
    etcd_silent_ = true;
    throw;
  }
  etcd_silent_ = false;
  if (verdict.action == Action::kContinue && !workers.empty()) {
    reportProgress(node_id, workers, timeout);
  }
  return verdict;
}

void EtcdRendezvous::reportProgress(const std::string& node_id,
                                    const std::vector<WorkerProgress>& workers, Millis timeout) {
  rdzv::EtcdNodeProgress p;
  p.set_written_ms(wallMs());
  for (const auto& w : workers) wire::toProto(w, p.add_workers());
  int64_t lease = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    lease = lease_;
  }
  if (lease == 0) return;
  try {  // what status shows, nothing more: a lost report is replaced by the next
    client_->run(EtcdOp::put(prefix_ + "progress/" + node_id, p.SerializeAsString(), lease),
                 nullptr, timeout);
  } catch (const Error&) {
  }
}

Verdict EtcdRendezvous::requestRestart(const std::string& node_id, int64_t round,
                                       const FailureReport& failure) {
  Verdict verdict;
  update([&](State& s, bool exists, const std::set<std::string>& alive) {
    if (!exists) {
      verdict = {Action::kFail, "the run's state is gone from etcd", failure};
      return;
    }
    sanitize(s, alive, wallMs());
    verdict = verdictOf(s, node_id, round);
    if (verdict.action != Action::kContinue) return;
    wire::toProto(failure, s.mutable_root_cause());
    if (s.restart_count() >= s.settings().max_restarts()) {
      s.set_phase(State::FAILED);
      verdict = {Action::kFail,
                 "no restarts left (" + std::to_string(s.settings().max_restarts()) + " used)",
                 failure};
      return;
    }
    s.set_restart_count(s.restart_count() + 1);
    startNextRound(s, "node " + node_id + " failed: " + failure.description, wallMs());
    verdict = {Action::kRestart, s.reason(), std::nullopt};
  });
  return verdict;
}

Verdict EtcdRendezvous::leave(const std::string& node_id, int64_t round) {
  Verdict verdict;
  update([&](State& s, bool exists, const std::set<std::string>& alive) {
    if (!exists) {
      verdict = {Action::kClosed, "the run's state is gone from etcd", std::nullopt};
      return;
    }
    sanitize(s, alive, wallMs());
    verdict = verdictOf(s, node_id, round);
    if (verdict.action != Action::kContinue) return;
    if (!hasId(s.finished(), node_id)) s.add_finished(node_id);
    if (s.finished_size() == s.participants_size()) {
      s.set_phase(State::CLOSED);
      verdict = {Action::kClosed, "every node finished", std::nullopt};
      return;
    }
    verdict = {Action::kContinue,
               "waiting for " + std::to_string(s.participants_size() - s.finished_size()) +
                   " more nodes to finish",
               std::nullopt};
  });
  return verdict;
}

}  // namespace cxxlaunch::rendezvous
