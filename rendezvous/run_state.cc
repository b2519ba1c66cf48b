#include "rendezvous/run_state.h"

#include <algorithm>
#include <sstream>

namespace cxxlaunch::rendezvous {
namespace {

// The most ids (or ranks) a "waiting for" message lists; it says how many more there are.
constexpr size_t kMaxListed = 16;

// `items`, at most kMaxListed of them, then "and K more" for those left out.
template <typename Items, typename Name>
std::string listSome(const Items& items, size_t count, Name name) {
  std::string out;
  size_t listed = 0;
  for (const auto& item : items) {
    if (listed == kMaxListed) break;
    out += (out.empty() ? "" : ", ") + name(item);
    ++listed;
  }
  if (count > listed) out += " and " + std::to_string(count - listed) + " more";
  return out;
}

std::string describe(const RunSettings& s) {
  std::ostringstream out;
  out << "nnodes " << s.min_nodes << ":" << s.max_nodes << ", max_restarts " << s.max_restarts
      << ", last_call_timeout " << s.last_call_timeout.count() << " ms, keep_alive_interval "
      << s.keep_alive_interval.count() << " ms x " << s.keep_alive_max_misses;
  return out.str();
}

}  // namespace

std::string truncateDescription(const std::string& description, size_t max) {
  if (description.size() <= max) return description;
  return description.substr(0, max) + "... [" + std::to_string(description.size() - max) +
         " more bytes not kept]";
}

void RunSettings::validate() const {
  auto bad = [](const std::string& what) { throw InvalidArgument("rendezvous settings: " + what); };
  auto ms = [](Millis t) { return std::to_string(t.count()) + " ms"; };
  if (min_nodes < 1) bad("min nodes must be >= 1, got " + std::to_string(min_nodes));
  if (max_nodes < min_nodes) {
    bad("max nodes (" + std::to_string(max_nodes) + ") must be >= min nodes (" +
        std::to_string(min_nodes) + ")");
  }
  if (max_nodes > 65536) bad("max nodes must be <= 65536, got " + std::to_string(max_nodes));
  if (last_call_timeout.count() < 0 || last_call_timeout > kMaxSettingTime) {
    bad("last_call_timeout must be 0-" + ms(kMaxSettingTime) + ", got " + ms(last_call_timeout));
  }
  if (keep_alive_interval.count() <= 0 || keep_alive_interval > kMaxSettingTime) {
    bad("keep_alive_interval must be 1-" + ms(kMaxSettingTime) + ", got " +
        ms(keep_alive_interval));
  }
  if (keep_alive_max_misses < 1 || keep_alive_max_misses > kMaxKeepAliveMisses) {
    bad("keep_alive_max_misses must be 1-" + std::to_string(kMaxKeepAliveMisses) + ", got " +
        std::to_string(keep_alive_max_misses));
  }
  if (max_restarts < 0 || max_restarts > kMaxRestarts) {
    bad("max_restarts must be 0-" + std::to_string(kMaxRestarts) + ", got " +
        std::to_string(max_restarts));
  }
}

void NodeSpec::validate() const {
  auto bad = [](const std::string& what) { throw InvalidArgument("node: " + what); };
  if (id.empty() || id.size() > 256) bad("id must have 1-256 characters");
  if (addr.empty() || addr.size() > 256) bad("addr must have 1-256 characters");
  if (local_world_size < 1 || local_world_size > 65536) {
    bad("local world size must be 1-65536, got " + std::to_string(local_world_size));
  }
  if (master_port < 0 || master_port > 65535) bad("master port must be 0-65535");
  if (node_rank < -1) bad("node rank must be >= 0 (or -1 for none)");
}

RunState::RunState(std::string run_id, RunSettings settings)
    : run_id_(std::move(run_id)), settings_(settings) {
  settings_.validate();
}

void RunState::checkNotFinal() const {
  if (phase_ == Phase::kClosed) {
    throw StaleError("run '" + run_id_ +
                     "' is closed: its job finished; start a new job with another --rdzv_id");
  }
  if (phase_ == Phase::kFailed) {
    throw StaleError("run '" + run_id_ + "' failed after " + std::to_string(restart_count_) +
                     " restarts; start a new job with another --rdzv_id");
  }
}

std::optional<Placement> RunState::join(const NodeSpec& node, const RunSettings& settings,
                                        SteadyTime now) {
  node.validate();
  settings.validate();
  if (!(settings == settings_)) {
    throw InvalidArgument(
        "run '" + run_id_ + "' was started with " + describe(settings_) + "; this node asks for " +
        describe(settings) +
        ": every node must use the same --nnodes, --max_restarts and --rdzv_conf");
  }
  checkNotFinal();
  if (phase_ == Phase::kRunning) {
    if (rank_of_.count(node.id) != 0) {
      beat(node.id, now);
      return placementOf(node.id);  // asked again: the same answer
    }
    if (waiting_ids_.count(node.id) == 0) {
      addWaiting(node);
      // Room for it: re-form the world with it now (scale-up costs no restart).
      if (static_cast<int>(participants_.size()) < settings_.max_nodes) {
        startNextRound(now, "node " + node.id + " joined");
      }
    }
    beat(node.id, now);
    return placementOf(node.id);
  }
  if (joined_.count(node.id) == 0 && waiting_ids_.count(node.id) == 0) {
    if (!joined_.empty() && (joined_.begin()->second.node_rank >= 0) != (node.node_rank >= 0)) {
      throw InvalidArgument("node " + node.id +
                            " mixes static and dynamic rendezvous: every node must use the same "
                            "--rdzv_backend");
    }
    if (node.node_rank >= settings_.max_nodes) {
      throw InvalidArgument("node rank " + std::to_string(node.node_rank) +
                            " is out of range for " + std::to_string(settings_.max_nodes) +
                            " nodes");
    }
    if (auto taken = joined_by_rank_.find(node.node_rank);
        node.node_rank >= 0 && taken != joined_by_rank_.end()) {
      throw InvalidArgument("node rank " + std::to_string(node.node_rank) +
                            " is already taken by node " + taken->second);
    }
    if (static_cast<int>(joined_.size()) < settings_.max_nodes) {
      checkWorldSize(node);
      admit(node);
    } else {
      addWaiting(node);
    }
  }
  beat(node.id, now);  // only once admitted: a refused join leaves no trace
  maybeComplete(now);
  return placementOf(node.id);
}

bool RunState::roomFor(const NodeSpec& node) const {
  return joined_ranks_ + node.local_world_size <= kMaxWorldSize;
}

void RunState::checkWorldSize(const NodeSpec& node) const {
  // A round is formed from the joined nodes; bounding their sum bounds its world size and every
  // rank offset, which must stay far from int overflow.
  if (roomFor(node)) return;
  throw InvalidArgument("node " + node.id + " would make the world " +
                        std::to_string(joined_ranks_ + node.local_world_size) +
                        " ranks, more than the " + std::to_string(kMaxWorldSize) +
                        " a run may have");
}

void RunState::maybeComplete(SteadyTime now) {
  if (phase_ != Phase::kJoining) return;
  const int n = static_cast<int>(joined_.size());
  if (n >= settings_.max_nodes) return complete();
  if (n < settings_.min_nodes) {
    last_call_deadline_.reset();
    return;
  }
  const bool all_expected_back = !expected_.empty() && expected_missing_.empty();
  if (all_expected_back) return complete();
  if (!last_call_deadline_) last_call_deadline_ = now + settings_.last_call_timeout;
  if (now >= *last_call_deadline_) complete();
}

void RunState::complete() {
  participants_.clear();
  for (auto& [id, node] : joined_) participants_.push_back(std::move(node));  // sorted by id
  const bool static_ranks = !participants_.empty() && participants_.front().node_rank >= 0;
  if (static_ranks) {
    std::sort(participants_.begin(), participants_.end(),
              [](const NodeSpec& a, const NodeSpec& b) { return a.node_rank < b.node_rank; });
  }
  rank_of_.clear();
  offsets_.clear();
  world_size_ = 0;
  for (size_t i = 0; i < participants_.size(); ++i) {
    rank_of_[participants_[i].id] = static_cast<int>(i);
    offsets_.push_back(world_size_);
    world_size_ += participants_[i].local_world_size;
  }
  ++epoch_;
  phase_ = Phase::kRunning;
  joined_.clear();
  joined_ranks_ = 0;
  joined_by_rank_.clear();
  expected_.clear();
  expected_missing_.clear();
  finished_.clear();
  last_call_deadline_.reset();
}

void RunState::startNextRound(SteadyTime now, const std::string& reason) {
  superseded_reason_ = "round " + std::to_string(round_) + " ended: " + reason;
  ++round_;
  ++epoch_;
  phase_ = Phase::kJoining;
  expected_.clear();
  for (const auto& node : participants_) expected_.insert(node.id);
  participants_.clear();
  rank_of_.clear();
  finished_.clear();
  joined_.clear();
  joined_ranks_ = 0;
  joined_by_rank_.clear();
  last_call_deadline_.reset();
  workers_.clear();  // the round's workers are being stopped; the next round reports its own
  reported_workers_ = 0;
  // Nodes waiting for room are polling Join: they are in, as far as room allows.
  std::vector<NodeSpec> still_waiting;
  for (auto& node : waiting_) {
    if (static_cast<int>(expected_.size()) < settings_.max_nodes) expected_.insert(node.id);
    if (static_cast<int>(joined_.size()) < settings_.max_nodes && roomFor(node)) {
      waiting_ids_.erase(node.id);
      admit(std::move(node));
    } else {
      still_waiting.push_back(std::move(node));
    }
  }
  waiting_ = std::move(still_waiting);
  expected_missing_.clear();
  for (const auto& id : expected_) {
    if (joined_.count(id) == 0) expected_missing_.insert(id);
  }
  maybeComplete(now);
}

Verdict RunState::keepAlive(const std::string& node_id, int64_t round, SteadyTime now) {
  const bool tracked = rank_of_.count(node_id) != 0 || joined_.count(node_id) != 0 ||
                       waiting_ids_.count(node_id) != 0;
  if (tracked) beat(node_id, now);  // an evicted node stays evicted
  if (finalState()) inform(node_id);
  if (phase_ == Phase::kClosed) return {Action::kClosed, "every node finished", std::nullopt};
  if (phase_ == Phase::kFailed) return {Action::kFail, "no restarts left", root_cause_};
  if (round > round_) {
    throw InvalidArgument("round " + std::to_string(round) +
                          " does not exist (the run is at round " + std::to_string(round_) + ")");
  }
  if (round < round_) return {Action::kRestart, superseded_reason_, std::nullopt};
  if (phase_ == Phase::kRunning && rank_of_.count(node_id) != 0) return {};
  return {Action::kRestart, "node " + node_id + " is not part of round " + std::to_string(round),
          std::nullopt};
}

void RunState::reportWorkers(const std::string& node_id, std::vector<WorkerProgress> workers) {
  const NodeSpec* spec = specOf(node_id);
  if (spec == nullptr || heartbeats_.count(node_id) == 0) return;  // evicted stays evicted
  if (workers.size() > static_cast<size_t>(spec->local_world_size)) {
    throw InvalidArgument("node " + node_id + " reported " + std::to_string(workers.size()) +
                          " workers; it has " + std::to_string(spec->local_world_size));
  }
  for (const auto& w : workers) {
    if (w.state.size() > kMaxWorkerStateBytes) {
      throw InvalidArgument("a worker state must be at most " +
                            std::to_string(kMaxWorkerStateBytes) + " bytes");
    }
  }
  auto& kept = workers_[node_id];
  reported_workers_ += static_cast<int64_t>(workers.size()) - static_cast<int64_t>(kept.size());
  kept = std::move(workers);
}

Verdict RunState::requestRestart(const std::string& node_id, int64_t round,
                                 const FailureReport& failure, SteadyTime now) {
  Verdict verdict = keepAlive(node_id, round, now);
  if (verdict.action != Action::kContinue) return verdict;  // already restarting, failed, closed
  // What the run keeps: the caller as the failed node, and a bounded description (both are the
  // client's to send, and outlive the store).
  root_cause_ = failure;
  root_cause_->node_id = node_id;
  root_cause_->description = truncateDescription(failure.description, kMaxFailureDescriptionBytes);
  if (restart_count_ >= settings_.max_restarts) {
    phase_ = Phase::kFailed;
    ++epoch_;
    inform(node_id);
    return {Action::kFail, "no restarts left (" + std::to_string(settings_.max_restarts) + " used)",
            root_cause_};
  }
  ++restart_count_;
  startNextRound(now, "node " + node_id + " failed: " + root_cause_->description);
  return {Action::kRestart, superseded_reason_, std::nullopt};
}

Verdict RunState::leave(const std::string& node_id, int64_t round, SteadyTime now) {
  Verdict verdict = keepAlive(node_id, round, now);
  if (verdict.action != Action::kContinue) return verdict;
  finished_.insert(node_id);
  if (finished_.size() == participants_.size()) {
    phase_ = Phase::kClosed;
    ++epoch_;
    inform(node_id);
    return {Action::kClosed, "every node finished", std::nullopt};
  }
  return {Action::kContinue,
          "waiting for " + std::to_string(participants_.size() - finished_.size()) +
              " more nodes to finish",
          std::nullopt};
}

bool RunState::tick(SteadyTime now) {
  if (finalState()) return false;
  std::vector<std::string> silent_ids;  // oldest keep-alive first; stop at the first live one
  for (const auto& [beat, id] : by_beat_) {
    if (now - beat <= settings_.evictionTimeout()) break;
    silent_ids.push_back(id);
  }
  std::set<std::string> evicted;
  bool evicted_waiting = false;
  for (const auto& id : silent_ids) {
    forget(id);
    dropJoined(id);
    expected_.erase(id);
    expected_missing_.erase(id);
    evicted_waiting = waiting_ids_.erase(id) != 0 || evicted_waiting;
    if (phase_ == Phase::kRunning && rank_of_.count(id) != 0) evicted.insert(id);
  }
  if (evicted_waiting) {
    waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(),
                                  [&](const NodeSpec& n) { return waiting_ids_.count(n.id) == 0; }),
                   waiting_.end());
  }
  if (!evicted.empty()) {
    // The survivors are expected back in the next round (which also re-ranks them).
    participants_.erase(std::remove_if(participants_.begin(), participants_.end(),
                                       [&](const NodeSpec& n) { return evicted.count(n.id); }),
                        participants_.end());
    startNextRound(
        now,
        "evicted " + listSome(evicted, evicted.size(), [](const std::string& id) { return id; }) +
            " (no keep-alive for " + std::to_string(settings_.evictionTimeout().count()) + " ms)");
    return true;
  }
  const Phase before = phase_;
  maybeComplete(now);
  return !silent_ids.empty() || phase_ != before;
}

void RunState::beat(const std::string& id, SteadyTime now) {
  auto [it, inserted] = heartbeats_.try_emplace(id, now);
  if (!inserted) {
    by_beat_.erase({it->second, id});
    it->second = now;
  }
  by_beat_.insert({now, id});
}

const NodeSpec* RunState::specOf(const std::string& id) const {
  if (auto it = rank_of_.find(id); it != rank_of_.end()) {
    return &participants_[static_cast<size_t>(it->second)];
  }
  if (auto it = joined_.find(id); it != joined_.end()) return &it->second;
  if (waiting_ids_.count(id) == 0) return nullptr;
  for (const auto& node : waiting_) {  // rare: only nodes beyond max_nodes wait
    if (node.id == id) return &node;
  }
  return nullptr;
}

void RunState::admit(NodeSpec node) {
  joined_ranks_ += node.local_world_size;
  if (node.node_rank >= 0) joined_by_rank_.emplace(node.node_rank, node.id);
  expected_missing_.erase(node.id);
  const std::string id = node.id;
  joined_.emplace(id, std::move(node));
}

void RunState::dropJoined(const std::string& id) {
  auto it = joined_.find(id);
  if (it == joined_.end()) return;
  joined_ranks_ -= it->second.local_world_size;
  auto [first, last] = joined_by_rank_.equal_range(it->second.node_rank);
  for (auto r = first; r != last; ++r) {
    if (r->second == id) {
      joined_by_rank_.erase(r);
      break;
    }
  }
  if (expected_.count(id) != 0) expected_missing_.insert(id);
  joined_.erase(it);
}

void RunState::addWaiting(const NodeSpec& node) {
  waiting_.push_back(node);
  waiting_ids_.insert(node.id);
}

void RunState::forget(const std::string& id) {
  if (auto w = workers_.find(id); w != workers_.end()) {
    reported_workers_ -= static_cast<int64_t>(w->second.size());
    workers_.erase(w);
  }
  auto it = heartbeats_.find(id);
  if (it == heartbeats_.end()) return;
  by_beat_.erase({it->second, id});
  heartbeats_.erase(it);
}

int64_t RunState::memoryBytes() const {
  const size_t node_entries = heartbeats_.size() + joined_.size() + joined_by_rank_.size() +
                              participants_.size() + waiting_.size() + waiting_ids_.size() +
                              expected_.size() + expected_missing_.size() + finished_.size() +
                              informed_.size();
  int64_t bytes = kRunBytes + static_cast<int64_t>(run_id_.size() + superseded_reason_.size()) +
                  static_cast<int64_t>(node_entries) * kNodeEntryBytes +
                  reported_workers_ * kWorkerBytes;
  if (root_cause_) {
    bytes += static_cast<int64_t>(root_cause_->node_id.size() + root_cause_->description.size());
  }
  return bytes;
}

void RunState::inform(const std::string& id) {
  // A final run's participants no longer change: counting them as they are told is exact.
  if (informed_.insert(id).second && rank_of_.count(id) != 0) ++informed_participants_;
}

bool RunState::everyoneInformed() const {
  return finalState() && informed_participants_ == participants_.size();
}

std::optional<SteadyTime> RunState::nextDeadline() const {
  if (finalState()) return std::nullopt;
  std::optional<SteadyTime> next = last_call_deadline_;
  if (!by_beat_.empty()) {
    const SteadyTime expiry = by_beat_.begin()->first + settings_.evictionTimeout() + Millis(1);
    if (!next || expiry < *next) next = expiry;
  }
  return next;
}

void RunState::checkStoreRound(int64_t round) const {
  if (phase_ == Phase::kClosed) {
    // Every node left: no worker of the run is alive, so its keys are freed and no call may
    // bring them back.
    throw StaleError("run '" + run_id_ + "' is closed: its job finished and its store is gone");
  }
  const bool current = round == round_ && phase_ == Phase::kRunning;
  if (current) return;
  if (round < round_) {
    throw StaleError("round " + std::to_string(round) + " of run '" + run_id_ +
                     "' is stale: the run is at round " + std::to_string(round_) + " (" +
                     superseded_reason_ + ")");
  }
  if (phase_ == Phase::kFailed) checkNotFinal();
  throw StaleError("round " + std::to_string(round) + " of run '" + run_id_ +
                   "' is not complete yet");
}

std::string RunState::waitingFor() const {
  // Lists are cut at kMaxListed: with tens of thousands of nodes, every waiting node is told.
  std::ostringstream out;
  out << "round " << round_ << ": " << joined_.size() << " of " << settings_.min_nodes;
  if (settings_.max_nodes != settings_.min_nodes) out << ".." << settings_.max_nodes;
  out << " nodes joined";
  if (!joined_.empty()) {
    out << " (" << listSome(joined_, joined_.size(), [](const auto& e) { return e.first; }) << ")";
  }
  if (!expected_missing_.empty()) {
    out << "; missing from the previous round: "
        << listSome(expected_missing_, expected_missing_.size(),
                    [](const std::string& id) { return id; });
  }
  const bool static_ranks = !joined_.empty() && joined_.begin()->second.node_rank >= 0;
  if (static_ranks) {
    std::vector<int> ranks;  // the first kMaxListed missing ones
    size_t missing = 0;
    auto taken = joined_by_rank_.begin();
    for (int r = 0; r < settings_.max_nodes; ++r) {
      while (taken != joined_by_rank_.end() && taken->first < r) ++taken;
      if (taken != joined_by_rank_.end() && taken->first == r) continue;
      if (ranks.size() < kMaxListed) ranks.push_back(r);
      ++missing;
    }
    out << "; missing node ranks: "
        << listSome(ranks, missing, [](int r) { return std::to_string(r); });
  }
  if (last_call_deadline_) out << "; last call running";
  return out.str();
}

std::optional<Placement> RunState::placementOf(const std::string& node_id) const {
  if (phase_ != Phase::kRunning && phase_ != Phase::kClosed) return std::nullopt;
  auto it = rank_of_.find(node_id);
  if (it == rank_of_.end()) return std::nullopt;
  Placement p;
  p.round = round_;
  p.node_rank = it->second;
  p.num_nodes = static_cast<int>(participants_.size());
  p.rank_offset = offsets_[static_cast<size_t>(it->second)];
  p.world_size = world_size_;
  p.master_addr = participants_.front().addr;
  p.master_port = participants_.front().master_port;
  p.restart_count = restart_count_;
  return p;
}

RunStatus RunState::status(SteadyTime now) const {
  RunStatus s;
  s.round = round_;
  s.restart_count = restart_count_;
  s.settings = settings_;
  switch (phase_) {
    case Phase::kJoining:
      s.state = "joining";
      break;
    case Phase::kRunning:
      s.state = "running";
      break;
    case Phase::kClosed:
      s.state = "closed";
      break;
    case Phase::kFailed:
      s.state = "failed";
      break;
  }
  auto state_of = [&](const NodeSpec& spec, int rank) {
    NodeState n;
    n.spec = spec;
    n.node_rank = rank;
    auto beat = heartbeats_.find(spec.id);
    if (beat != heartbeats_.end()) {
      n.heartbeat_age = std::chrono::duration_cast<Millis>(now - beat->second);
    }
    n.finished = finished_.count(spec.id) != 0;
    if (auto workers = workers_.find(spec.id); workers != workers_.end()) {
      n.workers = workers->second;
    }
    return n;
  };
  if (phase_ == Phase::kJoining) {
    for (const auto& [id, node] : joined_) s.participants.push_back(state_of(node, -1));
  } else {
    for (size_t i = 0; i < participants_.size(); ++i) {
      s.participants.push_back(state_of(participants_[i], static_cast<int>(i)));
    }
  }
  for (const auto& node : waiting_) s.waiting.push_back(state_of(node, -1));
  return s;
}

}  // namespace cxxlaunch::rendezvous
