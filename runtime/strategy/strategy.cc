#include "runtime/strategy/strategy.h"

#include <torch/torch.h>

#include <cstdio>
#include <iostream>

#include "common/error.h"
#include "runtime/deferred_init.h"
#include "runtime/strategy/frozen_parameters.h"
#include "runtime/strategy/model_state.h"
#include "runtime/strategy/sharded.h"

namespace cxxlaunch::runtime {

namespace {

std::string humanBytes(size_t bytes) {
  char text[32];
  if (bytes < (1u << 20)) {
    std::snprintf(text, sizeof(text), "%.1f KiB", static_cast<double>(bytes) / 1024);
  } else {
    std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  }
  return text;
}

}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> Strategy::fullParameters(
    const NameFilter& keep) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  visitFullParameters([&](const std::string& name, const torch::Tensor& value) {
    if (keep && !keep(name)) return;
    // Host copies: a whole model gathered on the GPU would cost its memory, and callers read
    // the bytes (dumps, comparisons with a CPU reference).
    out.emplace_back(name, value.to(torch::TensorOptions().device(torch::kCPU).dtype(torch::kFloat),
                                    /*non_blocking=*/false, /*copy=*/true));
  });
  return out;
}

std::string MemoryReport::str() const {
  return "parameters " + humanBytes(parameters) + ", gradients " + humanBytes(gradients) +
         ", optimizer state " + humanBytes(optimizer_state) + ", total " + humanBytes(total()) +
         (offloaded > 0 ? "; offloaded to nvme " + humanBytes(offloaded) : "") +
         (offloaded_to_cpu > 0 ? "; offloaded to cpu " + humanBytes(offloaded_to_cpu) : "") +
         (kept_for_reuse > 0 ? "; kept for reuse " + humanBytes(kept_for_reuse) : "") +
         (device_peak > 0 ? "; GPU peak " + humanBytes(device_peak) : "");
}

std::unique_ptr<Strategy> makeStrategy(const WorkerEnv& env, std::shared_ptr<Backend> backend,
                                       std::shared_ptr<torch::nn::Module> model,
                                       torch::optim::Optimizer& optimizer,
                                       const StrategyOptions& options) {
  const StrategySetting& strategy = env.strategy;
  const std::string name(strategy.name());
  const bool on_gpu = !model->parameters().empty() && model->parameters().front().is_cuda();
  const bool to_cpu = env.offloads(OffloadDevice::kCpu);
  if (to_cpu && !on_gpu && env.rank == 0) {
    std::cerr << "cxxlaunch: offload to cpu: this is a CPU run, parameters and optimizer state "
                 "already live in host memory; nothing to offload\n";
  }
  // DeepSpeed reads offload_param only at stage 3; FSDP's fsdp_offload_params (strategies
  // fsdp_*) offloads at every sharding strategy.
  const bool params_ignored =
      (strategy == StrategyKind::kZero1 || strategy == StrategyKind::kZero2) &&
      env.offload_params == OffloadDevice::kCpu && env.offload_optimizer != OffloadDevice::kCpu;
  if (params_ignored && on_gpu && env.rank == 0) {
    std::cerr << "cxxlaunch: offload_param_device cpu applies at ZeRO stage 3 (DeepSpeed ignores "
                 "it below): everything stays on the GPU; offload_optimizer_device cpu moves the "
                 "optimizer state to the host\n";
  }
  const bool host_offload = to_cpu && on_gpu && !params_ignored;
  const bool to_nvme = env.offloads(OffloadDevice::kNvme);
  if (backend->name() == "nccl" && to_nvme) {
    throw InvalidArgument(
        "nvme offload runs on CPU workers in this build (its staging slots are host memory); a "
        "GPU run offloads to host memory instead: set offload_optimizer_device/"
        "offload_param_device to cpu");
  }
  checkSameModel(*backend, *model);
  const int stage = strategy.stage();
  // A model built under a DeferredInit: where every rank holds all of it anyway, it is all made
  // now (frozen parameters in the compute dtype); ZeRO-3 makes it unit by unit.
  if (stage != 3) materializeParameters(*model, true, options.precision.compute);
  if (stage == 0 && to_nvme) {
    throw InvalidArgument(
        "nvme offload needs a ZeRO stage (zero_stage 1, 2 or 3) or FSDP "
        "sharding; strategy " +
        name + " keeps everything in memory");
  }
  ShardingOptions sharding;
  sharding.name = name;
  sharding.stage = stage;
  // DDP in the model's own precision, nothing offloaded: the trainer's optimizer steps the
  // parameters where they are, as PyTorch's DDP leaves it to. Mixed precision and cpu offload
  // keep fp32 master weights apart from the model's compute copies, stepped by ShardOptimizer.
  sharding.trainer_optimizer = stage == 0 && !options.precision.mixed() && !host_offload;
  sharding.find_unused_parameters = options.find_unused_parameters;
  sharding.hybrid = strategy.hybrid();
  sharding.node = env.node_rank;
  sharding.wrap_policy = env.fsdp_auto_wrap_policy;
  sharding.unit_types = env.fsdp_transformer_layer_cls;
  sharding.min_num_params = env.fsdp_min_num_params;
  sharding.wrapped = options.wrapped;
  sharding.backward_prefetch = env.fsdp_backward_prefetch;
  // DeepSpeed's ZeRO-3 prefetches in forward too (its trace of the previous step); FSDP only
  // when asked.
  sharding.forward_prefetch = strategy == StrategyKind::kZero3 || env.fsdp_forward_prefetch;
  // DDP makes every rank's model rank 0's whatever FSDP's setting says.
  sharding.sync_module_states = env.fsdp_sync_module_states || sharding.trainer_optimizer;
  sharding.bucket_bytes = options.bucket_bytes;
  sharding.compute_dtype = options.precision.compute;
  if (env.offload_optimizer == OffloadDevice::kNvme)
    sharding.nvme_optimizer_dir = env.offload_optimizer_nvme_path;
  // Offloading the parameters means their fp32 masters below stage 3 (the compute copies must
  // be whole on the GPU there), so either key moves the optimizer's side to the host.
  sharding.offload_to_host = host_offload;
  sharding.offload_params_to_host = host_offload && env.offload_params == OffloadDevice::kCpu;
  // Pinned host shards (cpu offload) stay: pinning memory again at every step costs.
  sharding.free_gradients_between_steps = on_gpu && !host_offload;
  if (env.offload_params == OffloadDevice::kNvme) {
    if (stage != 3) {
      throw InvalidArgument(
          "offload_param_device nvme needs parameters sharded at rest: ZeRO "
          "stage 3 (strategy zero3 or fsdp_full_shard), not " +
          name);
    }
    sharding.nvme_param_dir = env.offload_param_nvme_path;
  }
  return std::make_unique<ShardedStrategy>(std::move(backend), std::move(model), optimizer,
                                           std::move(sharding));
}

}  // namespace cxxlaunch::runtime
