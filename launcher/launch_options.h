#pragma once
// From what `cxxlaunch run` was given to LaunchOptions: the config's launch settings mapped onto
// torchrun's options, the worker count resolved against the hardware, and the rendezvous
// settings checked together. Used by the flag parser (launcher/run_flags.cc).

#include <map>
#include <string>
#include <vector>

#include "launcher/cli.h"
#include "launcher/config.h"
#include "launcher/options.h"

namespace cxxlaunch::launcher {

// The command line as read, before the config and the hardware are applied.
struct RunFlags {
  LaunchOptions options;
  std::string nproc_text;       // --nproc_per_node as given: N, cpu, gpu or auto
  bool nproc_explicit = false;  // a number given by --nproc_per_node
  bool nproc_given = false;     // --nproc_per_node in any form
  std::string config_file;
  std::vector<FlagValue> config_flags;  // accelerate's flags: the config's flag layer
};

// The config's launch settings become the options torchrun's flags would set; the flags are
// applied afterwards and win. See docs/config.md, "How the file maps to the launcher".
void applyConfig(const Config& c, RunFlags& p, const std::map<std::string, std::string>& env);

// The config's layers for this command line: --config_file (else the default file, when it
// exists), the CXXLAUNCH_* environment, the flags.
ConfigLayers configLayers(const std::string& file, const std::vector<FlagValue>& flags,
                          const HostInfo& host);

// --nproc_per_node N|cpu|gpu|auto on `host`.
int resolveNproc(const std::string& text, const LaunchOptions& options, const HostInfo& host);

// --nproc_per_node (resolved in `options`) against the config's num_processes, accelerate's
// total across machines: from a flag (--num_processes) a different count is a UsageError, from
// the file or the environment it is overridden with a note in options.config_notes.
void checkProcessCounts(const Config& c, LaunchOptions& options);

// The worker count against --gpus and the world-size bound, then the rendezvous settings
// together; throws UsageError.
void validateLaunch(LaunchOptions& options, bool nproc_explicit);

// More workers on this machine than it has cores (a CPU run: use_cpu, MULTI_CPU, or no GPU) or
// GPUs (a GPU run) still starts, as accelerate and torchrun do, with a warning in
// options.warnings that says what follows: the workers share them and each runs slower.
void warnOversubscription(const Config& c, LaunchOptions& options, const HostInfo& host);

}  // namespace cxxlaunch::launcher
