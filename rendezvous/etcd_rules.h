#pragma once
// The rules of rendezvous/run_state.h applied to the etcd backend's state (EtcdRunState), for
// rendezvous/etcd_rendezvous.cc: pure functions, no etcd calls. Liveness comes in as the set of
// nodes whose alive key exists; time as Unix milliseconds (the last call is a wall-clock deadline
// in the state, the same for every agent).
//
// `joined` is never stored in etcd: each joining node has a key of its own
// (round/<round>/node/<id> or .../rank/<k>), and the agent that applies a rule first copies
// those keys into `joined` (at most max_nodes of them, in the order they were created).

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <type_traits>

#include "proto/etcd_state.pb.h"
#include "rendezvous/run_state.h"

namespace cxxlaunch::rendezvous::etcd_rules {
using State = rdzv::EtcdRunState;

int64_t wallMs();

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

// Refuses a node that cannot join this run at all (InvalidArgument, StaleError): other settings,
// a closed or failed run, a node rank out of range.
void checkJoinable(const State& s, const RunSettings& settings, const NodeSpec& node,
                   const std::string& run_id);

// RunState::maybeComplete: completes the joining round when max nodes joined, when min joined
// and every expected node is back, or when min joined and the last call passed.
void maybeComplete(State& s, int64_t now);
// RunState::startNextRound: the participants are expected back; so are the nodes that waited
// for room (as far as room allows), which join the new round with keys of their own.
void startNextRound(State& s, const std::string& reason, int64_t now);
// RunState::tick with etcd's leases as the clock: drops the dead from every list, evicts a dead
// participant of a running round (a new round), completes a joining round when the rules say so.
void sanitize(State& s, const std::set<std::string>& alive, int64_t now);

std::optional<Placement> placementOf(const State& s, const std::string& id);
// RunState::keepAlive's answer (without recording anything: liveness is the lease).
Verdict verdictOf(const State& s, const std::string& node_id, int64_t round);

}  // namespace cxxlaunch::rendezvous::etcd_rules
