#pragma once
// ShardedStrategy: ZeRO stages 0-3 and FSDP's FULL_SHARD / SHARD_GRAD_OP as one engine with one
// sharding algebra, so every mode reduces with the same numerics:
//
//   stage 0 (ddp, fsdp_no_shard)         nothing sharded: gradients all-reduced. In the model's
//                                        own precision with nothing offloaded (DDP), the units
//                                        flatten only the gradients and the trainer's optimizer
//                                        steps the parameters where they are
//                                        (replicated_parameters.h, trainer_optimizer); with mixed
//                                        precision or cpu offload every rank steps fp32 master
//                                        weights of everything (DeepSpeed's bf16 at stage 0).
//   stage 1 (zero1)                      optimizer state sharded. Gradients all-reduced (as DDP,
//                                        noSync while accumulating); each rank steps its shard of
//                                        every unit; parameters all-gathered after the step.
//   stage 2 (zero2, fsdp_shard_grad_op)  + gradients sharded: a unit's gradient is
//                                        reduce-scattered as soon as backward completes it (every
//                                        micro-step, into an accumulating shard) and the full
//                                        gradient freed; at most two reductions in flight.
//   stage 3 (zero3, fsdp_full_shard)     + parameters sharded at rest. A unit run through
//                                        unitForward (strategy/unit.h) is gathered just before
//                                        its forward, freed after it, gathered again by a hook on
//                                        its output before its backward (the next unit in
//                                        backward order prefetched), freed when its gradients
//                                        are complete. Parameters outside such units stay whole,
//                                        as FSDP's root unit.
//
// Units: planUnits (strategy/unit_plan.h) chooses them from the wrap policy: at stage 3 the
// modules it names, the remaining parameters (below stage 3: all of them) in buckets of
// bucket_bytes, in reverse registration order as DDP's. Each is a ShardUnit
// (strategy/shard_unit.h: one FlatParameter, its master and gradient buffers, an explicit
// sharded / gathering / unsharded state and a training state, its pre/post forward and backward
// steps) and one shard of the optimizer (optim/shard_optimizer.h). This class is the scheduler
// of the units: when each is gathered, released, reduced and stepped, in what order. What a
// stage means (shard the optimizer, the gradients, reshard after forward; where the fp32 shards
// rest) it asks a ShardingPolicy (strategy/sharding_policy.h), made once from these options;
// where the shards rest (device, host, nvme files) is the ShardStore's (strategy/shard_store.h).
//
// Collectives run in one order on every rank: gradient reductions in a fixed unit order (a unit
// that completes early waits for the ones before it), gathers in forward order and in the
// reverse of it in backward.
//
// Thread-safety: one training thread; hooks from autograd's threads are serialised.

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/optim/shard_optimizer.h"
#include "runtime/strategy/forward_order.h"
#include "runtime/strategy/gradient_readiness.h"
#include "runtime/strategy/replicated_parameters.h"
#include "runtime/strategy/shard_store.h"
#include "runtime/strategy/shard_unit.h"
#include "runtime/strategy/sharding_policy.h"
#include "runtime/strategy/shared_gradients.h"
#include "runtime/strategy/strategy.h"
#include "runtime/strategy/unit_registry.h"

namespace cxxlaunch::runtime {

struct ShardingOptions {
  int stage = 3;  // 0, 1, 2 or 3
  std::string name = "zero3";
  // Which modules are units at stage 3 (unit_plan.h); below it, buckets of bucket_bytes only.
  WrapPolicy wrap_policy = WrapPolicy::kNone;
  std::vector<std::string> unit_types;            // TRANSFORMER_BASED_WRAP's module type names
  int64_t min_num_params = 100000000;             // SIZE_BASED_WRAP
  std::vector<const torch::nn::Module*> wrapped;  // units whatever the policy
  BackwardPrefetch backward_prefetch = BackwardPrefetch::kPre;
  bool forward_prefetch = false;
  bool sync_module_states = true;
  size_t bucket_bytes = 25u << 20;
  // HYBRID_SHARD: shards within each node (the ranks with this `node`), replicas across nodes:
  // gradients reduce-scattered in the node, then all-reduced among the nodes' same shards.
  bool hybrid = false;
  int node = 0;
  // What the model computes in and gradients are reduced in; the master shard stays float32.
  torch::ScalarType compute_dtype = torch::kFloat;
  // nvme offload (ZeRO-Infinity): the optimizer state (any stage), the fp32 gradient shards
  // (stage 2-3, with the optimizer's) and the fp32 master shards (stage 3) rest in swap files in
  // these directories, streamed through memory at each step in pieces of a fixed size, with the
  // next piece's reads and the previous one's writes overlapping the update
  // (NvmeStore, strategy/shard_store.h). Empty: in memory.
  std::string nvme_optimizer_dir, nvme_param_dir;
  // cpu offload (DeepSpeed's offload_optimizer / offload_param device cpu, FSDP's CPUOffload),
  // for GPU runs: the fp32 master shards, the fp32 gradient shards and the optimizer state live
  // in host memory (pinned when the model is on a GPU) and the optimizer steps there, on the CPU
  // kernels; gradient shards come down from the device, updated parameters go up. Stage 3 with
  // `offload_params_to_host` keeps nothing of a unit on the device at rest (each gather copies
  // its shard up); without it the device keeps the shard in the compute dtype for the gathers.
  // Not tied to the device: on a CPU model it runs the same copies within host memory.
  bool offload_to_host = false;
  bool offload_params_to_host = false;
  // Stage 2-3: zeroGrad frees the fp32 gradient shards and the first reduction of the next
  // backward makes them again (PyTorch's zero_grad(set_to_none=True)), so the forward's
  // activations can use that memory: 4 bytes a parameter per rank off the peak. On for GPU
  // runs, where LibTorch's caching allocator makes it free; off on CPU, where each step would
  // fault the pages in anew (flat/buffer_pool.h says what that costs).
  bool free_gradients_between_steps = false;
  // Stage 0 in the model's own dtype, nothing offloaded (DDP): no master copy; the trainer's
  // torch::optim optimizer steps the parameters in their own storage, gradients are views of the
  // units' buffers, and the checkpoint holds one view per parameter (replicated_parameters.h).
  bool trainer_optimizer = false;
  // With trainer_optimizer: one more small all-reduce per step tells which parameters no rank
  // used in the backward; their gradients stay as they were (undefined after zeroGrad), so the
  // optimizer skips them, as PyTorch's DDP does. Without it they get a zero gradient.
  bool find_unused_parameters = false;
};

class ShardedStrategy final : public Strategy, public UnitHooks {
 public:
  ShardedStrategy(std::shared_ptr<Backend> backend, std::shared_ptr<torch::nn::Module> model,
                  torch::optim::Optimizer& optimizer, ShardingOptions options);
  ~ShardedStrategy() override;
  ShardedStrategy(const ShardedStrategy&) = delete;
  ShardedStrategy& operator=(const ShardedStrategy&) = delete;

  std::string describe() const override;
  void beforeBackward(bool sync) override;
  void afterBackward(bool sync) override;
  double clipGradNorm(double max_norm) override;
  bool unscaleGradients(double factor) override;
  void step() override;
  void zeroGrad() override;
  MemoryReport memoryReport() const override;
  std::vector<const torch::nn::Module*> unitModules() const override;
  StateStream stateStream(StateDictType type, bool with_frozen) override;
  StateCounters stateCounters(int64_t optimizer_steps) override;
  void fillState(StateSource& source) override;
  void visitFullParameters(const ParameterVisitor& visit) override;

  void beforeForward(const torch::nn::Module& unit) override;
  torch::Tensor afterForward(const torch::nn::Module& unit, torch::Tensor output) override;

  // The units, for tests and logs: name and number of parameter elements.
  std::vector<std::pair<std::string, int64_t>> units() const;
  // How many full gradients were lent memory the ranks share (ZeRO-2 on one host), for tests.
  size_t sharedGradientLends() const { return shared_grads_ ? shared_grads_->lends() : 0; }

 private:
  void buildUnits();
  // Per size of the units' buffers, as many kept as the schedule uses at once (flat/buffer_pool.h).
  void sizePool();
  void onGradientReady(size_t unit, size_t param);  // autograd's hook
  void markReady(size_t unit, size_t param);        // under mu_
  void preBackward(size_t unit);                    // hook on a unit's output gradient
  void launchReady();                               // reductions, in order
  void completeOldestReduction();                   // sharded gradients
  void finishReplicatedBackward();                  // trainer_optimizer
  void unitGradientsDone(size_t unit);              // release, BACKWARD_POST prefetch
  bool mixed() const { return options_.compute_dtype != torch::kFloat; }
  // After a unit came to rest sharded (ShardUnit::rest and its like returned true): its
  // optimizer state, and the hint for a trainer that uses its freed parameters.
  void rested(size_t unit);
  void release(size_t unit) {  // a unit in use back to rest
    if (units_[unit].rest(ctx_)) rested(unit);
  }
  // After the first step: one warning naming the units the policy chose that never ran through
  // unitForward (whole at rest on every rank), on rank 0.
  void warnOfUnitsNeverRouted();
  size_t unitOf(const torch::nn::Module& module) const;

  void connectHybridGroups();
  void settle(size_t unit);  // built: to the state it rests in
  // This rank's shards, read from nvme one unit at a time; every parameter whole on rank 0,
  // gathered one unit at a time. Frozen parameters on rank 0 with `with_frozen`.
  StateStream shardedStream(bool with_frozen);
  StateStream gatheredStream(bool with_frozen);
  void publish(
      ShardUnit& unit);  // the master's values into the parameters (gathered), after a load

  std::shared_ptr<Backend> backend_;   // every rank
  std::shared_ptr<Backend> shards_;    // the ranks the parameters are sharded over (hybrid: a node)
  std::shared_ptr<Backend> replicas_;  // hybrid, several nodes: this shard on every node
  std::shared_ptr<torch::nn::Module> model_;
  bool warned_never_routed_ = false;
  ShardingOptions options_;
  c10::Device device_;  // the model's
  ShardingPolicy policy_;
  std::unique_ptr<ShardOptimizer> optimizer_;  // the fp32 shards' (none: trainer_optimizer)
  // trainer_optimizer: the trainer's optimizer on whole parameters, and which parameters got a
  // gradient on this rank in this backward (find_unused_parameters), unit by unit.
  std::unique_ptr<ReplicatedParameters> replicated_;
  std::vector<size_t> first_param_;  // unit u's parameters are used_[first_param_[u]] ...
  std::vector<int32_t> used_;
  bool gradients_shared_ = false;  // the stage 0-1 gradient buffers live in shared memory
  std::vector<ShardUnit> units_;
  std::unique_ptr<ShardStore> store_;  // where the units' fp32 shards rest
  // The hooks, which gradients are in, which unit's reduction launches next (in plan order).
  std::unique_ptr<GradientReadiness> readiness_;
  std::deque<size_t> in_flight_;  // sharded gradients' reductions not yet added to the shards
  std::map<const torch::nn::Module*, size_t> unit_of_module_;
  ForwardOrder order_;
  bool sync_ = true;  // this backward synchronises (not a noSync micro-step)
  // ZeRO-3 on CPU: the units' gathered buffers and gradients, reused (flat/buffer_pool.h).
  std::unique_ptr<BufferPool> pool_;
  UnitContext ctx_;  // what the units' steps use: the groups, the store, the pool, the policy
  // ZeRO-2 on one host: full gradients in memory the ranks share (shared_gradients.h).
  std::unique_ptr<SharedGradients> shared_grads_;
  // Parameters without gradients: whole, never sharded, in the compute dtype
  // (strategy/frozen_parameters.h).
  std::vector<torch::Tensor> frozen_;
  std::vector<const torch::nn::Module*> policy_modules_;  // UnitPlan::policy_modules
  std::mutex mu_;
};

}  // namespace cxxlaunch::runtime
