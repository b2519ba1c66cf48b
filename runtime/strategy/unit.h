#pragma once
// unitForward: how a trainer lets shard units be gathered in time. LibTorch modules have no
// forward hooks, so a model calls its big repeated blocks through this function:
//
//   for (auto& block : blocks) x = cxxlaunch::runtime::unitForward(block, x, mask);
//
// Under ZeRO-3 / FSDP FULL_SHARD, when `block` is a shard unit (its type named by the wrap
// policy, or marked with Accelerator::wrap), its parameters are gathered just before the call,
// freed after it, and gathered again just before its backward. Under every other strategy, and
// for a module that is no unit, it is exactly `block->forward(args...)`: one trainer binary runs
// every mode. A model that never calls it still trains correctly under ZeRO-3, with its
// parameters whole (ZeRO-2's memory); once a unit went through unitForward, call it that way
// every time (a direct forward would read freed parameters).
//
// Thread-safety: units of one model are called from one thread at a time.

#include <torch/nn/module.h>
#include <torch/types.h>

#include <type_traits>
#include <utility>

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
void registerUnit(const torch::nn::Module* module, UnitHooks* hooks);
void unregisterUnit(const torch::nn::Module* module);
}  // namespace detail

template <typename ModuleHolder, typename... Args>
auto unitForward(ModuleHolder& module, Args&&... args) {
  using Output = decltype(module->forward(std::forward<Args>(args)...));
  if constexpr (!std::is_same_v<std::decay_t<Output>, torch::Tensor>) {
    // Only a tensor output can carry the pre-backward hook: such a unit is never freed.
    return module->forward(std::forward<Args>(args)...);
  } else {
    const torch::nn::Module* unit = module.ptr().get();
    UnitHooks* hooks = detail::unitHooksFor(unit);
    if (hooks == nullptr) return module->forward(std::forward<Args>(args)...);
    hooks->beforeForward(*unit);
    torch::Tensor output = module->forward(std::forward<Args>(args)...);
    return hooks->afterForward(*unit, std::move(output));
  }
}

}  // namespace cxxlaunch::runtime
