#pragma once
// What a model does for the strategies (a public header): runs its big repeated blocks through
// unitForward (or a Unit handle), lets them recompute their activations, and builds its
// parameters through initParameter, so that a model too big for one rank can be built sharded.
//
// unitForward: LibTorch modules have no forward hooks, so a model calls its blocks through it:
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
// checkpointActivations, in every strategy. Its first argument must then be the tensor that flows
// through it; the others are taken as constants.
//
// Thread-safety: units of one model are called from one thread at a time; a DeferredInit scope
// is per thread; checkpointActivations as autograd (the backward may run on its threads).

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

namespace cxxlaunch::runtime {

// ---- activation checkpointing -------------------------------------------------------------
// A block's forward keeps none of its intermediate activations; its backward runs the forward
// again (with autograd on) and back-propagates through that: activations fall from every
// block's to one block's at a time, for about one more forward per step. LibTorch's C++ API has
// no torch.utils.checkpoint; this is it, reentrant style (PyTorch's use_reentrant=True):
//
//   x = cxxlaunch::runtime::checkpointActivations([&](const torch::Tensor& h) { return block(h); },
//                                                 x);
//
// The recomputation sees what the first forward saw: the CPU random generator's state (and the
// CUDA one of the input's device), and the autocast state. Gradients flow to `input` and to
// every parameter `forward` uses; anything else `forward` reads is taken as a constant.
using CheckpointedForward = std::function<torch::Tensor(const torch::Tensor&)>;

// `forward(input)`, without its activations kept for backward (they are recomputed). Outside
// autograd (no gradient wanted), just `forward(input)`.
torch::Tensor checkpointActivations(CheckpointedForward forward, const torch::Tensor& input);

// ---- shard units ---------------------------------------------------------------------------
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

// One call of a module through unitForward, as the strategy owning it as a unit runs it
// (gathered before, its backward hooked after, recomputed where selected).
struct UnitCall {
  const torch::nn::Module& unit;
  std::function<torch::Tensor()> forward;  // the module's forward, as called
  // The same through checkpointActivations; empty where the call's arguments cannot be
  // recomputed, `not_recomputable` saying why (for the error if the unit is selected).
  std::function<torch::Tensor()> recomputed;
  const char* not_recomputable = nullptr;
};
torch::Tensor runUnitCall(const UnitCall& call);

// The reasons runUnitCall gives when a selected unit cannot recompute (unit.cc).
extern const char* const kUnitInputNotTensor;
extern const char* const kUnitConstantNeedsGrad;

template <typename ModuleHolder, typename... Args>
auto unitForward(ModuleHolder& module, Args&&... args) {
  using Output = decltype(module->forward(std::forward<Args>(args)...));
  if constexpr (!std::is_same_v<std::decay_t<Output>, torch::Tensor>) {
    // Only a tensor output can carry the pre-backward hook: such a unit is never freed.
    return module->forward(std::forward<Args>(args)...);
  } else {
    // Both closures refer to the call's arguments (runUnitCall runs them before it returns):
    // two references each, which std::function holds without allocating. The copies that
    // backward's recomputation keeps (the module, the constant arguments) are made only where
    // the unit is checkpointed.
    auto refs = std::forward_as_tuple(args...);
    UnitCall call{*module.ptr(),
                  [&module, &refs] {
                    return std::apply(
                        [&](auto&... arg) {
                          return torch::Tensor(module->forward(std::forward<Args>(arg)...));
                        },
                        refs);
                  },
                  {},
                  nullptr};
    if constexpr (sizeof...(Args) > 0) {
      std::apply(
          [&call, &module, &refs](const auto& input, const auto&... rest) {
            if constexpr (std::is_convertible_v<decltype(input), torch::Tensor>) {
              const auto needs_grad = [](const auto& arg) {
                if constexpr (std::is_convertible_v<decltype(arg), const torch::Tensor&>) {
                  const torch::Tensor& t = arg;
                  return t.defined() && t.requires_grad();
                }
                return false;
              };
              if ((needs_grad(rest) || ...)) {
                call.not_recomputable = kUnitConstantNeedsGrad;
                return;
              }
              call.recomputed = [&module, &refs] {
                return std::apply(
                    [&](const auto& x, const auto&... constants) {
                      return checkpointActivations(
                          [holder = module,
                           kept = std::make_tuple(std::decay_t<decltype(constants)>(constants)...)](
                              const torch::Tensor& h) mutable {
                            return std::apply(
                                [&](auto&... c) { return torch::Tensor(holder->forward(h, c...)); },
                                kept);
                          },
                          torch::Tensor(x));
                    },
                    refs);
              };
            } else {
              call.not_recomputable = kUnitInputNotTensor;
            }
          },
          refs);
    }
    return runUnitCall(call);
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

// ---- deferred initialisation ---------------------------------------------------------------
// Building a model that does not fit on one rank: DeepSpeed's zero.Init (zero3_init_flag), FSDP's
// meta-device init (fsdp_cpu_ram_efficient_loading). A parameter given its initial values through
// initParameter() inside a DeferredInit scope keeps its shape and dtype but no memory (its storage
// is one element, every stride 0, NaN): its initializer runs later, when the strategy
// materialises it. A model run before prepare computes NaN. Under ZeRO-3 / FULL_SHARD / HYBRID
// that is one shard unit at a time, right into the unit's flat buffer, of which the rank keeps
// its shard; the other strategies materialise the whole model at prepare.
//
//   cxxlaunch::models::LlamaForCausalLM model{nullptr};
//   {
//     auto deferred = acc.deferredInit();        // on when the config asks for it
//     model = cxxlaunch::models::LlamaForCausalLM(config);
//   }
//   acc.prepare(model.ptr(), optimizer);         // materialised here, unit by unit
//
// The values are the initializer's, so a model is the same built either way (models/ draw each
// parameter's seed when it is built). Modules that build their parameters otherwise (LibTorch's
// own layers) are built as usual inside the scope: whole, then sharded at prepare.

// Writes a parameter's initial values into `values` (its shape and dtype, on any device).
using Initializer = std::function<void(torch::Tensor& values)>;

// While one is alive on this thread (and constructed `on`), initParameter defers.
class DeferredInit {
 public:
  explicit DeferredInit(bool on = true);
  ~DeferredInit();
  DeferredInit(const DeferredInit&) = delete;
  DeferredInit& operator=(const DeferredInit&) = delete;
  static bool active();

 private:
  bool on_;
};

// Gives `param` its initial values by `init`: now, or, inside an active DeferredInit, when a
// strategy materialises it (its memory is released until then).
void initParameter(torch::Tensor& param, Initializer init);

}  // namespace cxxlaunch::runtime
