#pragma once
// ShardUnit: one unit of the data-parallel engine (strategy/sharded.h), as FSDP2's FSDPParamGroup:
// the unit's parameters flattened into one buffer (flat/flat_param.h), this rank's fp32 master
// shard, its gradient buffers, and the steps of its lifecycle. The strategy decides when (forward
// order, prefetch, reduction order); the unit does what each step means under the engine's
// ShardingPolicy, and keeps every piece of its state private.
//
// Parameters, an explicit state:
//   kUnsharded  the flat buffer is resident and holds every parameter (the rest state unless the
//               policy reshards after forward, and of such a unit between its gather and its
//               release);
//   kGathering  an all-gather is writing the buffer (a prefetch); waitUnsharded() completes it;
//   kSharded    the buffer is freed: the parameters' views stay, without memory; only the master
//               shard remains (where the ShardStore keeps it).
// Training, as FSDP2's TrainingState: kIdle -> preForward -> kForward -> postForward -> kIdle ->
// preBackward -> kPreBackward -> postBackward -> kPostBackward -> rest (end of backward) -> kIdle.
// Gradients: takeGradient() places each parameter's in the unit's full gradient buffer (or, for
// replicated gradients, makes param.grad() its place there); once every one is in (the strategy's
// GradientReadiness counts them) reduceGradients() launches the unit's reduction and
// finishReduction() moves the result where the optimizer reads it.
//
// Thread-safety: none; the strategy calls these on its training thread or under its lock.

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/comm/backend.h"
#include "runtime/flat/flat_param.h"
#include "runtime/strategy/sharding_policy.h"

namespace torch::nn {
class Module;
}

namespace cxxlaunch::runtime {

class ShardStore;

// What every unit's steps use of the engine; the strategy owns it.
struct UnitContext {
  Backend* every = nullptr;     // every rank: replicated gradients are all-reduced over it
  Backend* shards = nullptr;    // the ranks the parameters are sharded over (hybrid: the node)
  Backend* replicas = nullptr;  // hybrid across nodes: this shard on every node; else null
  ShardStore* store = nullptr;  // where the fp32 shards rest
  BufferPool* pool = nullptr;   // gathered buffers and gradients reused, or null
  ShardingPolicy policy;
  torch::ScalarType compute_dtype = torch::kFloat;
};

class ShardUnit {
 public:
  enum class State { kUnsharded, kGathering, kSharded };
  enum class TrainingState { kIdle, kForward, kPreBackward, kPostBackward };

  // The flat parameter comes after: flat() = FlatParameter(...), which moves the parameters.
  ShardUnit(std::string name, const torch::nn::Module* module)
      : name_(std::move(name)), module_(module) {}

  const std::string& name() const { return name_; }
  const torch::nn::Module* module() const { return module_; }  // null for a bucket
  FlatParameter& flat() { return flat_; }
  const FlatParameter& flat() const { return flat_; }
  State state() const { return state_; }
  TrainingState trainingState() const { return training_; }
  // Runs through unitForward (strategy/unit.h): rests sharded between uses when the policy
  // reshards after forward. Set by its first postForward, or from the start by route() for a
  // unit the trainer promised to call so.
  bool routed() const { return routed_; }
  void route() { routed_ = true; }

  // ---- lifecycle: FSDP2's pre/post forward and backward ----------------------------------------
  // Gathered for its forward: a prefetch completed, or a gather now.
  void preForward(const UnitContext& c);
  // Its forward ran: routed from now on, and at rest again (rest()). Returns rest()'s answer.
  bool postForward(const UnitContext& c);
  // Its output's gradient arrived: gathered for its backward.
  void preBackward(const UnitContext& c);
  // Every gradient of the unit is in: backward reads its parameters no more (rest()).
  bool postBackward(const UnitContext& c);
  // Starts the gather of a unit at rest sharded; returns at once.
  void prefetch(const UnitContext& c);
  // Back to its state at rest, training kIdle: sharded when routed and the policy reshards after
  // forward (the device keeping the shard in the compute dtype if the policy says so). Returns
  // whether it rests sharded now.
  bool rest(const UnitContext& c);
  // After the optimizer stepped the master: a unit that rests sharded takes it at its next
  // gather; a whole one copies it into its buffer where it is memory of its own, and (sharded
  // optimizer) all-gathers the other ranks' shards: the work returned, to wait for, or null.
  WorkPtr afterStep(const UnitContext& c);
  // kGathering -> kUnsharded (a gather in flight completed); nothing in the other states.
  void waitUnsharded();
  // Waits for any collective in flight, errors swallowed (destruction).
  void drain() noexcept;

  // ---- gradients --------------------------------------------------------------------------------
  // Autograd produced parameter `index`'s gradient: moved into the full gradient buffer (in the
  // compute dtype), the parameter's .grad left empty. Replicated gradients live instead in their
  // places: the parameter's .grad becomes its place, where autograd then accumulates.
  void takeGradient(size_t index, const UnitContext& c);
  // The unit's reduction: an average all-reduce of the whole gradient in place over every rank
  // (replicated gradients), or a reduce-scatter of it over the shard group.
  void reduceGradients(const UnitContext& c);
  // Waits for the reduction and moves its result where the optimizer reads it: replicated, this
  // rank's part copied into the fp32 gradient shard where that is memory of its own; sharded,
  // averaged over the replicas (hybrid), added into the store's gradient shard (accumulating
  // across micro-steps) and the full gradient and the incoming shard freed.
  void finishReduction(const UnitContext& c);
  // zeroGrad: the replicated buffer zeroed, or the store's shard zeroed (or freed).
  void zeroGradients(const UnitContext& c);
  // Sharded gradients: `zeroed` (padded numel, the compute dtype) is the full gradient buffer
  // until the reduction is finished, which lets it go without giving it to the pool (its owner
  // lent it).
  void useLentGradientBuffer(torch::Tensor zeroed);
  const torch::Tensor& fullGradient() const { return grad_full_; }
  size_t gradientBufferBytes() const;  // full gradient + incoming shard

  // Replicated gradients: the whole gradient lives in `buffer` from now on (memory the ranks may
  // share), each parameter's gradient a tensor over its place in it.
  void placeGradientsIn(torch::Tensor buffer);
  // Replicated gradients: parameter `index`'s place holds its gradient (copied in, or zeros when
  // it has none) without param.grad() moving there yet (takeGradient does both); then
  // pointGradientAtPlace makes param.grad() the place. DDP's find_unused_parameters leaves a
  // parameter no rank used as it was by skipping the second.
  void fillGradientPlace(size_t index);
  void pointGradientAtPlace(size_t index);

  // ---- the fp32 shards, where the ShardStore keeps them in memory ------------------------------
  // The shard the optimizer steps: a view of the flat buffer when the policy needs no memory of
  // its own for it, else its own (the buffer then holds compute copies). Undefined while it
  // rests in a file.
  const torch::Tensor& master() const { return master_; }
  void setMaster(torch::Tensor master) { master_ = std::move(master); }
  // This rank's fp32 gradient (a view of the replicated buffer where it needs no memory of its
  // own); undefined until made (sharded: by the first reduction) or after it was freed.
  const torch::Tensor& gradientShard() const { return grad_shard_; }
  void setGradientShard(torch::Tensor shard) { grad_shard_ = std::move(shard); }
  // The device's copy of the shard in the compute dtype (ShardingPolicy::device_keeps_shard),
  // the gathers' input; undefined until the unit first rests sharded.
  const torch::Tensor& deviceShard() const { return device_shard_; }
  // The unit's shard in the ShardOptimizer.
  size_t optimizerShard() const { return optimizer_shard_; }
  void setOptimizerShard(size_t shard) { optimizer_shard_ = shard; }

 private:
  // kSharded -> kGathering: the buffer's memory back (from the pool when there is one) and an
  // all-gather over the shard group of this rank's shard in the compute dtype, on the device.
  void unshard(const UnitContext& c);
  void gatherNow(const UnitContext& c);  // unshard if sharded, then waitUnsharded
  // Sharded (and true) when routed and the policy reshards after forward; else false.
  bool reshardIfRouted(const UnitContext& c);
  void dropGradientBuffers(BufferPool* pool);

  std::string name_;
  const torch::nn::Module* module_;
  FlatParameter flat_;
  State state_ = State::kUnsharded;
  TrainingState training_ = TrainingState::kIdle;
  bool routed_ = false;
  WorkPtr gather_, reduce_;
  torch::Tensor gather_input_;  // what the gather in flight reads
  torch::Tensor master_, grad_shard_, device_shard_;
  size_t optimizer_shard_ = 0;
  torch::Tensor grad_full_;                 // padded, compute dtype
  torch::Tensor grad_incoming_;             // a reduce-scatter's output until it is consumed
  std::vector<torch::Tensor> grad_places_;  // replicated gradients: each parameter's place
  bool replicated_gradients_ = false;
  bool full_gradient_lent_ = false;  // grad_full_ is useLentGradientBuffer's
};

}  // namespace cxxlaunch::runtime
