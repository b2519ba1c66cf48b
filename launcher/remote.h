#pragma once
// The hostfile start (`cxxlaunch run --hostfile`, docs/clusters.md#hostfile): one node agent per
// host, each started over the user's own `ssh`, their output streamed back line by line as
// "HOST: line", signals passed on, the first failure (a host that cannot be reached, or a node
// that fails) named, and nothing left running on any host.
//
// How a signal crosses ssh: a command without a terminal gets no signals from ssh, so each
// remote shell runs the node agent with a small reader of its standard input beside it: a line
// naming a signal ("TERM") is sent to the agent, and the end of the input (the ssh connection
// gone, this launcher gone) sends SIGTERM. Not thread-safe: one per process, on the main thread,
// with the agent's signals blocked (blockAgentSignals).

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "launcher/config.h"
#include "launcher/options.h"

namespace cxxlaunch::launcher {

// What the hostfile start is planned from (remote_plan.cc).
struct RemotePlan {
  const Config& config;
  // The user's flags in order, canonical name and value (nullopt: a switch); those the start
  // sets itself (--nnodes, --nproc_per_node, --hostfile, ...) are not passed on.
  std::vector<std::pair<std::string, std::optional<std::string>>> given;
  std::string endpoint;  // --rdzv_endpoint or cxxlaunch.rdzv_endpoint; empty: the first host's
  std::string run_id;
  std::vector<std::string> command;  // the program (resolved) and its arguments
};

// With a hostfile in the config (--hostfile, CXXLAUNCH_HOSTFILE, or deepspeed_hostfile in a
// file with num_machines > 1, as accelerate reads it) and deepspeed_multinode_launcher pdsh
// (the default): the hosts to start, else nullopt. Throws UsageError for a bad hostfile or
// filter, and for deepspeed_multinode_launcher openmpi/mvapich/mpich/impi/slurm.
std::optional<RemoteLaunch> planRemoteLaunch(const RemotePlan& plan);

// The command line each host's shell runs (a POSIX sh script, quoted for the login shell), for
// node `node` of `remote`.
std::string remoteCommand(const RemoteLaunch& remote, size_t node);

// `text` as one single-quoted shell word.
std::string shellQuote(const std::string& text);

// Starts every host's node agent and waits for all of them; returns the launcher's exit code:
// 0, the first failure's exit code (ssh's 255 for a host it could not reach), or 128+signal
// when a signal stopped the job.
int runRemote(const LaunchOptions& options);

}  // namespace cxxlaunch::launcher
