#pragma once
// The strategies' side of deferred initialisation (DeferredInit and initParameter, in
// runtime/strategy/unit.h): which parameters wait for their values, and materialising them.
//
// Thread-safety: the registry of pending initializers is locked.

#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>

#include "runtime/strategy/unit.h"

namespace cxxlaunch::runtime {

// Whether `param` waits for its values.
bool isDeferred(const torch::Tensor& param);

// Runs a deferred parameter's initializer into `values` and forgets it; the caller points the
// parameter at memory of its own (set_data). The values do not depend on the device.
void materializeInto(const torch::Tensor& param, torch::Tensor values);

// A deferred parameter gets memory (on its device) and its values; others are left as they are.
void materialize(torch::Tensor& param);
// Every deferred parameter of `module`, in turn.
void materialize(torch::nn::Module& module);

// module.to(device), its deferred parameters staying without memory.
void moveModule(torch::nn::Module& module, const torch::Device& device);

}  // namespace cxxlaunch::runtime
