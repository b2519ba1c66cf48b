#include "runtime/strategy/sharding_policy.h"

#include "common/error.h"
#include "runtime/strategy/sharded.h"

namespace cxxlaunch::runtime {

ShardingPolicy ShardingPolicy::of(const ShardingOptions& options, c10::Device device) {
  const int stage = options.stage;
  if (stage < 0 || stage > 3) throw InvalidArgument("ZeRO stage must be 0, 1, 2 or 3");
  const bool mixed = options.compute_dtype != c10::ScalarType::Float;
  const bool to_nvme = !options.nvme_optimizer_dir.empty() || !options.nvme_param_dir.empty();
  if (options.trainer_optimizer && (stage != 0 || mixed || options.offload_to_host || to_nvme)) {
    throw InvalidArgument(
        "the trainer's own optimizer steps only stage 0 in the model's dtype, nothing offloaded");
  }
  ShardingPolicy p;
  p.shard_optimizer = stage >= 1;
  p.shard_gradients = stage >= 2;
  p.reshard_after_forward = stage == 3;

  const Placement memory = options.offload_to_host ? Placement::kHost : Placement::kDevice;
  p.master = options.nvme_param_dir.empty() ? memory : Placement::kNvme;
  p.optimizer_state = options.nvme_optimizer_dir.empty() ? memory : Placement::kNvme;
  p.gradient_shards =
      p.optimizer_state == Placement::kNvme && p.shard_gradients ? Placement::kNvme : memory;
  p.device_keeps_shard =
      p.reshard_after_forward && options.offload_to_host && !options.offload_params_to_host;

  p.own_master = p.reshard_after_forward || mixed || options.offload_to_host;
  p.own_gradient_shard = p.shard_gradients || mixed || options.offload_to_host;
  p.share_full_gradients = stage == 2 && device.is_cpu() && !options.hybrid;
  p.pool_buffers = p.reshard_after_forward && device.is_cpu();
  p.return_freed_memory = p.reshard_after_forward || to_nvme;
  return p;
}

}  // namespace cxxlaunch::runtime
