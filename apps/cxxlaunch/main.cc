// cxxlaunch: the command-line front end. Parses the command, calls one library function, maps
// errors to the documented exit codes (docs/launcher.md): 2 for a user's mistake, 1 when the
// launcher itself failed, else the job's own exit code.

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "launcher/agent.h"
#include "launcher/cli.h"
#include "launcher/memory_estimate.h"
#include "launcher/self_test.h"
#include "launcher/status.h"
#include "launcher/system_info.h"
#include "launcher/wizard.h"

namespace {

constexpr const char* kUsage =
    "usage: cxxlaunch COMMAND [flags]\n"
    "commands:\n"
    "  run (alias launch)   start workers: cxxlaunch run --nproc_per_node=N PROGRAM [ARGS...]\n"
    "  status               a run's rendezvous: cxxlaunch status --rdzv_endpoint H:P --rdzv_id ID\n"
    "  config               write a config file by answering questions (config default: from the\n"
    "                       hardware; config --print: each setting and where it comes from)\n"
    "  env                  versions, hardware and config, for a bug report\n"
    "  test                 run the self-test through the launcher with your config\n"
    "  estimate-memory      memory per rank: cxxlaunch estimate-memory --params 7e9 "
    "--num_processes 8\n"
    "  --version            print the version\n"
    "Run 'cxxlaunch run --help' for the flags.\n";

int run(const std::vector<std::string>& args) {
  using namespace cxxlaunch::launcher;
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    std::cout << runHelp();
    return kExitOk;
  }
  LaunchOptions options = parseRunArgs(args, HostInfo::detect());
  for (const auto& note : options.config_notes) std::cerr << "cxxlaunch: note: " << note << "\n";
  blockAgentSignals();  // before the rendezvous starts any thread
  auto rendezvous = makeNodeRendezvous(options);
  const int exit_code = runAgent(options, *rendezvous);
  // The job is over and its peers informed; tearing down gRPC's threads and the hosted server
  // would only add tens of milliseconds to every launch.
  std::cout.flush();
  std::cerr.flush();
  std::_Exit(exit_code);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace cxxlaunch::launcher;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::cout << kUsage;
    return args.empty() ? kExitUsage : kExitOk;
  }
  if (args[0] == "--version") {
    std::cout << "cxxlaunch " << CXXLAUNCH_VERSION << "\n";
    return kExitOk;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  try {
    if (command == "run" || command == "launch") return run(args);
    if (command == "config") {
      std::cout << runConfigCommand(parseConfigArgs(args), HostInfo::detect());
      return kExitOk;
    }
    if (command == "env") {
      std::cout << describeSystem(CXXLAUNCH_VERSION, parseEnvArgs(args), HostInfo::detect());
      return kExitOk;
    }
    if (command == "test") return runSelfTest(args, std::cout);
    if (command == "estimate-memory" || command == "estimate_memory") {
      std::cout << formatEstimate(parseEstimateArgs(args));
      return kExitOk;
    }
    if (command == "status") {
      std::cout << describeRun(parseStatusArgs(args));
      return kExitOk;
    }
    std::cerr << "cxxlaunch: unknown command '" << command << "'\n" << kUsage;
    return kExitUsage;
  } catch (const cxxlaunch::InvalidArgument& e) {
    std::cerr << "cxxlaunch " << command << ": error: " << e.what() << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "cxxlaunch " << command << ": " << e.what() << "\n";
    return kExitInternal;
  }
}
