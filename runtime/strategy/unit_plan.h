#pragma once
// planUnits: which parameters make which shard unit, a function of the model and the wrap policy
// alone (FSDP's auto-wrap policies; DeepSpeed's ZeRO-3 gathers module by module alike):
//
//   - with module units (stage 3), a module is a unit when the policy names it: by type name
//     (TRANSFORMER_BASED_WRAP), by its own parameter count (SIZE_BASED_WRAP), by the trainer's
//     Accelerator::wrap, or by itself (a RunsThroughUnitForward type); the model itself never is.
//     Each unit takes the trainable parameters under it that no unit inside it took;
//   - the remaining trainable parameters (without module units: all of them) form buckets of at
//     most bucket_bytes, one dtype and device each, in reverse registration order: the order
//     backward produces gradients in (DDP's buckets are these, with no module units);
//   - parameters without gradients are frozen: never flattened, never sharded.
//
// The same policy picks the modules fsdp_activation_checkpointing recomputes, with or without
// module units (UnitPlan::policy_modules).
//
// Nothing is allocated or moved: the plan holds the model's own tensors.

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/env.h"

namespace cxxlaunch::runtime {

struct WrapOptions {
  WrapPolicy policy = WrapPolicy::kNone;
  std::vector<std::string> unit_types{};            // TRANSFORMER_BASED_WRAP's type names
  int64_t min_num_params = 100000000;               // SIZE_BASED_WRAP
  std::vector<const torch::nn::Module*> wrapped{};  // units whatever the policy
  bool module_units = true;                         // false: buckets only (below stage 3)
  size_t bucket_bytes = 25u << 20;
};

struct PlannedUnit {
  std::string name;                           // the module's path, or "bucket N"
  const torch::nn::Module* module = nullptr;  // null for a bucket
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;  // the parameters' names in the model
};

struct UnitPlan {
  std::vector<PlannedUnit> units;  // module units in registration order, then the buckets
  // The modules the policy names, in registration order, whether or not they became units
  // (without module units their parameters went to buckets; one with no trainable parameter
  // of its own holds none): what fsdp_activation_checkpointing recomputes, as accelerate
  // applies FSDP's auto-wrap policy to activation checkpointing too.
  std::vector<const torch::nn::Module*> policy_modules;
  std::vector<torch::Tensor> frozen;
  // Unit indices in the order gradient reductions launch (the same on every rank): module units
  // in reverse registration order, as backward completes them, then the buckets.
  std::vector<size_t> reduce_order;
};

// Throws InvalidArgument when TRANSFORMER_BASED_WRAP names a type the model does not have,
// listing the types it has.
UnitPlan planUnits(torch::nn::Module& model, const WrapOptions& options);

}  // namespace cxxlaunch::runtime
