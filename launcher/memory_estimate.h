#pragma once
// `cxxlaunch estimate-memory`: memory per rank for a model's states (parameters, gradients,
// Adam's optimizer state) under DDP, ZeRO-1/2/3 and offload, by the formulas of the ZeRO paper
// (Rajbhandari et al. 2020, section 3) for cxxlaunch's own layout, so that it agrees with what
// the runtime's memoryReport() says. Activations, buffers and temporarily gathered units are not
// included. Pure functions; docs/config.md has the formulas and a worked example.

#include <string>
#include <vector>

namespace cxxlaunch::launcher {

struct MemoryEstimateOptions {
  double params = 0;         // Ψ, the number of parameters
  double largest_layer = 0;  // parameters of the largest layer, when known (--config)
  int ranks = 1;             // N, data-parallel ranks (--num_processes)
  std::vector<std::string> dtypes = {"fp32", "bf16", "fp16"};
};

struct MemoryRow {
  std::string dtype;     // fp32, bf16, fp16
  std::string strategy;  // ddp, zero1, zero2, zero3; +offload (nvme), +cpu (cpu offload)
  double gpu_bytes = 0;  // per rank, in the training device's memory
  double cpu_bytes = 0;  // per rank, offloaded (host memory or nvme)
};

// Bytes per parameter: fp32 4 (parameters, which are the masters) + 4 (gradients) + 8 (Adam);
// mixed precision 2 (compute copy) + 4 (fp32 master) + 2 (bf16 full gradient, below stage 2)
// + 4 (fp32 gradient shard) + 8, each sharded as the strategy shards it.
std::vector<MemoryRow> estimateMemory(const MemoryEstimateOptions& options);

// `--params 7e9 [--num_processes N] [--dtypes fp32,bf16,fp16] | --config layers.yaml`; the YAML
// is `layers:` followed by a list of parameter counts or of {name, params}. Throws UsageError.
MemoryEstimateOptions parseEstimateArgs(const std::vector<std::string>& args);

// The table `cxxlaunch estimate-memory` prints, in GB (10^9 bytes, as the paper).
std::string formatEstimate(const MemoryEstimateOptions& options);

}  // namespace cxxlaunch::launcher
