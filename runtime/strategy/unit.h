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
// parameters whole (ZeRO-2's memory); once a unit went through unitForward — or from prepare on,
// for a unit marked with Accelerator::wrap — call it that way every time (a direct forward
// fails on its freed parameters).
//
// A block selected for activation checkpointing (fsdp_activation_checkpointing, or
// Accelerator::checkpointActivations) keeps no activations: unitForward runs it through
// checkpointActivations (strategy/activation_checkpointing.h), in every strategy. Its first
// argument must then be the tensor that flows through it; the others are taken as constants.
//
// Thread-safety: units of one model are called from one thread at a time.

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "runtime/strategy/activation_checkpointing.h"

namespace cxxlaunch::runtime {

// A base of module types that call unitForward for themselves wherever they are used (models/'s
// decoder layers: their model's forward does). Under ZeRO-3 / FULL_SHARD such a module is a
// shard unit whatever the wrap policy, resting sharded from prepare on, as one marked with
// Accelerator::wrap is, without the trainer marking it.
class RunsThroughUnitForward {
 public:
  virtual ~RunsThroughUnitForward() = default;
  // Whether this instance does: a type whose instances differ says so here (an embedding whose
  // weight the output layer shares is used twice per forward, and cannot be a unit).
  virtual bool runsThroughUnitForward() const { return true; }
};

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

[[noreturn]] void throwCheckpointNeedsTensorInput(const torch::nn::Module& module);
[[noreturn]] void throwCheckpointConstantNeedsGrad(const torch::nn::Module& module);
template <typename Arg>
void requireConstant(const torch::nn::Module& module, const Arg& arg);

// module->forward(input, rest...) with activations recomputed in backward; `rest` copied.
template <typename ModuleHolder, typename First, typename... Rest>
torch::Tensor checkpointedForward(ModuleHolder& module, First&& input, Rest&&... rest) {
  if constexpr (!std::is_convertible_v<First, torch::Tensor>) {
    throwCheckpointNeedsTensorInput(*module.ptr());
  } else {
    (requireConstant(*module.ptr(), rest), ...);
    return checkpointActivations(
        [holder = module,
         constants = std::make_tuple(std::decay_t<Rest>(rest)...)](const torch::Tensor& x) mutable {
          return std::apply([&](auto&... c) { return holder->forward(x, c...); }, constants);
        },
        input);
  }
}

template <typename Arg>
void requireConstant(const torch::nn::Module& module, const Arg& arg) {
  if constexpr (std::is_convertible_v<const Arg&, const torch::Tensor&>) {
    const torch::Tensor& t = arg;
    if (t.defined() && t.requires_grad()) throwCheckpointConstantNeedsGrad(module);
  }
}
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
    const bool recompute = detail::checkpointsActivations(unit);
    auto run = [&] {
      if constexpr (sizeof...(Args) > 0) {
        if (recompute) return detail::checkpointedForward(module, std::forward<Args>(args)...);
      }
      return torch::Tensor(module->forward(std::forward<Args>(args)...));
    };
    if (hooks == nullptr) return run();
    hooks->beforeForward(*unit);
    torch::Tensor output = run();
    return hooks->afterForward(*unit, std::move(output));
  }
}

// LibTorch's module holders: TORCH_MODULE(Block) makes Block one, a shared pointer to BlockImpl.
template <typename T>
concept TorchModuleHolder = std::is_base_of_v<torch::detail::ModuleHolderIndicator, T>;

// A shard unit's handle, what Accelerator::wrap returns for a module holder: calling it is
// unitForward on the module, so a trainer that keeps handles instead of modules cannot call a
// unit the wrong way.
//
//   std::vector<Unit<Block>> units;
//   for (auto& block : blocks) units.push_back(acc.wrap(block));  // before prepare
//   for (auto& unit : units) x = unit(x, mask);                     // unitForward(block, x, mask)
//
// It shares the module with the holder it was made from (holders are shared pointers).
template <TorchModuleHolder ModuleHolder>
class Unit {
 public:
  explicit Unit(ModuleHolder module) : module_(std::move(module)) {}

  template <typename... Args>
  auto operator()(Args&&... args) {
    return unitForward(module_, std::forward<Args>(args)...);
  }
  ModuleHolder& module() { return module_; }
  const ModuleHolder& module() const { return module_; }

 private:
  ModuleHolder module_;
};

}  // namespace cxxlaunch::runtime
