// Validation: the combinations of settings that cannot run (fp16 on CPUs, a machine_rank past
// num_machines, nvme offload without a writable folder, ...), refused before anything is spawned.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "common/error.h"
#include "common/tracker_names.h"
#include "launcher/config.h"
#include "launcher/config_internal.h"

namespace cxxlaunch::launcher {

using namespace config_detail;  // NOLINT(google-build-using-namespace)

void validateConfig(const Config& c) {
  auto at = [&](const std::string& key) { return originName(c.origin(key)); };
  auto fail = [&](const std::string& key, const std::string& message) {
    throw ConfigError(at(key) + ": " + message);
  };
  const std::string type = c.text("distributed_type");
  const bool cpu = c.flag("use_cpu") || type == "MULTI_CPU";
  if (c.text("compute_environment") == "AMAZON_SAGEMAKER") {
    fail("compute_environment",
         "AMAZON_SAGEMAKER is not supported: cxxlaunch starts workers on this machine; use "
         "LOCAL_MACHINE");
  }
  if (cpu && c.text("mixed_precision") == "fp16") {
    fail("mixed_precision",
         "fp16 needs a GPU, but this config trains on CPUs (" +
             (c.flag("use_cpu") ? "use_cpu at " + at("use_cpu")
                                : "distributed_type MULTI_CPU at " + at("distributed_type")) +
             "); use bf16 or no");
  }
  try {
    parseTrackerList(c.text("cxxlaunch.log_with"), at("cxxlaunch.log_with"));
  } catch (const InvalidArgument& e) {
    throw ConfigError(e.what());
  }
  const long long machines = c.integer("num_machines");
  if (c.isSet("num_processes") && c.integer("num_processes") % machines != 0) {
    fail("num_processes", "num_processes is the total across machines and must divide evenly: " +
                              c.text("num_processes") + " processes on " +
                              std::to_string(machines) + " machines (num_machines at " +
                              at("num_machines") + ")");
  }
  if (c.integer("machine_rank") >= machines) {
    fail("machine_rank", "machine_rank " + c.text("machine_rank") + " is out of range for " +
                             std::to_string(machines) + " machine(s); use 0 to " +
                             std::to_string(machines - 1));
  }
  if (machines > 1 && c.text("main_process_ip").empty() &&
      c.text("cxxlaunch.rdzv_endpoint").empty()) {
    fail("num_machines",
         "a job on several machines needs main_process_ip: the address of the machine with "
         "machine_rank 0");
  }
  for (const auto& [device_key, path_key] :
       {std::pair<std::string, std::string>{"deepspeed_config.offload_optimizer_device",
                                            "deepspeed_config.offload_optimizer_nvme_path"},
        {"deepspeed_config.offload_param_device", "deepspeed_config.offload_param_nvme_path"}}) {
    if (c.text(device_key) != "nvme" || type != "DEEPSPEED") continue;
    const std::string path = c.text(path_key);
    const std::string flag = path_key.substr(path_key.find('.') + 1);
    if (path.empty()) {
      fail(device_key, "nvme offload needs a directory on local disk: set " + flag);
    }
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      fail(path_key, flag + " '" + path + "' is not an existing directory; create it first");
    }
    if (::access(path.c_str(), W_OK) != 0) {
      fail(path_key, flag + " '" + path + "' is not writable");
    }
  }
  if (type == "DEEPSPEED" && c.text("deepspeed_config.offload_param_device") == "nvme" &&
      c.integer("deepspeed_config.zero_stage") != 3) {
    fail("deepspeed_config.offload_param_device",
         "offload_param_device nvme needs zero_stage 3 (parameters sharded at rest)");
  }
  if (const std::string gpu_ids = c.text("gpu_ids");
      gpu_ids != "all" && c.isSet("num_processes") && !cpu) {
    const auto ids = std::count(gpu_ids.begin(), gpu_ids.end(), ',') + 1;
    const long long per_node = c.integer("num_processes") / machines;
    if (ids != per_node) {
      fail("gpu_ids", "gpu_ids names " + std::to_string(ids) + " GPU(s) but each machine runs " +
                          std::to_string(per_node) + " process(es) (num_processes at " +
                          at("num_processes") + "); give one GPU per process");
    }
  }
}

void validateConfigOnMachine(const Config& c, int gpus) {
  if (gpus > 0 || c.text("mixed_precision") != "fp16") return;
  // Refused already (and better said) by validateConfig when the config itself asks for CPUs.
  if (c.flag("use_cpu") || c.text("distributed_type") == "MULTI_CPU") return;
  throw ConfigError(originName(c.origin("mixed_precision")) +
                    ": fp16 needs a GPU, but this machine has none visible (no NVIDIA GPU in "
                    "/proc/driver/nvidia/gpus, or CUDA_VISIBLE_DEVICES names none), so the "
                    "workers would train on CPUs; use bf16 or no here");
}

}  // namespace cxxlaunch::launcher
