#pragma once
// The `cxxlaunch run` command line: torchrun's flags (both --dash-form and --under_score form)
// parsed and validated into LaunchOptions. Nothing here has side effects: a bad command line
// throws UsageError before anything is spawned.

#include <string>
#include <vector>

#include "launcher/options.h"
#include "rendezvous/error.h"

namespace cxxlaunch::launcher {

// A mistake on the command line. `main` prints it as one line and exits with kExitUsage.
class UsageError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// What `--nproc_per_node cpu|gpu|auto` resolve against; injectable for tests.
struct HostInfo {
  int cpus = 1;
  int gpus = 0;
  std::string path;  // $PATH, for finding the program

  static HostInfo detect();
};

// Parses the arguments after `cxxlaunch run`. The first non-flag argument is the program; it and
// everything after it go to the workers verbatim.
LaunchOptions parseRunArgs(const std::vector<std::string>& args, const HostInfo& host);

// `cxxlaunch status --rdzv_endpoint HOST:PORT --rdzv_id ID [--rdzv_conf token_file=...]`.
struct StatusOptions {
  std::string run_id;
  RendezvousOptions rdzv;
};
StatusOptions parseStatusArgs(const std::vector<std::string>& args);

// The flag reference printed by `cxxlaunch run --help`.
std::string runHelp();

}  // namespace cxxlaunch::launcher
