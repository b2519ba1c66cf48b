#pragma once
// Strategy: how the ranks of a job share one model's training. The Accelerator drives exactly
// one; which one comes from the launcher's settings (CXXLAUNCH_STRATEGY), never from the trainer,
// so one trainer binary runs every mode:
//
//   ddp                    every rank holds everything; gradients all-reduced (stage 0 of
//                          strategy/sharded.h, the one data-parallel engine)
//   zero1                  + optimizer state sharded: each rank steps its 1/N of the parameters
//   zero2, fsdp_shard_grad_op
//                          + gradients reduce-scattered as backward produces them
//   zero3, fsdp_full_shard + parameters sharded at rest, gathered just in time (strategy/unit.h)
//   fsdp_no_shard          DDP by another name
//
// A micro-step is beforeBackward(sync), loss.backward(), afterBackward(sync); an optimizer step
// is clipGradNorm (optional), step(), zeroGrad(). `sync` is false for the micro-steps of an
// accumulation cycle but its last.
//
// Thread-safety: one training thread; autograd may run a strategy's hooks on its own threads.

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/comm/backend.h"
#include "runtime/env.h"
#include "runtime/precision/policy.h"
#include "runtime/reports.h"
#include "runtime/state_view.h"

namespace cxxlaunch::runtime {

class Strategy {
 public:
  virtual ~Strategy() = default;
  // "zero3: 5 units, 2 ranks", for the trainer's first line.
  virtual std::string describe() const = 0;

  virtual void beforeBackward(bool sync) = 0;
  // After loss.backward(): this micro-step's gradient communication is complete on return.
  virtual void afterBackward(bool sync) = 0;

  // The L2 norm of the whole model's gradient, over every rank's share (a collective when
  // gradients are sharded). With max_norm > 0 gradients are scaled by max_norm / (norm + 1e-6)
  // when that is below 1, as torch::nn::utils::clip_grad_norm_ does. Returns the norm before.
  virtual double clipGradNorm(double max_norm) = 0;
  // Loss scaling: multiplies every gradient by `factor` (1 / the loss scale) and returns whether
  // all of them are finite on every rank (a collective when gradients are sharded), so that
  // every rank skips an overflowing step alike.
  virtual bool unscaleGradients(double factor) = 0;
  // The optimizer step on what this rank owns; parameters are up to date everywhere after it
  // (gathered again, or left sharded to be gathered at their next forward).
  virtual void step() = 0;
  virtual void zeroGrad() = 0;

  virtual MemoryReport memoryReport() const = 0;

  // The modules the wrap policy names (unit_plan.h): the shard units under ZeRO-3 /
  // FULL_SHARD, the same modules at every stage; what fsdp_activation_checkpointing recomputes.
  virtual std::vector<const torch::nn::Module*> unitModules() const { return {}; }

  // For exports (saveModel). A collective: `visit` sees every parameter, whole and in fp32 (a
  // frozen one in the dtype it is held in: the compute dtype under mixed precision), by its
  // name in the module (gathered from the shards where they are sharded, one unit at a time, so
  // memory grows by one unit), on every rank. The tensors are valid during the call only.
  using ParameterVisitor = std::function<void(const std::string&, const torch::Tensor&)>;
  virtual void visitFullParameters(const ParameterVisitor& visit) = 0;
  // The same, collected into fresh float32 tensors in host memory: every parameter, or those
  // whose names `keep` takes (an adapter export keeps its few: no copy of a frozen base).
  using NameFilter = std::function<bool(const std::string&)>;
  std::vector<std::pair<std::string, torch::Tensor>> fullParameters(const NameFilter& keep = {});

  // The state this rank holds (state_view.h), for checkpoint/ to save: the fp32 parameters
  // (array "param") and the optimizer state (its arrays by name), as views of parameters by name,
  // in the layout `type` asks for: each rank its own views (every element in exactly one rank's,
  // whatever the strategy), or every parameter whole on rank 0, gathered one unit and one array
  // at a time where it is sharded. Frozen parameters (requires_grad false: whole on every rank,
  // no optimizer state) are in it as float32 "param" arrays on rank 0, unless `with_frozen` is
  // false (a LoRA run's checkpoint names its base instead). Not a collective itself; a full
  // stream's produce() is.
  virtual StateStream stateStream(StateDictType type, bool with_frozen) = 0;
  // Counters to save beside the state, the same on every rank: under DDP, the step count of each
  // parameter torch stepped less often than the job (`optimizer_steps`), so that it resumes with
  // its own.
  virtual StateCounters stateCounters(int64_t /*optimizer_steps*/) { return {}; }
  // Fills parameters and optimizer state from `source`, saved by any strategy at any world size
  // (state arrays it lacks start at zero); a collective. The optimizer's step count comes from
  // the counter "optimizer_steps". A parameter the source lacks keeps its values (a LoRA
  // checkpoint's frozen base, loaded before by loadModel; the adapters a base model's export
  // has not); the caller checks that this is meant.
  virtual void fillState(StateSource& source) = 0;
};

// What makeStrategy needs beyond the environment.
struct StrategyOptions {
  size_t bucket_bytes = 25u << 20;  // DDP buckets; ZeRO-1/2 units when no module is a unit
  bool find_unused_parameters = false;
  // Modules the trainer marked with Accelerator::wrap(): shard units whatever the wrap policy.
  std::vector<const torch::nn::Module*> wrapped;
  PrecisionPolicy precision;  // sharded strategies: compute copies in precision.compute
};

// The strategy `env.strategy` names, over `model` (made equal on every rank first) and the
// optimizer the trainer built. Throws InvalidArgument for what cannot run (an optimizer a
// sharded strategy cannot shard, a unit name that matches no module, models that differ
// across ranks), naming what to change.
std::unique_ptr<Strategy> makeStrategy(const WorkerEnv& env, std::shared_ptr<Backend> backend,
                                       std::shared_ptr<torch::nn::Module> model,
                                       torch::optim::Optimizer& optimizer,
                                       const StrategyOptions& options);

}  // namespace cxxlaunch::runtime
