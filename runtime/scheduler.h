#pragma once
// Learning-rate schedules with warmup, stepped once per optimizer step (not per micro-step):
// constant, linear decay to zero, and cosine decay to zero, each after `warmup_steps` of linear
// warmup from zero — the formulas of transformers' get_{constant,linear,cosine}_schedule_with_
// warmup. Scales the lr each parameter group had at construction.

#include <torch/optim/optimizer.h>

#include <string>
#include <vector>

namespace cxxlaunch::runtime {

class LrScheduler {
 public:
  enum class Kind { kConstant, kLinear, kCosine };
  // Throws InvalidArgument for negative steps or warmup beyond the total.
  LrScheduler(torch::optim::Optimizer& optimizer, Kind kind, int64_t warmup_steps,
              int64_t total_steps);

  // "constant", "linear", "cosine".
  static Kind parse(const std::string& name);

  void step();            // after each optimizer step
  double factor() const;  // of the base lr, at the current step
  int64_t stepCount() const { return step_; }
  int64_t totalSteps() const { return total_; }
  void setStepCount(int64_t steps);  // a resumed run's; sets the lr for it

 private:
  void apply();

  torch::optim::Optimizer& optimizer_;
  Kind kind_;
  int64_t warmup_;
  int64_t total_;
  int64_t step_ = 0;
  std::vector<double> base_lrs_;
};

}  // namespace cxxlaunch::runtime
