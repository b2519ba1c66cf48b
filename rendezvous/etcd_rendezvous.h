#pragma once
// EtcdRendezvous: the rendezvous of one run kept in an etcd cluster instead of a cxxlaunchd
// server (--rdzv_backend=etcd). There is no server: every agent reads the run's state, decides
// what the state machine of rendezvous/run_state.h would (rendezvous/etcd_rules.h), and writes the
// new state back with a compare-and-swap transaction on the state key's mod revision; a
// transaction that lost the race re-reads and decides again. Same rules as RunState: rounds,
// min..max nodes with a last call, a global restart count, the root cause of a failed job, close
// when every node has finished.
//
// Joining is uncontended, so that thousands of nodes can join one round: a joining node puts a
// key of its own (round/<round>/node/<id>) and learns from the same transaction how many have
// joined; only the node that sees the round full (or the last call end, or every expected node
// back) reads them all and completes the round with one compare-and-swap of the state. The
// others wait on a watch of the round key, which that write puts again.
//
// Keys (docs/rendezvous.md, "etcd"), all under /cxxlaunch/<run_id>/:
//   state           the run's state (proto/etcd_state.proto), which every decision CASes
//   round           the current round number: the fencing token of the workers' EtcdStore, and
//                   what waiting agents watch (put again when the round completes)
//   round/<r>/node/<id>  a node that joined round r (its NodeInfo; .../rank/<k> for static
//                   ranks), under that agent's lease; gone when the round completes
//   alive/<node>    one key per agent, attached to that agent's lease (TTL: the eviction timeout)
//   store/<round>/  the workers' keys of a round (rendezvous/etcd_store.h)
// Liveness: an agent keeps its lease alive from a thread of its own; a killed agent's lease
// expires and its alive and join keys vanish. Whoever reads the state next and finds a
// participant of the running round without its alive key evicts it (the survivors re-form,
// elastic within min..max), as RunState's keep-alive timeout does.
//
// Thread-safety: safe to call from several threads; cancel() from any thread ends a join.

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "rendezvous/client.h"
#include "rendezvous/etcd_client.h"
#include "rendezvous/etcd_store.h"
#include "rendezvous/run_state.h"

namespace cxxlaunch::rdzv {
class EtcdRunState;
}

namespace cxxlaunch::rendezvous {

// How long the state of a closed or failed run stays in etcd (so that a late node is refused
// with a clear message) before its lease removes it.
inline constexpr std::chrono::seconds kEtcdFinalStateRetention = std::chrono::minutes(10);

class EtcdRendezvous {
 public:
  // `root`: the key root of every run (etcd_store.h: kEtcdRoot, or --rdzv_conf etcd_prefix).
  EtcdRendezvous(std::shared_ptr<EtcdClient> client, std::string run_id,
                 std::string root = kEtcdRoot);
  ~EtcdRendezvous();  // close()
  EtcdRendezvous(const EtcdRendezvous&) = delete;
  EtcdRendezvous& operator=(const EtcdRendezvous&) = delete;

  // As RendezvousClient::join: waits at most `poll` (on a watch) for the round to complete.
  // The first call grants this agent's lease and writes its alive key. Throws InvalidArgument
  // (settings that differ from the run's, a bad node), StaleError (closed or failed run),
  // CommunicationError (etcd unreachable, or cancelled).
  JoinPoll join(const NodeSpec& node, const RunSettings& settings, Millis poll);
  void cancel();

  // As RunState's: what this node of `round` must do now. Evicts participants whose alive key is
  // gone (their agent's lease expired). `workers` (when not empty) is this node's report for
  // `cxxlaunch status`, kept under its lease. `timeout`: each etcd call's deadline (0: the
  // client's call timeout), as RendezvousClient::keepAlive's: a keep-alive must not outlast the
  // interval it reports on, or a stopped etcd is noticed late.
  Verdict keepAlive(const std::string& node_id, int64_t round,
                    const std::vector<WorkerProgress>& workers = {}, Millis timeout = {});
  Verdict requestRestart(const std::string& node_id, int64_t round, const FailureReport& failure);
  Verdict leave(const std::string& node_id, int64_t round);

  // What the run's state says now, for `cxxlaunch status` (reads only; no lease needed). A node's
  // heartbeat age is the age of its last worker report (by the reader's and the agent's clocks),
  // 0 when it made none; liveness itself is its lease. Throws InvalidArgument when etcd has no
  // such run.
  RunStatus status();

  // Stops the lease's keep-alives and revokes it: this agent's alive key goes at once. The
  // revocation waits at most a renewal period (a third of the lease's TTL). When the last
  // keep-alive found etcd silent, neither waits: the renewal in flight is cancelled, and the
  // lease expires on its own. Idempotent.
  void close();

  // Whether the lease thread found the lease expired at some point (the agent was silent past
  // the eviction timeout, e.g. etcd was down that long).
  bool leaseWasLost() const { return lease_lost_; }

 private:
  struct Snapshot;
  struct RoundView;
  struct JoinCount;
  template <typename Decide>
  Snapshot update(Decide&& decide, Millis timeout = {});
  RoundView readRound();
  void createRun(const RunSettings& settings);
  std::optional<JoinCount> putJoinKey(const RoundView& view, const NodeSpec& node);
  std::string joinKey(int64_t round, const NodeSpec& node) const;
  std::string roundPrefix(int64_t round) const;  // of the round's join keys
  std::string waitingFor(const rdzv::EtcdRunState& s);
  int64_t currentLease();
  void ensureLease(const NodeSpec& node, const RunSettings& settings);
  void reportProgress(const std::string& node_id, const std::vector<WorkerProgress>& workers,
                      Millis timeout);
  void keepLeaseLoop();

  std::shared_ptr<EtcdClient> client_;
  const std::string run_id_;
  const std::string root_;       // of every run's keys
  const std::string prefix_;     // this run's: root_ + run_id_ + "/"
  const std::string round_key_;  // prefix_ + "round"
  std::atomic<bool> cancelled_ = false;
  std::mutex mu_;  // lease_, keeper_
  int64_t lease_ = 0;
  std::chrono::milliseconds lease_period_{1000};
  std::string alive_key_;
  std::string alive_value_;
  std::condition_variable wake_;  // ends the keeper's wait
  std::atomic<bool> stop_ = false;
  std::atomic<bool> lease_lost_ = false;
  std::atomic<bool> etcd_silent_ = false;  // the last keep-alive had no answer
  // The last call this agent wrote (round, deadline): it ends that last call; the others only if
  // it has not a keep-alive interval later, so that thousands of agents do not all try at once.
  std::pair<int64_t, int64_t> my_last_call_{0, 0};
  std::thread keeper_;
};

}  // namespace cxxlaunch::rendezvous
