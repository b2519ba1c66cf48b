#pragma once
// `cxxlaunch config`: the questions accelerate's `accelerate config` asks, in its order, that
// write a config file (launcher/config.h). On a terminal, choices are arrow-key menus (the
// terminal goes to raw mode and is restored on return, on error and on Ctrl-C); on a pipe they
// are numbered prompts, so scripts can answer. Every question shows its default in brackets and
// asks again, with a one-line reason, when the answer does not fit.
//
// Also `cxxlaunch config default` (a minimal file from the detected hardware) and
// `cxxlaunch config --print`. Single-threaded; owns the terminal while it runs.

#include <string>
#include <vector>

#include "launcher/cli.h"
#include "launcher/config.h"

namespace cxxlaunch::launcher {

struct ConfigCommand {
  enum Action { kWizard, kDefault, kPrint };
  Action action = kWizard;
  std::string file;             // --config_file; empty: defaultConfigPath()
  bool force = false;           // replace an existing file without asking
  std::string mixed_precision;  // `config default --mixed_precision`
};

// Parses the arguments after `cxxlaunch config`; throws UsageError.
ConfigCommand parseConfigArgs(const std::vector<std::string>& args);

// Asks the questions on `in_fd`/`out_fd` and returns the answers as a config (file layer).
Config askConfig(int in_fd, int out_fd, const HostInfo& host);

// What `cxxlaunch config default` writes: the detected GPUs (or CPU) and nothing else.
Config defaultConfig(const HostInfo& host, const std::string& mixed_precision);

// Runs the command with stdin/stdout; returns what to print last. Refuses to replace an existing
// file silently: asks on a terminal, needs --force otherwise (ConfigError, exit code 2).
std::string runConfigCommand(const ConfigCommand& command, const HostInfo& host);

}  // namespace cxxlaunch::launcher
