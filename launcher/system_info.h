#pragma once
// `cxxlaunch env`: the block a bug report needs, to copy and paste. Versions of what cxxlaunch
// was built against (LibTorch, NCCL, CUDA runtime: read from their headers at configure time, as
// the launcher never links them), what runs now (CUDA driver, gRPC), the hardware (from /proc)
// and the config in use.

#include <string>
#include <vector>

#include "launcher/cli.h"

namespace cxxlaunch::launcher {

// `cxxlaunch env [--config_file FILE]`: the file, or "" (the default file, when it exists).
// Throws UsageError.
std::string parseEnvArgs(const std::vector<std::string>& args);

// `config_file`: --config_file, or "" for the default file when it exists.
std::string describeSystem(const std::string& version, const std::string& config_file,
                           const HostInfo& host);

}  // namespace cxxlaunch::launcher
