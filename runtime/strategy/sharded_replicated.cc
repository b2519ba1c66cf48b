// ShardedStrategy under DDP (ShardingOptions::trainer_optimizer): the end of a synchronised
// backward, with find_unused_parameters' semantics. The rest of the engine is shared with the
// other stages (sharded.cc).

#include "runtime/strategy/sharded.h"

namespace cxxlaunch::runtime {

// DDP's finish, as PyTorch's reducer does it:
//   1. the parameters this backward did not reach (unused in this forward, or accumulated in
//      noSync steps only) have their places filled (what they accumulated, or zeros) without
//      their .grad moving there yet, and the last reductions launch, so that no rank waits for
//      one another rank never starts;
//   2. with find_unused_parameters, an all-reduce (max) of which parameters each rank used;
//   3. once every reduction is in, each param.grad() is the average in place, but a parameter
//      no rank used keeps its gradient as it was (undefined after zeroGrad).
void ShardedStrategy::finishReplicatedBackward() {
  for (const auto& [unit, param] : readiness_->pending()) {
    readiness_->markReady(unit, param);
    units_[unit].fillGradientPlace(param);
  }
  launchReady();
  WorkPtr used;
  if (options_.find_unused_parameters) {
    used = backend_->allreduce(used_.data(), used_.size(), DType::kInt32, ReduceOp::kMax);
  }
  for (auto& u : units_) u.finishReduction(ctx_);
  if (used) used->wait();
  for (size_t ui = 0; ui < units_.size(); ++ui) {
    for (size_t i = 0; i < units_[ui].flat().params().size(); ++i) {
      int32_t& mark = used_[first_param_[ui] + i];
      if (mark != 0) units_[ui].pointGradientAtPlace(i);
      mark = options_.find_unused_parameters ? 0 : 1;
    }
  }
  readiness_->reset();
}

}  // namespace cxxlaunch::runtime
