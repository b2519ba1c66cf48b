// HostInfo::detect: what --nproc_per_node cpu|gpu|auto resolve against, found without loading
// CUDA (the launcher must start in milliseconds).

#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "launcher/cli.h"
#include "launcher/config.h"
#include "launcher/flag_values.h"

namespace cxxlaunch::launcher {

HostInfo HostInfo::detect() {
  HostInfo host;
  cpu_set_t set;
  CPU_ZERO(&set);
  host.cpus = sched_getaffinity(0, sizeof(set), &set) == 0
                  ? CPU_COUNT(&set)
                  : static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  // Count NVIDIA devices without loading CUDA: the launcher must start in milliseconds.
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");  // NOLINT(concurrency-mt-unsafe)
  if (visible != nullptr) {
    // CUDA reads the list up to its first invalid entry: "" and "-1" (the usual way to hide
    // every GPU) leave none.
    for (const auto& id : split(visible, ',')) {
      if (id.empty() || id[0] == '-') break;
      ++host.gpus;
    }
  } else {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
      (void)entry;
      ++host.gpus;
    }
  }
  const char* path = std::getenv("PATH");  // NOLINT(concurrency-mt-unsafe)
  host.path = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  host.env = configEnvironment();
  host.cluster = detectCluster([](const char* name) {
    return std::getenv(name);  // NOLINT(concurrency-mt-unsafe)
  });
  if (host.cluster.cpus > 0) host.cpus = host.cluster.cpus;
  host.default_config = defaultConfigPath();
  return host;
}

}  // namespace cxxlaunch::launcher
