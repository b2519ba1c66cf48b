#include "launcher/worker_spec.h"

#include <algorithm>

#include "common/env_names.h"
#include "common/host.h"

namespace cxxlaunch::launcher {

WorkerSpec::WorkerSpec(const LaunchOptions& options, const std::vector<std::string>& inherited)
    : options_(options) {
  const std::vector<std::string> ours = {
      env::kRank,          env::kLocalRank,      env::kWorldSize,  env::kLocalWorldSize,
      env::kGroupRank,     env::kGroupWorldSize, env::kRoleName,   env::kRoleRank,
      env::kRoleWorldSize, env::kMasterAddr,     env::kMasterPort, env::kRestartCount,
      env::kMaxRestarts,   env::kRunId,          env::kErrorFile,  env::kStoreEndpoint,
      env::kStorePrefix,   env::kToken,          env::kDevice,     env::kTlsCa,
      env::kTlsCert,       env::kTlsKey,         env::kNodeAddr,   env::kStoreUser};
  for (const auto& entry : inherited) {
    const std::string name = entry.substr(0, entry.find('='));
    if (std::find(ours.begin(), ours.end(), name) == ours.end() &&
        options_.worker_env.count(name) == 0) {
      base_.push_back(entry);
    }
  }
  if (!userSets(env::kOmpNumThreads) && options_.nproc_per_node > 1) {
    base_.push_back(std::string(env::kOmpNumThreads) + "=1");
  }
}

bool WorkerSpec::userSets(const char* name) const {
  const std::string prefix = std::string(name) + "=";
  return options_.worker_env.count(name) > 0 ||
         std::any_of(base_.begin(), base_.end(),
                     [&](const std::string& e) { return e.starts_with(prefix); });
}

SpawnSpec WorkerSpec::of(const Worker& worker, const WorldAssignment& world) const {
  SpawnSpec spec;
  spec.program = options_.program;
  spec.argv.push_back(options_.program);
  for (const auto& arg : options_.args) {
    spec.argv.push_back(substituteLocalRank(arg, worker.local_rank));
  }
  spec.env = environment(worker, world);
  return spec;
}

std::vector<std::string> WorkerSpec::environment(const Worker& worker,
                                                 const WorldAssignment& world) const {
  std::vector<std::string> envv = base_;
  auto put = [&](const char* name, const std::string& value) {
    envv.push_back(std::string(name) + "=" + value);
  };
  put(env::kRank, std::to_string(worker.global_rank));
  put(env::kLocalRank, std::to_string(worker.local_rank));
  put(env::kWorldSize, std::to_string(world.world_size));
  put(env::kLocalWorldSize, std::to_string(options_.nproc_per_node));
  put(env::kGroupRank, std::to_string(world.node_rank));
  put(env::kGroupWorldSize, std::to_string(world.num_nodes));
  put(env::kRoleName, options_.role);
  put(env::kRoleRank, std::to_string(worker.global_rank));
  put(env::kRoleWorldSize, std::to_string(world.world_size));
  put(env::kMasterAddr, world.master_addr);
  put(env::kMasterPort, std::to_string(world.master_port));
  if (!world.node_addr.empty()) put(env::kNodeAddr, world.node_addr);
  // Across nodes, PyTorch's Gloo binds to what the host name resolves to, often a loopback
  // address, and NCCL picks an interface of its own: both are told the one that holds this
  // node's address, unless the user chose (docs/env.md).
  if (world.num_nodes > 1 && !world.node_addr.empty()) {
    const std::string interface = interfaceHolding(world.node_addr);
    for (const char* name : {env::kGlooSocketIfname, env::kNcclSocketIfname}) {
      if (!interface.empty() && !userSets(name)) put(name, interface);
    }
  }
  put(env::kRestartCount, std::to_string(world.restart_count));
  put(env::kMaxRestarts, std::to_string(options_.max_restarts));
  put(env::kRunId, options_.run_id);
  put(env::kErrorFile, worker.error_file);
  if (!world.store_endpoint.empty()) {
    put(env::kStoreEndpoint, world.store_endpoint);
    put(env::kStorePrefix, world.store_prefix);
    if (!world.token.empty()) put(env::kToken, world.token);
    if (!world.store_user.empty()) put(env::kStoreUser, world.store_user);
    if (!world.tls_ca.empty()) put(env::kTlsCa, world.tls_ca);
    if (!world.tls_cert.empty()) put(env::kTlsCert, world.tls_cert);
    if (!world.tls_key.empty()) put(env::kTlsKey, world.tls_key);
  }
  // Every worker sees the chosen GPUs (CUDA_VISIBLE_DEVICES, in worker_env) and uses the one at
  // its local rank.
  if (!options_.gpus.empty()) put(env::kDevice, std::to_string(worker.local_rank));
  if (!worker.heartbeat_file.empty()) put(env::kHeartbeatFile, worker.heartbeat_file);
  for (const auto& [name, value] : options_.worker_env) put(name.c_str(), value);
  return envv;
}

std::string substituteLocalRank(std::string arg, int local_rank) {
  static const std::string kMacro = "${local_rank}";
  for (size_t at = arg.find(kMacro); at != std::string::npos; at = arg.find(kMacro, at)) {
    arg.replace(at, kMacro.size(), std::to_string(local_rank));
  }
  return arg;
}

}  // namespace cxxlaunch::launcher
