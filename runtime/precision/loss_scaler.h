#pragma once
// LossScaler: fp16's dynamic loss scaling, as DeepSpeed's DynamicLossScaler and PyTorch's
// GradScaler. The loss is multiplied by scale() before backward, so small gradients survive
// half precision; the gradients are divided by it before the step. A step whose gradients hold an
// inf or NaN anywhere (on any rank) is skipped on every rank; update(true) then counts one
// overflow: after `hysteresis` consecutive overflows the scale is multiplied by backoff_factor
// (never below min_scale). After growth_interval steps without overflow it is multiplied by
// growth_factor and the hysteresis restored.
//
// Thread-safety: none; the training thread owns it.

#include <cstdint>
#include <string>

#include "runtime/env.h"

namespace cxxlaunch::runtime {

class LossScaler {
 public:
  // Throws InvalidArgument for options that cannot work (a scale <= 0, a growth factor <= 1...).
  explicit LossScaler(LossScalerOptions options = {});

  double scale() const { return scale_; }
  // After each optimizer step's overflow check: `overflow` is whether any gradient was not finite.
  void update(bool overflow);
  int64_t skippedSteps() const { return skipped_; }

  // Checkpoints: the whole state as text, and back. restore throws InvalidArgument for text
  // that is not a scaler's state.
  std::string save() const;
  void restore(const std::string& state);

 private:
  LossScalerOptions options_;
  double scale_;
  int hysteresis_left_;
  int64_t good_steps_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace cxxlaunch::runtime
