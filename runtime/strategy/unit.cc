#include <map>
#include <set>
#include <shared_mutex>

#include "common/error.h"
#include "runtime/strategy/unit_registry.h"

namespace cxxlaunch::runtime {
namespace detail {
namespace {

// Module -> the strategy that owns it as a unit. Keyed by module, not per thread: ranks run as
// threads in tests, each with its own model.
struct Registry {
  std::shared_mutex mu;
  std::map<const torch::nn::Module*, UnitHooks*> hooks;
  std::set<const torch::nn::Module*> checkpointed;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

UnitHooks* unitHooksFor(const torch::nn::Module* module) {
  Registry& r = registry();
  std::shared_lock lock(r.mu);
  auto it = r.hooks.find(module);
  return it == r.hooks.end() ? nullptr : it->second;
}

bool runsThroughUnitForward(const torch::nn::Module* module) {
  const auto* marked = dynamic_cast<const RunsThroughUnitForward*>(module);
  return marked != nullptr && marked->runsThroughUnitForward();
}

void registerUnit(const torch::nn::Module* module, UnitHooks* hooks) {
  Registry& r = registry();
  std::unique_lock lock(r.mu);
  r.hooks[module] = hooks;
}

void unregisterUnit(const torch::nn::Module* module) {
  Registry& r = registry();
  std::unique_lock lock(r.mu);
  r.hooks.erase(module);
}

bool checkpointsActivations(const torch::nn::Module* module) {
  Registry& r = registry();
  std::shared_lock lock(r.mu);
  return r.checkpointed.count(module) != 0;
}

void setCheckpointActivations(const torch::nn::Module* module, bool on) {
  Registry& r = registry();
  std::unique_lock lock(r.mu);
  if (on) {
    r.checkpointed.insert(module);
  } else {
    r.checkpointed.erase(module);
  }
}

std::string shortTypeName(const torch::nn::Module& module) {
  const std::string& full = module.name();
  const size_t colon = full.rfind("::");
  return colon == std::string::npos ? full : full.substr(colon + 2);
}

bool typeMatches(const torch::nn::Module& module, const std::string& wanted) {
  const std::string name = shortTypeName(module);
  return name == wanted || name == wanted + "Impl";
}

}  // namespace detail

const char* const kUnitInputNotTensor =
    "its forward's first argument must be the tensor that flows through it; turn checkpointing "
    "off for it, or reorder its arguments";
const char* const kUnitConstantNeedsGrad =
    "only its forward's first argument may require a gradient (the others are recomputed as "
    "constants); pass the tensor that needs one first, or turn checkpointing off for it";

torch::Tensor runUnitCall(const UnitCall& call) {
  const bool recompute = detail::checkpointsActivations(&call.unit);
  if (recompute && !call.recomputed && call.not_recomputable != nullptr) {
    throw InvalidArgument("activation checkpointing of " + detail::shortTypeName(call.unit) + ": " +
                          call.not_recomputable);
  }
  const auto& run = recompute && call.recomputed ? call.recomputed : call.forward;
  UnitHooks* hooks = detail::unitHooksFor(&call.unit);
  if (hooks == nullptr) return run();
  hooks->beforeForward(call.unit);
  torch::Tensor output = run();
  return hooks->afterForward(call.unit, std::move(output));
}

}  // namespace cxxlaunch::runtime
