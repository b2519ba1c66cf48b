#pragma once
// `cxxlaunch estimate-memory`: memory per rank for a model's states (parameters, gradients,
// Adam's optimizer state) under DDP, ZeRO-1/2/3 and CPU offload, by the formulas of the ZeRO
// paper (Rajbhandari et al. 2020, section 3 and table 1). Activations, buffers and temporary
// gathered layers are not included. Pure functions; docs/config.md has the formulas and a worked
// example.

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
  std::string strategy;  // ddp, zero1, zero2, zero3, zero2+offload, zero3+offload, ...
  double gpu_bytes = 0;  // per rank
  double cpu_bytes = 0;  // per rank (offloaded state)
};

// Bytes per parameter (P, G, O) as the paper's K notation: fp32 training 4 + 4 + 8;
// 16-bit mixed precision 2 + 2 + 12 (fp32 master weights, momentum and variance).
std::vector<MemoryRow> estimateMemory(const MemoryEstimateOptions& options);

// `--params 7e9 [--num_processes N] [--dtypes fp32,bf16,fp16] | --config layers.yaml`; the YAML
// is `layers:` followed by a list of parameter counts or of {name, params}. Throws UsageError.
MemoryEstimateOptions parseEstimateArgs(const std::vector<std::string>& args);

// The table `cxxlaunch estimate-memory` prints, in GB (10^9 bytes, as the paper).
std::string formatEstimate(const MemoryEstimateOptions& options);

}  // namespace cxxlaunch::launcher
