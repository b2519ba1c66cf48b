#pragma once
// The node agent: runs this node's share of a job.
//   1. learn this node's place in the world (NodeRendezvous),
//   2. spawn the local workers with the environment contract (runtime/env_names.h),
//   3. monitor them from one event loop: exits (SIGCHLD via signalfd), output pipes, forwarded
//      signals and the shutdown-grace timer; nothing polls on a timer,
//   4. the first failing worker stops the group (SIGTERM, SIGKILL after the grace); with restarts
//      left every worker restarts with TORCHELASTIC_RESTART_COUNT + 1, otherwise the failure table
//      and run-summary.json report the root cause, whose exit code the launcher returns.
// Not thread-safe: one agent per process, driven from the main thread (PR_SET_PDEATHSIG follows
// the thread that forks).

#include <memory>
#include <string>

#include "launcher/options.h"

namespace cxxlaunch::launcher {

// Exit codes of `cxxlaunch` itself; a failed job exits with its root cause's code instead.
inline constexpr int kExitOk = 0;
inline constexpr int kExitInternal = 1;  // the launcher could not do its job (I/O, fork)
inline constexpr int kExitUsage = 2;     // bad flags or input; nothing was spawned

// Where this node stands in the world, as a rendezvous round decided it.
struct WorldAssignment {
  int node_rank = 0;
  int num_nodes = 1;
  int rank_offset = 0;  // global rank of this node's local rank 0
  int world_size = 1;
  std::string master_addr;
  int master_port = 0;
  std::string store_endpoint;  // empty when there is no store for workers
  std::string store_prefix;
  std::string token;
};

// How a node learns its place. The single-node version decides alone; the multi-node one talks
// to the rendezvous daemon.
class NodeRendezvous {
 public:
  virtual ~NodeRendezvous() = default;
  // Joins the next round; `restart_count` is the attempt about to start.
  virtual WorldAssignment join(int restart_count) = 0;
};

// The rendezvous of a job that is one node: ranks are local ranks, the master port is reserved
// once (or taken from --master_port) and kept across restarts.
std::unique_ptr<NodeRendezvous> makeSingleNodeRendezvous(const LaunchOptions& options);

// Runs the job to the end; returns the launcher's exit code.
int runAgent(const LaunchOptions& options, NodeRendezvous& rendezvous);

}  // namespace cxxlaunch::launcher
