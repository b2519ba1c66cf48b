#include <cmath>

#include "common/error.h"
#include "runtime/accelerator.h"

namespace cxxlaunch::runtime {

LrScheduler::LrScheduler(torch::optim::Optimizer& optimizer, Kind kind, int64_t warmup_steps,
                         int64_t total_steps)
    : optimizer_(optimizer), kind_(kind), warmup_(warmup_steps), total_(total_steps) {
  if (warmup_ < 0 || total_ < 1 || warmup_ > total_) {
    throw InvalidArgument("lr schedule: need 0 <= warmup_steps (" + std::to_string(warmup_) +
                          ") <= total_steps (" + std::to_string(total_) + ") and total >= 1");
  }
  for (auto& group : optimizer_.param_groups()) base_lrs_.push_back(group.options().get_lr());
  apply();
}

LrScheduler::Kind LrScheduler::parse(const std::string& name) {
  if (name == "constant") return Kind::kConstant;
  if (name == "linear") return Kind::kLinear;
  if (name == "cosine") return Kind::kCosine;
  throw InvalidArgument("lr schedule '" + name + "' is not constant, linear or cosine");
}

double LrScheduler::factor() const {
  // As transformers' get_*_schedule_with_warmup: lr 0 at step 0, the base lr at the end of the
  // warmup, then the decay over the remaining steps.
  if (step_ < warmup_) return static_cast<double>(step_) / static_cast<double>(warmup_);
  const double progress = static_cast<double>(step_ - warmup_) /
                          static_cast<double>(std::max<int64_t>(1, total_ - warmup_));
  const double p = std::min(progress, 1.0);
  switch (kind_) {
    case Kind::kConstant:
      return 1.0;
    case Kind::kLinear:
      return 1.0 - p;
    case Kind::kCosine:
      return 0.5 * (1.0 + std::cos(M_PI * p));
  }
  return 1.0;
}

void LrScheduler::step() {
  ++step_;
  apply();
}

void LrScheduler::setStepCount(int64_t steps) {
  if (steps < 0) throw InvalidArgument("a schedule's step count cannot be negative");
  step_ = steps;
  apply();
}

void LrScheduler::apply() {
  const double f = factor();
  auto& groups = optimizer_.param_groups();
  for (size_t i = 0; i < groups.size() && i < base_lrs_.size(); ++i) {
    groups[i].options().set_lr(base_lrs_[i] * f);
  }
}

}  // namespace cxxlaunch::runtime
