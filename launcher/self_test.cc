#include "launcher/self_test.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "launcher/agent.h"
#include "launcher/cli.h"
#include "launcher/node_rendezvous.h"

namespace cxxlaunch::launcher {

int runSelfTest(const std::vector<std::string>& args, std::ostream& out) {
  namespace fs = std::filesystem;
  const char* override_path = std::getenv("CXXLAUNCH_SELFTEST");  // NOLINT(concurrency-mt-unsafe)
  std::error_code ec;
  const fs::path worker =
      override_path != nullptr
          ? fs::path(override_path)
          : fs::read_symlink("/proc/self/exe", ec).parent_path() / "cxxlaunch_selftest";
  if (!fs::exists(worker, ec) || ::access(worker.c_str(), X_OK) != 0) {
    out << "cxxlaunch test: your setup is NOT ready: the self-test worker " << worker
        << " is missing; reinstall cxxlaunch (or build the cxxlaunch_selftest target)\n";
    return kExitInternal;
  }
  const auto dashes = std::find(args.begin(), args.end(), "--");
  std::vector<std::string> run_args(args.begin(), dashes);
  run_args.push_back("--");
  run_args.push_back(worker.string());
  if (dashes != args.end()) run_args.insert(run_args.end(), dashes + 1, args.end());

  HostInfo host = HostInfo::detect();
  host.default_nproc = 2;
  const LaunchOptions options = parseRunArgs(run_args, host);
  for (const auto& warning : options.warnings) {
    std::cerr << "cxxlaunch: warning: " << warning << "\n";
  }
  blockAgentSignals();
  auto rendezvous = makeNodeRendezvous(options);
  const int code = runAgent(options, *rendezvous);
  if (code == 0) {
    out << "cxxlaunch test: your setup is ready (" << options.nproc_per_node
        << " worker(s) per machine, strategy "
        << (options.worker_env.count("CXXLAUNCH_STRATEGY") != 0
                ? options.worker_env.at("CXXLAUNCH_STRATEGY")
                : "ddp")
        << ")\n";
    return kExitOk;
  }
  out << "cxxlaunch test: your setup is NOT ready: the self-test failed with exit code " << code
      << "; the workers' messages are above\n";
  return kExitInternal;
}

}  // namespace cxxlaunch::launcher
