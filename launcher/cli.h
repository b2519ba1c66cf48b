#pragma once
// The launcher's command lines: `cxxlaunch run` (torchrun's flags and accelerate's, both
// --dash-form and --under_score form, and the config file) parsed and validated into
// LaunchOptions, and `cxxlaunch status`. Nothing here spawns or writes anything: a bad command
// line or config throws (UsageError, ConfigError) before anything is spawned.
//
// Where each part lives: the flag table and its parsing in run_flags.cc, the flags' values in
// flag_values.cc, config -> launch options and the checks across flags in launch_options.cc,
// PATH lookup in program_path.cc, hardware detection in host_info.cc, status in status_args.cc.

#include <map>
#include <string>
#include <vector>

#include "common/error.h"
#include "launcher/cluster_env.h"
#include "launcher/options.h"

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
  std::string path;                        // $PATH, for finding the program
  std::map<std::string, std::string> env;  // the CXXLAUNCH_* variables: the config's env layer
  std::string default_config;              // used when it exists and no --config_file is given
  int default_nproc = 1;  // workers per node when neither a flag nor the config says
  ClusterEnv cluster;     // what Slurm or MPI say about this node's place (cluster_env.h)

  static HostInfo detect();
};

// Parses the arguments after `cxxlaunch run`. The first non-flag argument is the program; it and
// everything after it go to the workers verbatim. accelerate's flags and config file
// (--config_file, or the default file) are resolved first (launcher/config.h); torchrun's flags
// win over them. --help (before the program) throws cli::HelpRequested with runHelp()'s text.
LaunchOptions parseRunArgs(const std::vector<std::string>& args, const HostInfo& host);

// `cxxlaunch status --rdzv_endpoint HOST:PORT --rdzv_id ID [--rdzv_conf token_file=...]
// [--silent_after S]`.
struct StatusOptions {
  std::string run_id;
  RendezvousOptions rdzv;
  // A worker whose last progress is at least this old is flagged "silent".
  std::chrono::milliseconds silent_after = std::chrono::seconds(60);
};
StatusOptions parseStatusArgs(const std::vector<std::string>& args);

// The flag reference printed by `cxxlaunch run --help`.
std::string runHelp();

}  // namespace cxxlaunch::launcher
