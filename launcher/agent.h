#pragma once
// The node agent, cut as torch.distributed.elastic cuts its own:
//  - agent.cc, the restart loop: join a rendezvous round (NodeRendezvous::join), start the local
//    workers with the environment contract (worker_spec.h), monitor them, then let the
//    nodes decide: with restarts left every worker of every node restarts with
//    TORCHELASTIC_RESTART_COUNT + 1, otherwise the failure table and run-summary.json report the
//    root cause, whose exit code the launcher returns; success waits for the other nodes;
//  - worker_group.h, the process context: spawning, signals, reaping, the cgroup and the
//    watchdog, so that nothing the workers start outlives the job;
//  - output_mux.h, the workers' output onto log files and the console;
//  - monitor.h, the event loop of an attempt: exits, output, forwarded signals, the shutdown
//    grace, news from the rendezvous (a failure elsewhere, an evicted node, a newcomer: the
//    workers stop and the agent re-joins); nothing polls on a timer.
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
