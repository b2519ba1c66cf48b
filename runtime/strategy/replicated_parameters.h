#pragma once
// ReplicatedParameters: DDP's side of the state in the data-parallel engine (sharded.h at stage
// 0 with ShardingOptions::trainer_optimizer): whole parameters every rank holds alike, in the
// model's own tensors, stepped by the trainer's own torch::optim optimizer with torch's
// per-parameter state, as PyTorch's DDP leaves the step to the trainer. Any optimizer steps
// (LBFGS and one's own too); saveState takes the state of AdamW, Adam, SGD, RMSprop and Adagrad.
//
// The gradients it reads are the engine's: after the all-reduce, each param.grad() is the
// average, a tensor over the parameter's place in its unit's gradient buffer. Every rank holds
// the same, so norms and finiteness checks are local, and the checkpoint views are one view per
// parameter (its "param" array and its optimizer state by torch's names), each parameter given
// to one rank to write: the format DDP has always saved.
//
// Thread-safety: one training thread.

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/reports.h"
#include "runtime/state_view.h"

namespace cxxlaunch::runtime {

class ReplicatedParameters {
 public:
  using ParameterVisitor = std::function<void(const std::string&, const torch::Tensor&)>;

  // Moves each large float32 parameter onto memory aligned for direct reads (a load reads into
  // it past the page cache) and makes Adam's state now, as prepare always has.
  ReplicatedParameters(std::shared_ptr<torch::nn::Module> model, torch::optim::Optimizer& optimizer,
                       int rank, int world);

  double clipGradNorm(double max_norm);
  bool unscaleGradients(double factor);
  void step() { optimizer_.step(); }
  void zeroGrad() { optimizer_.zero_grad(); }
  // Parameters, their gradients and the optimizer's state.
  void report(MemoryReport& out) const;
  void visitFullParameters(const ParameterVisitor& visit);

  // Strategy's contract (strategy.h).
  StateStream stateStream(StateDictType type, bool with_frozen);
  StateCounters stateCounters(int64_t optimizer_steps);
  void fillState(StateSource& source);

 private:
  std::vector<int> ownersOf(int ranks) const;
  std::vector<StateView> viewsOf(int rank, int ranks, bool with_frozen);

  std::shared_ptr<torch::nn::Module> model_;
  torch::optim::Optimizer& optimizer_;
  int rank_, world_;
};

}  // namespace cxxlaunch::runtime
