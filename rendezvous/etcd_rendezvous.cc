#include "rendezvous/etcd_rendezvous.h"

#include <algorithm>
#include <map>
#include <set>

#include "common/error.h"
#include "proto/etcd_state.pb.h"
#include "rendezvous/etcd_rules.h"
#include "rendezvous/etcd_store.h"
#include "rendezvous/wire.h"

namespace cxxlaunch::rendezvous {
using State = rdzv::EtcdRunState;
using Clock = std::chrono::steady_clock;
using etcd_rules::hasId;
using etcd_rules::placementOf;
using etcd_rules::sanitize;
using etcd_rules::startNextRound;
using etcd_rules::verdictOf;
using etcd_rules::wallMs;

namespace {

State parseState(const std::string& key, const std::string& bytes) {
  State s;
  if (!s.ParseFromString(bytes)) {
    throw CommunicationError("etcd key " + key +
                             " does not hold a cxxlaunch rendezvous state: is another program "
                             "using this prefix? Pick another --rdzv_id");
  }
  return s;
}

}  // namespace

struct EtcdRendezvous::Snapshot {
  State state;
  bool exists = false;
  bool wrote = false;    // this call's write changed the state
  int64_t revision = 0;  // of the store when read (or written)
};

// What a joining agent reads first: the state and the round key, nothing of size N but the
// state's lists (a joining round's state holds only the nodes expected back).
struct EtcdRendezvous::RoundView {
  State state;
  bool exists = false;
  int64_t state_mod = 0;
  int64_t round_mod = 0;  // the round key's mod revision: a join key goes only into this round
  int64_t revision = 0;
};

// What a join transaction answers: how many keys the round has now (this node's included).
struct EtcdRendezvous::JoinCount {
  int64_t joined = 0;
  int64_t alive = 0;  // alive keys; counted only when the round expects nodes back
  int64_t revision = 0;
};

EtcdRendezvous::EtcdRendezvous(std::shared_ptr<EtcdClient> client, std::string run_id,
                               std::string root)
    : client_(std::move(client)),
      run_id_(std::move(run_id)),
      root_(std::move(root)),
      prefix_(etcdRunPrefix(run_id_, root_)),
      round_key_(etcdRoundKey(run_id_, root_)) {}

EtcdRendezvous::~EtcdRendezvous() {
  try {
    close();
  } catch (const std::exception&) {
    // etcd is gone: the lease expires on its own.
  }
}

std::string EtcdRendezvous::roundPrefix(int64_t round) const {
  return prefix_ + "round/" + std::to_string(round) + "/";
}

// Static ranks: one key per rank, so that two nodes asking for one rank cannot both create it.
std::string EtcdRendezvous::joinKey(int64_t round, const NodeSpec& node) const {
  return roundPrefix(round) +
         (node.node_rank >= 0 ? "rank/" + std::to_string(node.node_rank) : "node/" + node.id);
}

int64_t EtcdRendezvous::currentLease() {
  std::lock_guard<std::mutex> lock(mu_);
  return lease_;
}

// One decision, as a compare-and-swap:
// 1. Read the state key, the alive keys and the join keys in one transaction (one revision); the
//    current round's join keys become the state's `joined` (the first max_nodes of them, by
//    creation; the rest wait for room if the round completes now).
// 2. `decide(state, exists, alive)` changes the state as the rules say (or leaves it).
// 3. Unchanged: done. Changed: write it (without `joined`: the keys are that) in a transaction
//    that holds only if the state key's mod revision is still the one read (or the key still
//    missing), together with what follows from the change: a new round moves the `round` fencing
//    key and drops the old round's store and join keys; a completed round puts the `round` key
//    again (same value: it wakes the waiting agents and turns away join keys written late) and
//    drops its join keys; a final state drops the round key, every store and join key, and keeps
//    the state only for kEtcdFinalStateRetention (a lease of its own).
// 4. Someone else wrote first: read again and decide again.
template <typename Decide>
EtcdRendezvous::Snapshot EtcdRendezvous::update(Decide&& decide, Millis timeout) {
  const std::string state_key = prefix_ + "state";
  for (;;) {
    const EtcdTxnResult read = client_->txn(
        {},
        {EtcdOp::get(state_key), EtcdOp::prefix(prefix_ + "alive/", false, /*keys_only=*/true),
         EtcdOp::prefix(prefix_ + "round/")},
        {}, timeout);
    Snapshot snap;
    snap.revision = read.revision;
    int64_t mod = 0;
    if (!read.results.at(0).kvs.empty()) {
      const auto& kv = read.results[0].kvs[0];
      snap.state = parseState(state_key, kv.value);
      snap.exists = true;
      mod = kv.mod_revision;
    }
    std::set<std::string> alive;
    const size_t skip = prefix_.size() + std::string("alive/").size();
    for (const auto& kv : read.results.at(1).kvs) alive.insert(kv.key.substr(skip));

    const State old = snap.state;
    const std::string before = snap.exists ? snap.state.SerializeAsString() : std::string();
    std::vector<const EtcdKeyValue*> keys;
    for (const auto& kv : read.results.at(2).kvs) {
      if (kv.key.rfind(roundPrefix(old.round()), 0) == 0) keys.push_back(&kv);
    }
    std::sort(keys.begin(), keys.end(),
              [](auto* a, auto* b) { return a->create_revision < b->create_revision; });
    std::vector<rdzv::NodeInfo> beyond_max;
    for (const auto* kv : keys) {
      rdzv::NodeInfo n;
      if (!n.ParseFromString(kv->value)) continue;  // not ours: ignored, dropped with the round
      if (old.phase() == State::JOINING && snap.state.joined_size() < old.settings().max_nodes()) {
        *snap.state.add_joined() = std::move(n);
      } else {
        beyond_max.push_back(std::move(n));
      }
    }
    decide(snap.state, snap.exists, alive);
    snap.state.clear_joined();
    const bool completed = old.phase() == State::JOINING && old.round() == snap.state.round() &&
                           snap.state.phase() == State::RUNNING;
    if (completed) {
      for (auto& n : beyond_max) {
        if (!hasId(snap.state.waiting(), n.id())) *snap.state.add_waiting() = std::move(n);
      }
    }
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
      ops.push_back(EtcdOp::erase(round_key_));
      ops.push_back(EtcdOp::erasePrefix(prefix_ + "store/"));
      ops.push_back(EtcdOp::erasePrefix(prefix_ + "round/"));
    } else if (!snap.exists || snap.state.round() != old.round()) {
      ops.push_back(EtcdOp::put(round_key_, std::to_string(snap.state.round())));
      if (snap.exists) {
        ops.push_back(EtcdOp::erasePrefix(etcdStorePrefix(run_id_, old.round(), root_)));
        ops.push_back(EtcdOp::erasePrefix(roundPrefix(old.round())));
      }
    } else if (completed) {
      ops.push_back(EtcdOp::put(round_key_, std::to_string(snap.state.round())));
      ops.push_back(EtcdOp::erasePrefix(roundPrefix(old.round())));
    }
    const EtcdCompare unchanged =
        snap.exists ? EtcdCompare::modIs(state_key, mod) : EtcdCompare::missing(state_key);
    const EtcdTxnResult wrote = client_->txn({unchanged}, ops);
    if (wrote.succeeded) {
      snap.exists = true;
      snap.wrote = true;
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

void EtcdRendezvous::cancel() {
  cancelled_ = true;
  client_->cancelWaits(cancelled_);  // a join waiting on a watch ends now
}

EtcdRendezvous::RoundView EtcdRendezvous::readRound() {
  const std::string state_key = prefix_ + "state";
  const EtcdTxnResult read = client_->txn({}, {EtcdOp::get(state_key), EtcdOp::get(round_key_)});
  RoundView view;
  view.revision = read.revision;
  if (!read.results.at(0).kvs.empty()) {
    const auto& kv = read.results[0].kvs[0];
    view.state = parseState(state_key, kv.value);
    view.exists = true;
    view.state_mod = kv.mod_revision;
  }
  if (!read.results.at(1).kvs.empty()) view.round_mod = read.results[1].kvs[0].mod_revision;
  return view;
}

// The first node of a run writes its state (round 1, joining) and round key; the others find
// the state there (a failed compare) and read it.
void EtcdRendezvous::createRun(const RunSettings& settings) {
  State s;
  s.set_round(1);
  s.set_phase(State::JOINING);
  wire::toProto(settings, s.mutable_settings());
  client_->txn({EtcdCompare::missing(prefix_ + "state")},
               {EtcdOp::put(prefix_ + "state", s.SerializeAsString()),
                EtcdOp::put(round_key_, std::to_string(s.round()))});
}

// One transaction, uncontended (every node writes its own key): put this node's join key into
// the round `view` read, unless the round key moved since (the round completed or ended: nullopt)
// or the key is there already (an earlier poll), and count the round's join keys. Refuses a
// static rank another node holds, and a round that mixes static and dynamic nodes (the later
// node is refused, as RunState does).
std::optional<EtcdRendezvous::JoinCount> EtcdRendezvous::putJoinKey(const RoundView& view,
                                                                    const NodeSpec& node) {
  const int64_t round = view.state.round();
  const std::string key = joinKey(round, node);
  rdzv::NodeInfo info;
  wire::toProto(node, &info);
  const std::string value = info.SerializeAsString();
  const bool expecting = view.state.expected_size() > 0;
  auto counts = [&](std::vector<EtcdOp> ops) {
    ops.push_back(EtcdOp::prefix(roundPrefix(round), /*count_only=*/true));
    ops.push_back(EtcdOp::prefix(roundPrefix(round) + "rank/", /*count_only=*/true));
    if (expecting) ops.push_back(EtcdOp::prefix(prefix_ + "alive/", /*count_only=*/true));
    return ops;
  };
  const EtcdTxnResult r =
      client_->txn({EtcdCompare::modIs(round_key_, view.round_mod), EtcdCompare::missing(key)},
                   counts({EtcdOp::put(key, value, currentLease())}),
                   counts({EtcdOp::get(round_key_), EtcdOp::get(key)}));
  const size_t at = r.succeeded ? 1 : 2;  // the counts follow the put, or the two gets
  if (!r.succeeded) {
    const auto& now = r.results.at(0).kvs;
    if (now.empty() || now[0].mod_revision != view.round_mod) return std::nullopt;
    rdzv::NodeInfo holder;
    const auto& held = r.results.at(1).kvs;
    if (!held.empty() && holder.ParseFromString(held[0].value) && holder.id() != node.id) {
      throw InvalidArgument("node rank " + std::to_string(node.node_rank) +
                            " is already taken by node " + holder.id());
    }
  }
  const int64_t total = r.results.at(at).count;
  const int64_t ranked = r.results.at(at + 1).count;
  if (node.node_rank >= 0 ? ranked < total : ranked > 0) {
    client_->txn({EtcdCompare::valueIs(key, value)}, {EtcdOp::erase(key)});
    throw InvalidArgument("node " + node.id +
                          " mixes static and dynamic rendezvous: every node must use the "
                          "same --rdzv_backend");
  }
  JoinCount count;
  count.joined = total;
  if (expecting) count.alive = r.results.at(at + 2).count;
  count.revision = r.revision;
  return count;
}

// One poll of a join:
// 1. This agent's lease and alive key exist (the first poll creates them).
// 2. Read the state and the round key (readRound); create the run's state if there is none;
//    refuse a closed or failed run or other settings. Placed: done.
// 3. A running round this node is not part of: wait for room, by the rules on the whole state
//    (update(); rare: a late or a new node).
// 4. A joining round: put this node's join key (putJoinKey), which counts the round's keys. The
//    node that sees the round full, or every node alive joined while nodes are expected back, or
//    the last call over, completes it (update(): one read of every key, one compare-and-swap);
//    the first to see min nodes starts the last call (a compare-and-swap of the state alone).
// 5. Else wait on a watch of the round key from the revision of the join (nothing in between is
//    missed), at most until the poll ends or the last call passes, and go to 2. A round that
//    expects nodes back also watches the alive keys: a node that died may be the one the round
//    waits for.
JoinPoll EtcdRendezvous::join(const NodeSpec& node, const RunSettings& settings, Millis poll) {
  node.validate();
  settings.validate();
  ensureLease(node, settings);
  const auto deadline = Clock::now() + poll;
  auto completeDecide = [&](State& s, bool exists, const std::set<std::string>& alive) {
    if (!exists) return;
    std::set<std::string> live = alive;
    live.insert(node.id);  // our own key may not be in this read yet
    sanitize(s, live, wallMs());
  };
  for (;;) {
    if (cancelled_) throw CommunicationError("rendezvous join cancelled");
    const RoundView view = readRound();
    if (!view.exists) {
      createRun(settings);
      continue;
    }
    etcd_rules::checkJoinable(view.state, settings, node, run_id_);
    if (auto placement = placementOf(view.state, node.id)) return {placement, ""};
    Snapshot snap;  // what this poll knows last
    snap.state = view.state;
    if (view.state.phase() == State::RUNNING) {
      snap = update([&](State& s, bool exists, const std::set<std::string>& alive) {
        if (!exists) return;
        completeDecide(s, exists, alive);  // evicts the dead first
        if (s.phase() != State::RUNNING || hasId(s.participants(), node.id)) return;
        if (!hasId(s.waiting(), node.id)) {
          wire::toProto(node, s.add_waiting());
          // Room for it: re-form the world with it now (scale-up costs no restart).
          if (s.participants_size() < s.settings().max_nodes()) {
            startNextRound(s, "node " + node.id + " joined", wallMs());
          }
        }
      });
      if (auto placement = placementOf(snap.state, node.id)) return {placement, ""};
      if (snap.state.phase() != State::RUNNING) continue;  // a round it can join began
    } else {
      const auto count = putJoinKey(view, node);
      if (!count) continue;  // the round moved on meanwhile
      snap.revision = count->revision;
      const State& s = view.state;
      const int64_t now = wallMs();
      const int64_t last_call = s.last_call_deadline_ms();
      bool my_last_call = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        my_last_call = my_last_call_ == std::make_pair(s.round(), last_call);
      }
      const int64_t others_wait = my_last_call ? 0 : s.settings().keep_alive_interval_ms();
      const bool decide = count->joined >= s.settings().max_nodes() ||
                          (s.expected_size() > 0 && count->joined >= s.settings().min_nodes() &&
                           count->alive <= count->joined) ||
                          (last_call != 0 && now >= last_call + others_wait);
      if (decide) {
        snap = update(completeDecide);
        if (auto placement = placementOf(snap.state, node.id)) return {placement, ""};
        if (snap.state.round() != s.round() || snap.state.phase() != State::JOINING) continue;
        if (snap.wrote && snap.state.last_call_deadline_ms() != 0 &&
            snap.state.last_call_deadline_ms() != last_call) {  // this write started it
          std::lock_guard<std::mutex> lock(mu_);
          my_last_call_ = {s.round(), snap.state.last_call_deadline_ms()};
        }
      } else if (last_call == 0 && count->joined >= s.settings().min_nodes()) {
        // The last call starts with the min-th node: one agent writes its end.
        State with = s;
        with.set_last_call_deadline_ms(now + s.settings().last_call_timeout_ms());
        const EtcdTxnResult wrote =
            client_->txn({EtcdCompare::modIs(prefix_ + "state", view.state_mod)},
                         {EtcdOp::put(prefix_ + "state", with.SerializeAsString())});
        if (wrote.succeeded) {
          std::lock_guard<std::mutex> lock(mu_);
          my_last_call_ = {s.round(), with.last_call_deadline_ms()};
        }
        continue;  // read the state again, with the last call in it
      }
    }
    const auto now = Clock::now();
    if (now >= deadline) return {std::nullopt, waitingFor(snap.state)};
    auto wait = std::chrono::duration_cast<Millis>(deadline - now);
    const State& s = snap.state;
    if (s.phase() == State::JOINING && s.last_call_deadline_ms() != 0) {
      std::lock_guard<std::mutex> lock(mu_);
      const bool mine = my_last_call_ == std::make_pair(s.round(), s.last_call_deadline_ms());
      const int64_t end =
          s.last_call_deadline_ms() + (mine ? 0 : s.settings().keep_alive_interval_ms());
      wait = std::min(wait, Millis(std::max<int64_t>(1, end - wallMs() + 5)));
    }
    if (s.phase() == State::JOINING && s.expected_size() > 0) {
      // [alive/, round]: the alive keys and the round key, not the join keys (round/...).
      client_->waitForChange(prefix_ + "alive/", round_key_ + std::string(1, '\0'), snap.revision,
                             wait, &cancelled_);
    } else {
      client_->waitForChange(round_key_, "", snap.revision, wait, &cancelled_);
    }
  }
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
