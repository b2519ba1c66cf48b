#pragma once
// The node agent: runs this node's share of a job.
//   1. learn this node's place in the world (NodeRendezvous::join),
//   2. spawn the local workers with the environment contract (common/env_names.h),
//   3. monitor them from one event loop: exits (SIGCHLD via signalfd), output pipes, forwarded
//      signals and the shutdown-grace timer; nothing polls on a timer,
//   4. the first failing worker stops the group (SIGTERM, SIGKILL after the grace) and the nodes
//      decide: with restarts left every worker of every node restarts with
//      TORCHELASTIC_RESTART_COUNT + 1, otherwise the failure table and run-summary.json report
//      the root cause, whose exit code the launcher returns,
//   5. news from the rendezvous (a failure elsewhere, an evicted node, a newcomer) stops the
//      workers and re-joins; success waits for the other nodes, then exits 0.
// Not thread-safe: one agent per process, driven from the main thread (PR_SET_PDEATHSIG follows
// the thread that forks).

#include <memory>
#include <string>

#include "launcher/node_rendezvous.h"
#include "launcher/options.h"

namespace cxxlaunch::launcher {

// Exit codes of `cxxlaunch` itself; a failed job exits with its root cause's code instead.
inline constexpr int kExitOk = 0;
inline constexpr int kExitInternal = 1;  // the launcher could not do its job (I/O, fork)
inline constexpr int kExitUsage = 2;     // bad flags or input; nothing was spawned

// Blocks the signals the agent handles (SIGCHLD and the forwarded ones) in the calling thread, so
// that threads started afterwards (gRPC's, the hosted server's) inherit the mask and the agent's
// signalfd sees every one of them. Call it first thing in main, before any thread exists.
void blockAgentSignals();

// Runs the job to the end; returns the launcher's exit code.
int runAgent(const LaunchOptions& options, NodeRendezvous& rendezvous);

}  // namespace cxxlaunch::launcher
