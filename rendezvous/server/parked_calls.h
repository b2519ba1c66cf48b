#pragma once
// A call that waits (a store get or wait, a join) and the index of those a run holds, so that a
// call looks only at the parked calls it may have made answerable. Internal to the daemon.

#include <grpcpp/support/status.h>

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "rendezvous/run_state.h"

namespace cxxlaunch::rendezvous::server {

// A call that waits: answered later, from whichever thread sees its state change. `answer`
// sends the status (and the response the call's attempt filled in); the call frees itself once
// gRPC is done with it.
class ParkedCall {
 public:
  virtual ~ParkedCall() = default;
  virtual void answer(const grpc::Status& status) = 0;
};

// Returns the call's status once it can be answered; `expired`: its deadline has passed.
using Attempt = std::function<std::optional<grpc::Status>(bool expired)>;

struct Parked {
  SteadyTime deadline;
  std::vector<std::string> keys;  // a store call waits for these; a join (none) for its round
  Attempt attempt;
};

// The parked calls of a run, indexed so that a call costs O(log P) however many are parked: a
// call looks only at those it may have made answerable. Every parked call is looked at when the
// run's round moves (an epoch: O(rounds) times a run); a store write looks at the calls waiting
// for the keys it wrote; the deadline thread, and every call, at the calls whose deadline passed.
class ParkedCalls {
 public:
  bool empty() const { return calls_.empty(); }
  std::optional<SteadyTime> earliestDeadline() const {
    if (by_deadline_.empty()) return std::nullopt;
    return by_deadline_.begin()->first;
  }

  void add(ParkedCall* parked, Parked call) {
    by_deadline_.emplace(call.deadline, parked);
    for (const auto& key : call.keys) by_key_[key].insert(parked);
    calls_.emplace(parked, std::move(call));
  }

  // The call of `parked`, taken out; nullopt when it is not parked here.
  std::optional<Parked> take(ParkedCall* parked) {
    auto it = calls_.find(parked);
    if (it == calls_.end()) return std::nullopt;
    Parked call = std::move(it->second);
    calls_.erase(it);
    by_deadline_.erase({call.deadline, parked});
    for (const auto& key : call.keys) {
      auto waiting = by_key_.find(key);
      if (waiting == by_key_.end()) continue;  // a key named twice, gone with the first
      waiting->second.erase(parked);
      if (waiting->second.empty()) by_key_.erase(waiting);
    }
    return call;
  }

  const Parked& at(ParkedCall* parked) const { return calls_.at(parked); }

  std::vector<ParkedCall*> all() const {
    std::vector<ParkedCall*> out;
    out.reserve(calls_.size());
    for (const auto& [parked, call] : calls_) out.push_back(parked);
    return out;
  }

  // Those whose deadline is at or before `now`.
  void addExpired(SteadyTime now, std::vector<ParkedCall*>& out) const {
    for (auto it = by_deadline_.begin(); it != by_deadline_.end() && it->first <= now; ++it) {
      out.push_back(it->second);
    }
  }

  // Those waiting for one of `keys` (each once).
  void addWaitingFor(const std::set<std::string>& keys, std::vector<ParkedCall*>& out) const {
    for (const auto& key : keys) {
      if (auto it = by_key_.find(key); it != by_key_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
      }
    }
  }

 private:
  std::unordered_map<ParkedCall*, Parked> calls_;
  std::set<std::pair<SteadyTime, ParkedCall*>> by_deadline_;
  std::unordered_map<std::string, std::unordered_set<ParkedCall*>> by_key_;
};

}  // namespace cxxlaunch::rendezvous::server
