#pragma once
// ShardUnit: one unit of the sharded engine (strategy/sharded.h), as FSDP2's FSDPParamGroup: the
// unit's parameters flattened into one buffer (flat/flat_param.h), this rank's fp32 master shard,
// the gradient buffers, and the collectives that move it between its states.
//
// Parameters, an explicit state:
//   kUnsharded  the flat buffer is resident and holds every parameter (rest state below stage 3,
//               and of a stage-3 unit between its gather and its release);
//   kGathering  unshard() started an all-gather that is writing the buffer; waitUnsharded()
//               completes it;
//   kSharded    reshard() freed the buffer: the parameters' views stay, without memory; only the
//               master shard remains (where the strategy's ShardStore keeps it).
// Gradients: takeGradient() places each parameter's in the unit's full gradient buffer; once
// every one is in (the strategy's GradientReadiness counts them) the strategy calls
// reduceGradients(), which launches the unit's reduction, and finishReduction() completes it.
//
// The unit decides nothing about when: ShardedStrategy schedules (forward order, prefetch,
// reduction order, offload), and calls these on its training thread or under its lock.

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/comm/backend.h"
#include "runtime/flat/flat_param.h"

namespace torch::nn {
class Module;
}

namespace cxxlaunch::runtime {

class ShardUnit {
 public:
  enum class State { kUnsharded, kGathering, kSharded };

  // The flat parameter comes after: flat() = FlatParameter(...), which moves the parameters.
  ShardUnit(std::string name, const torch::nn::Module* module)
      : name_(std::move(name)), module_(module) {}

  const std::string& name() const { return name_; }
  const torch::nn::Module* module() const { return module_; }  // null for a bucket
  FlatParameter& flat() { return flat_; }
  const FlatParameter& flat() const { return flat_; }
  State state() const { return state_; }

  // kSharded -> kGathering: the buffer's memory back (from `pool` when given) and an all-gather
  // over `group` of `input` (this rank's shard in the buffer's dtype, kept alive until the
  // gather completes) into it. Only from kSharded.
  void unshard(Backend& group, torch::Tensor input, BufferPool* pool);
  // kGathering -> kUnsharded; nothing in the other states.
  void waitUnsharded();
  // -> kSharded: waits for a gather in flight (never free memory a collective is writing), then
  // frees the buffer.
  void reshard(BufferPool* pool);

  // Autograd produced parameter `index`'s gradient: moved into the full gradient buffer (in
  // `dtype`), the parameter's .grad left empty. Replicated gradients (stage 0-1) live instead
  // in grad_places: the parameter's .grad becomes its place, where autograd then accumulates.
  void takeGradient(size_t index, torch::ScalarType dtype, BufferPool* pool);
  // The unit's reduction over `group`: an average all-reduce of the whole gradient in place
  // (replicated gradients), or a reduce-scatter of it into incomingGradient().
  void reduceGradients(Backend& group, BufferPool* pool);
  // Waits for the reduction; with `replicas` (hybrid sharding across nodes), averages the
  // reduce-scattered shard over them too.
  void finishReduction(Backend* replicas);
  // Stage 2-3: `zeroed` (padded numel, the gradient's dtype) is the full gradient buffer until
  // dropGradientBuffers, which then lets it go without giving it to the pool (its owner lent it).
  void useLentGradientBuffer(torch::Tensor zeroed);
  // After a reduce-scatter was consumed: the full gradient and the incoming shard freed.
  void dropGradientBuffers(BufferPool* pool);
  // Waits for any collective in flight, errors swallowed (destruction).
  void drain() noexcept;

  // This rank's reduced gradient shard, after finishReduction (stage 2-3).
  const torch::Tensor& incomingGradient() const { return grad_incoming_; }
  const torch::Tensor& fullGradient() const { return grad_full_; }
  size_t gradientBufferBytes() const;  // full gradient + incoming shard

  // Replicated gradients (stage 0-1): the whole gradient lives in `buffer` from now on (memory
  // the ranks may share), each parameter's gradient a tensor over its place in it.
  void placeGradientsIn(torch::Tensor buffer);
  const std::vector<torch::Tensor>& gradPlaces() const { return grad_places_; }
  // Replicated gradients: parameter `index`'s place holds its gradient (copied in, or zeros when
  // it has none) without param.grad() moving there yet (takeGradient does both); then
  // pointGradientAtPlace makes param.grad() the place. DDP's find_unused_parameters leaves a
  // parameter no rank used as it was by skipping the second.
  void fillGradientPlace(size_t index);
  void pointGradientAtPlace(size_t index);

  // ---- what the strategy keeps per unit -----------------------------------------------------
  // The fp32 shard the optimizer steps: a view of the flat buffer below stage 3 in fp32, its
  // own memory under stage 3 or mixed precision (the flat buffer holds compute copies).
  torch::Tensor master;
  torch::Tensor grad_shard;    // this rank's fp32 gradient (stage 1 fp32: a view of the buffer)
  torch::Tensor device_shard;  // cpu offload of the optimizer only, a unit at rest sharded: its
                               // shard on the device in the compute dtype, the gathers' input
  size_t optimizer_shard = 0;
  bool routed = false;  // runs through unitForward: resharded between uses (stage 3)

 private:
  std::string name_;
  const torch::nn::Module* module_;
  FlatParameter flat_;
  State state_ = State::kUnsharded;
  WorkPtr gather_, reduce_;
  torch::Tensor gather_input_;              // what the gather in flight reads
  torch::Tensor grad_full_;                 // padded, compute dtype
  torch::Tensor grad_incoming_;             // a reduce-scatter's output until it is consumed
  std::vector<torch::Tensor> grad_places_;  // replicated gradients: each parameter's place
  bool replicated_gradients_ = false;
  bool full_gradient_lent_ = false;  // grad_full_ is useLentGradientBuffer's
};

}  // namespace cxxlaunch::runtime
