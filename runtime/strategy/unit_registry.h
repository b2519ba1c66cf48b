#pragma once
// The strategies' side of unitForward (strategy/unit.h): which modules are shard units of which
// strategy, and which recompute their activations. Private to the runtime and models/.
//
// Thread-safety: the registry is locked; ranks run as threads in tests, each with its own model.

#include <torch/nn/module.h>
#include <torch/types.h>

#include <string>

#include "runtime/strategy/unit.h"

namespace cxxlaunch::runtime {

// Implemented by strategies that gather parameters just in time (strategy/sharded.h).
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void beforeForward(const torch::nn::Module& unit) = 0;
  // Returns `output`, with a hook that gathers the unit again before its backward.
  virtual torch::Tensor afterForward(const torch::nn::Module& unit, torch::Tensor output) = 0;
};

namespace detail {
// The hooks of the strategy that owns `module` as a unit, or null. Strategies register their
// units for their lifetime.
UnitHooks* unitHooksFor(const torch::nn::Module* module);
// Whether `module` is a RunsThroughUnitForward that says it does.
bool runsThroughUnitForward(const torch::nn::Module* module);
void registerUnit(const torch::nn::Module* module, UnitHooks* hooks);
void unregisterUnit(const torch::nn::Module* module);

// Modules whose activations unitForward recomputes in backward.
bool checkpointsActivations(const torch::nn::Module* module);
void setCheckpointActivations(const torch::nn::Module* module, bool on);

// "BlockImpl" for "(anonymous namespace)::BlockImpl"; whether that is `wanted` or wanted + "Impl"
// (a config names `Block` for LibTorch's BlockImpl).
std::string shortTypeName(const torch::nn::Module& module);
bool typeMatches(const torch::nn::Module& module, const std::string& wanted);
}  // namespace detail

}  // namespace cxxlaunch::runtime
