// cxxlaunch: the command-line front end. Parses the command, calls one library function, maps
// errors to the documented exit codes (docs/launcher.md): 2 for a user's mistake, 1 when the
// launcher itself failed, else the job's own exit code.

#include <sys/resource.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>
#include <vector>

#include "common/command_line.h"
#include "common/did_you_mean.h"
#include "launcher/agent.h"
#include "launcher/cli.h"
#include "launcher/memory_estimate.h"
#include "launcher/merge_weights.h"
#include "launcher/remote.h"
#include "launcher/self_test.h"
#include "launcher/status.h"
#include "launcher/stop_deadline.h"
#include "launcher/system_info.h"
#include "launcher/wizard.h"

namespace {

using namespace cxxlaunch::launcher;
using Args = std::vector<std::string>;

[[noreturn]] void exitNow(int exit_code) {
  std::cout.flush();
  std::cerr.flush();
  std::_Exit(exit_code);
}

// The limit behind `err`, for the error line: no thread or process could be started (EAGAIN),
// or the launcher has as many files open as it may (EMFILE) or the system does (ENFILE).
std::string limitHint(int err) {
  rlimit limit{};
  if (err == EAGAIN) {
    if (::getrlimit(RLIMIT_NPROC, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
      return " (no thread or process could be started: this user may run " +
             std::to_string(limit.rlim_cur) + " at most, ulimit -u)";
    }
    return " (no thread or process could be started)";
  }
  if (err == EMFILE && ::getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    return " (the launcher has as many files open as it may, " + std::to_string(limit.rlim_cur) +
           ": its workers' pipes and logs need a few each; raise ulimit -n)";
  }
  if (err == ENFILE) return " (the system has as many files open as it may: fs.file-max)";
  return "";
}

// Prints the exception being handled as one line; returns its exit code (docs/launcher.md).
int reportError(const std::string& command) {
  const std::string who = "cxxlaunch " + command + ": ";
  try {
    throw;
  } catch (const cxxlaunch::cli::HelpRequested& help) {
    std::cout << help.text;
    return kExitOk;
  } catch (const cxxlaunch::InvalidArgument& e) {
    std::cerr << who << "error: " << e.what() << "\n";
    return kExitUsage;
  } catch (const cxxlaunch::SystemError& e) {
    std::cerr << who << e.what() << limitHint(e.code()) << "\n";
  } catch (const std::filesystem::filesystem_error& e) {
    std::cerr << who << e.what() << limitHint(e.code().value()) << "\n";
  } catch (const std::system_error& e) {  // std::thread's: what() is only the errno text
    const int err = e.code().value();
    std::cerr << who << (err == EAGAIN ? "cannot start a thread: " : "") << e.what()
              << limitHint(err) << "\n";
  } catch (const std::exception& e) {
    std::cerr << who << e.what() << "\n";
  }
  return kExitInternal;
}

int run(const Args& args) {
  LaunchOptions options = parseRunArgs(args, HostInfo::detect());
  for (const auto& note : options.config_notes) std::cerr << "cxxlaunch: note: " << note << "\n";
  for (const auto& warning : options.warnings) {
    std::cerr << "cxxlaunch: warning: " << warning << "\n";
  }
  blockAgentSignals();                                 // before the rendezvous starts any thread
  if (options.remote) std::_Exit(runRemote(options));  // --hostfile: the hosts' agents over ssh
  armStopDeadline(options.shutdown_grace);
  // From here on the launcher leaves through exitNow, errors included, never through gRPC's
  // destructors: the job is over and its peers informed (tearing down would only add tens of
  // milliseconds), or it failed, and a server some of whose threads could not start waits for
  // them for ever while it is torn down. Declared outside the try: unwinding would destroy it.
  std::unique_ptr<NodeRendezvous> rendezvous;
  try {
    rendezvous = makeNodeRendezvous(options);
    exitNow(runAgent(options, *rendezvous));
  } catch (...) {
    exitNow(reportError("run"));
  }
}

struct Command {
  std::vector<std::string> names;  // the first is the name, the others aliases
  std::string summary;
  int (*main)(const Args& args);
};

// The commands, as `cxxlaunch --help` lists them; each parses its own flags (with CLI11).
const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {{"run", "launch"}, "start workers: cxxlaunch run --nproc_per_node=N PROGRAM [ARGS...]", run},
      {{"status"},
       "a run's rendezvous: cxxlaunch status --rdzv_endpoint H:P --rdzv_id ID",
       [](const Args& args) {
         std::cout << describeRun(parseStatusArgs(args));
         return kExitOk;
       }},
      {{"config"},
       "write a config file by answering questions (config default: from the hardware; "
       "config --print: each setting and where it comes from)",
       [](const Args& args) {
         std::cout << runConfigCommand(parseConfigArgs(args), HostInfo::detect());
         return kExitOk;
       }},
      {{"env"},
       "versions, hardware and config, for a bug report",
       [](const Args& args) {
         std::cout << describeSystem(CXXLAUNCH_VERSION, parseEnvArgs(args), HostInfo::detect());
         return kExitOk;
       }},
      {{"test"},
       "run the self-test through the launcher with your config",
       [](const Args& args) { return runSelfTest(args, std::cout); }},
      {{"estimate-memory", "estimate_memory"},
       "memory per rank: cxxlaunch estimate-memory --params 7e9 --num_processes 8",
       [](const Args& args) {
         std::cout << formatEstimate(parseEstimateArgs(args));
         return kExitOk;
       }},
      {{"merge-weights", "merge_weights"},
       "a checkpoint as one model in safetensors (cxxlaunch merge-weights CHECKPOINT OUTPUT), "
       "or a LoRA adapter merged into its base (--lora ADAPTER --base MODEL OUTPUT)",
       [](const Args& args) { return runMergeWeights(args, std::cout, std::cerr); }},
  };
  return table;
}

std::string commandList() {
  std::string text = "Commands (cxxlaunch COMMAND --help for each one's flags):\n";
  for (const Command& c : commands()) {
    std::string names = c.names[0];
    for (size_t i = 1; i < c.names.size(); ++i) names += " (alias " + c.names[i] + ")";
    text += "  " + names + std::string(names.size() < 28 ? 28 - names.size() : 1, ' ') + c.summary +
            "\n";
  }
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("The C++ torchrun/accelerate: launches LibTorch trainers on one or many machines.",
               "cxxlaunch");
  cxxlaunch::cli::useConventions(app);
  app.prefix_command();  // the command and its arguments are left for the command to parse
  app.footer(commandList());
  bool version = false;
  app.add_flag("--version", version, "print the version");
  const Args given(argv + 1, argv + argc);
  Args rest;
  try {
    cxxlaunch::cli::parse(app, given);
    rest = app.remaining();
    if (!rest.empty() && rest[0].starts_with("-")) cxxlaunch::cli::throwUnknownFlag(app, rest[0]);
  } catch (const cxxlaunch::cli::HelpRequested& help) {
    std::cout << help.text;
    return kExitOk;
  } catch (const cxxlaunch::InvalidArgument& e) {
    std::cerr << "cxxlaunch: error: " << e.what() << "\n";
    return kExitUsage;
  }
  if (version) {
    std::cout << "cxxlaunch " << CXXLAUNCH_VERSION << "\n";
    return kExitOk;
  }
  if (rest.empty() || rest[0] == "help") {
    std::cout << app.help();
    return rest.empty() ? kExitUsage : kExitOk;
  }
  const std::string name = rest[0];
  const Args args(rest.begin() + 1, rest.end());
  const Command* command = nullptr;
  std::vector<std::string> names;
  for (const Command& c : commands()) {
    for (const auto& n : c.names) {
      if (n == name) command = &c;
      names.push_back(n);
    }
  }
  if (command == nullptr) {
    const std::string best = cxxlaunch::closestMatch(name, names);
    std::cerr << "cxxlaunch: error: unknown command '" << name << "'"
              << (best.empty() ? "" : "; did you mean " + best + "?")
              << " (see cxxlaunch --help)\n";
    return kExitUsage;
  }
  try {
    return command->main(args);
  } catch (...) {
    return reportError(name);
  }
}
