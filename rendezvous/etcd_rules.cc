#include "rendezvous/etcd_rules.h"

#include <vector>

#include "common/error.h"
#include "rendezvous/wire.h"

namespace cxxlaunch::rendezvous::etcd_rules {
namespace {

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

template <typename Field, typename Pred>
void eraseIf(Field* field, Pred pred) {
  field->erase(std::remove_if(field->begin(), field->end(), pred), field->end());
}

std::optional<FailureReport> rootCause(const State& s) {
  if (!s.has_root_cause()) return std::nullopt;
  return wire::fromProto(s.root_cause());
}

}  // namespace

int64_t wallMs() {
  return std::chrono::duration_cast<Millis>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void checkJoinable(const State& s, const RunSettings& settings, const NodeSpec& node,
                   const std::string& run_id) {
  const RunSettings theirs = wire::fromProto(s.settings());
  if (!(theirs == settings)) {
    throw InvalidArgument("run '" + run_id + "' was started with " + describe(theirs) +
                          "; this node asks for " + describe(settings) +
                          ": every node must use the same --nnodes, --max_restarts and "
                          "--rdzv_conf");
  }
  if (s.phase() == State::CLOSED) {
    throw StaleError("run '" + run_id +
                     "' is closed: its job finished (choose a new --rdzv_id for a new job)");
  }
  if (s.phase() == State::FAILED) {
    throw StaleError("run '" + run_id + "' has failed: no restarts left");
  }
  if (node.node_rank >= settings.max_nodes) {
    throw InvalidArgument("node rank " + std::to_string(node.node_rank) + " is out of range for " +
                          std::to_string(settings.max_nodes) + " nodes");
  }
}

void maybeComplete(State& s, int64_t now) {
  if (s.phase() != State::JOINING) return;
  const int n = s.joined_size();
  if (n >= s.settings().max_nodes()) return complete(s);
  if (n < s.settings().min_nodes()) {
    s.set_last_call_deadline_ms(0);
    return;
  }
  std::set<std::string> joined;  // a set: thousands of nodes, each looked up once
  for (const auto& node : s.joined()) joined.insert(node.id());
  const bool all_expected_back =
      s.expected_size() > 0 && std::all_of(s.expected().begin(), s.expected().end(),
                                           [&](const std::string& id) { return joined.count(id); });
  if (all_expected_back) return complete(s);
  if (s.last_call_deadline_ms() == 0) {
    s.set_last_call_deadline_ms(now + s.settings().last_call_timeout_ms());
  }
  if (now >= s.last_call_deadline_ms()) complete(s);
}

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
  // The waiting nodes watch the round key: they see the new round at once and join it with keys
  // of their own, as everyone does. Those beyond max_nodes find the round full when it completes
  // and wait again.
  for (const auto& n : s.waiting()) {
    if (s.expected_size() < s.settings().max_nodes()) s.add_expected(n.id());
  }
  s.clear_waiting();
  maybeComplete(s, now);
}

void sanitize(State& s, const std::set<std::string>& alive, int64_t now) {
  if (s.phase() == State::CLOSED || s.phase() == State::FAILED) return;
  auto dead = [&](const rdzv::NodeInfo& n) { return alive.count(n.id()) == 0; };
  eraseIf(s.mutable_joined(), dead);
  eraseIf(s.mutable_waiting(), dead);
  eraseIf(s.mutable_expected(), [&](const std::string& id) { return alive.count(id) == 0; });
  if (s.phase() == State::RUNNING) {
    const std::set<std::string> finished(s.finished().begin(), s.finished().end());
    std::string evicted;
    for (const auto& n : s.participants()) {
      if (dead(n) && finished.count(n.id()) == 0) evicted += (evicted.empty() ? "" : ", ") + n.id();
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

}  // namespace cxxlaunch::rendezvous::etcd_rules
