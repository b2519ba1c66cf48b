#pragma once
// Frozen parameters (requires_grad false: a LoRA run's base weights) in the data-parallel engine
// (strategy/sharded.h). The unit plan leaves them out of every unit (strategy/unit_plan.h): no
// flat buffer, no fp32 master, no gradient, no optimizer state, whole on every rank. No step
// ever updates them, so an fp32 copy would serve nothing: under mixed precision they are held
// in the compute dtype only, as the units' compute copies are, cast once at prepare; loadModel
// reads into them casting to that dtype and saveModel exports them from there.
//
// Thread-safety: the training thread, at prepare.

#include <torch/nn/module.h>
#include <torch/types.h>

namespace cxxlaunch::runtime {

// A model built under a DeferredInit (deferred_init.h) gets its values here: every frozen
// parameter, and the trainable ones too when `trainable` (below ZeRO-3; at stage 3 they are
// made unit by unit). Then each frozen parameter is held in `frozen_dtype` (the compute dtype;
// float32 leaves them as they are), one at a time, a deferred one made straight into it: the
// model is never held twice, nor its frozen part in float32 as a whole.
void materializeParameters(torch::nn::Module& model, bool trainable, c10::ScalarType frozen_dtype);

}  // namespace cxxlaunch::runtime
