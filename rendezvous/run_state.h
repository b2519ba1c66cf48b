#pragma once
// RunState: the rendezvous state machine of one run (one job), free of RPC and of real time.
// The server feeds it calls and the time; tests feed it a fake clock.
//
// A run moves through rounds. Round r is first *joining* (collecting nodes), then *running*
// (complete: every node has its rank), until a failure, an eviction or a newcomer supersedes it
// and round r+1 starts joining. A clean finish of every node *closes* the run; running out of
// restarts *fails* it. Both are final.
//
// Joining round r completes when
//   1. max_nodes have joined, or
//   2. at least min_nodes have joined and every node expected back (the survivors of round r-1
//      and the nodes that waited for room) has joined, or
//   3. at least min_nodes have joined and the last-call window has passed since the min-th.
// Ranks: nodes sorted by static node rank when given, else by id; global rank offsets are the
// prefix sums of local world sizes.
//
// Liveness: every call of a node counts as its keep-alive. A node silent for
// keep_alive_interval * keep_alive_max_misses is evicted; evicting a node of a running round
// supersedes it (the survivors restart at the smaller size, elastic within min..max).
//
// Not thread-safe: the server serialises calls.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"

namespace cxxlaunch::rendezvous {

using SteadyTime = std::chrono::steady_clock::time_point;
using Millis = std::chrono::milliseconds;

// The largest world a run may form: ranks are `int` everywhere (the env contract, NCCL, Gloo).
inline constexpr int64_t kMaxWorldSize = 1 << 24;

// Bounds on the settings' times: large enough for any real job, small enough that every sum and
// product of them (eviction timeout, deadlines as time points) stays far inside 64 bits.
inline constexpr Millis kMaxSettingTime = std::chrono::hours(24);
inline constexpr int kMaxKeepAliveMisses = 1000;
inline constexpr int kMaxRestarts = 1'000'000;

struct RunSettings {
  int min_nodes = 1;
  int max_nodes = 1;
  Millis last_call_timeout = std::chrono::seconds(30);
  Millis keep_alive_interval = std::chrono::seconds(5);
  int keep_alive_max_misses = 3;
  int max_restarts = 0;

  Millis evictionTimeout() const { return keep_alive_interval * keep_alive_max_misses; }
  // Throws InvalidArgument naming the bad field and its range.
  void validate() const;
  bool operator==(const RunSettings&) const = default;
};

struct NodeSpec {
  std::string id;
  std::string addr;
  int local_world_size = 1;
  int master_port = 0;
  int node_rank = -1;  // static backend: the rank the node must get

  void validate() const;
};

// A completed round from one node's point of view.
struct Placement {
  int64_t round = 0;
  int node_rank = 0;
  int num_nodes = 0;
  int rank_offset = 0;
  int world_size = 0;
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;
};

enum class Action { kContinue, kRestart, kFail, kClosed };

struct FailureReport {
  std::string node_id;
  int rank = 0;
  int exit_code = 0;
  std::string description;
};

// The longest failure description a run keeps (docs/reliability.md): a longer one is cut there,
// with a note saying so.
inline constexpr size_t kMaxFailureDescriptionBytes = 64 << 10;

// `description` cut to its first `max` bytes, followed by a note of how many bytes were cut.
std::string truncateDescription(const std::string& description, size_t max);

struct Verdict {
  Action action = Action::kContinue;
  std::string reason;
  std::optional<FailureReport> root_cause;  // with kFail
};

// One worker of a node as its agent saw it when it sent a keep-alive (`cxxlaunch status`).
struct WorkerProgress {
  int local_rank = 0;
  int rank = 0;
  int pid = 0;
  std::string state;                   // "running", "sleeping", "stopped", "exited", ...
  std::optional<Millis> progress_age;  // since its last heartbeat, then; none: it never beat
  // From its heartbeat's record (common/heartbeat_record.h); 0: none reported.
  int64_t steps = 0;
  int64_t step_us = 0;  // mean wall time per step
  int64_t work_us = 0;  // mean time per step less its waits for peers (the straggler check's)
  bool operator==(const WorkerProgress&) const = default;
};

// The longest `WorkerProgress::state` a report may carry.
inline constexpr size_t kMaxWorkerStateBytes = 32;

struct NodeState {
  NodeSpec spec;
  int node_rank = -1;  // in the running round, else -1
  Millis heartbeat_age{0};
  bool finished = false;
  std::vector<WorkerProgress> workers;  // as of its last report; heartbeat_age says how old
};

struct RunStatus {
  int64_t round = 0;
  std::string state;                    // "joining", "running", "closed", "failed"
  std::vector<NodeState> participants;  // running: the round's nodes; joining: who has joined
  std::vector<NodeState> waiting;       // nodes waiting for room in a later round
  int restart_count = 0;
  RunSettings settings;
};

class RunState {
 public:
  RunState(std::string run_id, RunSettings settings);

  const std::string& runId() const { return run_id_; }
  const RunSettings& settings() const { return settings_; }
  int64_t round() const { return round_; }

  // A node asks for a place. Returns its placement once its round is complete; nullopt while it
  // waits (call again). Idempotent. Throws InvalidArgument (bad node, settings that differ from
  // the run's, a taken static rank) or StaleError (closed or failed run).
  std::optional<Placement> join(const NodeSpec& node, const RunSettings& settings, SteadyTime now);

  // Whether the run tracks this node (it joined, runs or waits, evicted or not): its next join
  // adds nothing.
  bool knows(const std::string& node_id) const { return specOf(node_id) != nullptr; }

  // What a node of `round` must do now. Records the keep-alive.
  Verdict keepAlive(const std::string& node_id, int64_t round, SteadyTime now);

  // What a node's agent says of its workers (sent with its keep-alives), kept for status() until
  // the next report or until the node is forgotten. Ignored from a node the run does not track.
  // Throws InvalidArgument for more workers than the node has, or a state past
  // kMaxWorkerStateBytes.
  void reportWorkers(const std::string& node_id, std::vector<WorkerProgress> workers);

  // The node's workers failed in `round`. The first report of a round spends one restart and
  // supersedes the round (kRestart) or, with none left, fails the run (kFail); later reports of
  // the same round just get the same answer. The run keeps the failure's description cut to
  // kMaxFailureDescriptionBytes, and `node_id` as the failed node.
  Verdict requestRestart(const std::string& node_id, int64_t round, const FailureReport& failure,
                         SteadyTime now);

  // The node's workers all succeeded in `round`. The run closes when every node has left.
  Verdict leave(const std::string& node_id, int64_t round, SteadyTime now);

  // Evicts silent nodes and completes rounds whose last call has passed. Returns whether
  // anything changed (so blocked joins should be re-checked).
  bool tick(SteadyTime now);

  // When tick() next has something to do, if ever.
  std::optional<SteadyTime> nextDeadline() const;

  // Whether store calls of `round` are current (the fencing check). Throws StaleError saying why
  // not. A closed or failed run has no store any more.
  void checkStoreRound(int64_t round) const;

  // What the run holds, in bytes, as an upper estimate counted in O(1) (a server's total bound):
  // every place a node is kept counts kNodeEntryBytes (its id and address at their 256-byte
  // bounds), every reported worker kWorkerBytes, strings (reasons, the root cause) their size.
  int64_t memoryBytes() const;
  static constexpr int64_t kRunBytes = 4096;  // the run itself: settings, maps, bookkeeping
  static constexpr int64_t kNodeEntryBytes = 768;
  static constexpr int64_t kWorkerBytes = 128;
  // The most a join of a node the run does not know yet adds (the places a node may be kept at
  // once: heartbeat, joined or waiting and its index, participants, expected and missing,
  // finished, informed).
  static constexpr int64_t kJoinBytes = 9 * kNodeEntryBytes;

  // Whether any node is still tracked as alive (joined, running or waiting, and not evicted).
  // A run with none, final or not, only waits for its retention time to be freed.
  bool hasLiveNodes() const { return !heartbeats_.empty() && !finalState(); }

  // Who the joining round has and who it still waits for, for waiting joins and timeouts.
  std::string waitingFor() const;

  RunStatus status(SteadyTime now) const;

  // The placement of a node in the running round, if it is in it.
  std::optional<Placement> placementOf(const std::string& node_id) const;

  bool finalState() const { return phase_ == Phase::kClosed || phase_ == Phase::kFailed; }

  // Changes whenever a round completes or ends or the run becomes final: the moments a waiting
  // join can be answered. Servers re-check parked joins only then, so a join costs O(log N).
  uint64_t epoch() const { return epoch_; }
  // Throws StaleError saying so when the run is closed or failed.
  void checkNotFinal() const;

  // Once the run is closed or failed: whether every node of its last round has been told so
  // (by a keep-alive, leave or restart answer). A server that exits with its job waits for this.
  bool everyoneInformed() const;

 private:
  enum class Phase { kJoining, kRunning, kClosed, kFailed };

  // Whether `node` fits the joining round without a world past kMaxWorldSize; the check throws
  // InvalidArgument saying so.
  bool roomFor(const NodeSpec& node) const;
  void checkWorldSize(const NodeSpec& node) const;
  void maybeComplete(SteadyTime now);
  void complete();
  void startNextRound(SteadyTime now, const std::string& reason);
  void beat(const std::string& id, SteadyTime now);  // records a keep-alive
  void forget(const std::string& id);
  const NodeSpec* specOf(const std::string& id) const;  // a node the run tracks, or null
  // Into the joining round, and out of it (an evicted node), keeping the indexes below.
  void admit(NodeSpec node);
  void dropJoined(const std::string& id);
  void addWaiting(const NodeSpec& node);
  void inform(const std::string& id);  // tells a node the run's final state

  std::string run_id_;
  RunSettings settings_;
  Phase phase_ = Phase::kJoining;
  int64_t round_ = 1;
  std::map<std::string, SteadyTime> heartbeats_;
  std::set<std::pair<SteadyTime, std::string>> by_beat_;        // the same, oldest first
  std::map<std::string, std::vector<WorkerProgress>> workers_;  // by node, as last reported
  int64_t reported_workers_ = 0;                                // in workers_, all nodes
  // Joining: who has joined round_ (by id), and who is expected back. Every call of a node
  // costs O(log N): the indexes answer what a scan of joined_ or expected_ would.
  std::map<std::string, NodeSpec> joined_;
  int64_t joined_ranks_ = 0;                        // the sum of their local world sizes
  std::multimap<int, std::string> joined_by_rank_;  // static node rank -> id
  std::set<std::string> expected_;
  std::set<std::string> expected_missing_;  // expected_ less joined_
  std::optional<SteadyTime> last_call_deadline_;
  // Running: the round's nodes in rank order, their ranks and offsets, and those that finished.
  std::vector<NodeSpec> participants_;
  std::map<std::string, int> rank_of_;
  std::vector<int> offsets_;
  int world_size_ = 0;
  std::set<std::string> finished_;
  // Nodes that asked while there was no room (max_nodes reached), first come first.
  std::vector<NodeSpec> waiting_;
  std::set<std::string> waiting_ids_;
  std::string superseded_reason_;  // why round_ - 1 ended
  int restart_count_ = 0;
  std::optional<FailureReport> root_cause_;
  std::set<std::string> informed_;    // nodes told the run's final state
  size_t informed_participants_ = 0;  // of them, the last round's nodes
  uint64_t epoch_ = 0;
};

}  // namespace cxxlaunch::rendezvous
