#pragma once
// Building a model that does not fit on one rank: DeepSpeed's zero.Init (zero3_init_flag), FSDP's
// meta-device init (fsdp_cpu_ram_efficient_loading). A parameter given its initial values through
// initParameter() inside a DeferredInit scope keeps its shape and dtype but no memory (its storage
// is one element, every stride 0, NaN): its initializer runs later, when the strategy
// materialises it. A model run before prepare computes NaN.
// Under ZeRO-3 / FULL_SHARD / HYBRID that is one shard unit at a time, right into the unit's flat
// buffer, of which the rank keeps its shard: no rank ever holds more than its shards and one
// unit. The other strategies hold everything anyway and materialise the whole model at prepare.
//
//   cxxlaunch::models::LlamaForCausalLM model{nullptr};
//   {
//     auto deferred = acc.deferredInit();        // on when the config asks for it
//     model = cxxlaunch::models::LlamaForCausalLM(config);
//   }
//   torch::optim::AdamW optimizer(model->parameters(), options);
//   acc.prepare(model.ptr(), optimizer);         // materialised here, unit by unit
//   acc.loadModel(dir);                          // each rank reads its shards' bytes
//
// The values are the initializer's, so a model is the same built either way (models/ draw each
// parameter's seed when it is built). Modules that build their parameters otherwise (LibTorch's
// own layers) are built as usual inside the scope: whole, then sharded at prepare.
//
// Thread-safety: the scope is per thread; the registry of pending initializers is locked.

#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>

namespace cxxlaunch::runtime {

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
