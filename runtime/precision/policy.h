#pragma once
// Mixed precision (`mixed_precision: bf16 | fp16`), after accelerate and FSDP's MixedPrecision:
//
//   - The trainer's forward runs under autocast on the training thread from prepare() on, so
//     matmuls, linear layers and convolutions compute in the low precision whatever the dtype of
//     the inputs the trainer passes (accelerate wraps model.forward in autocast; LibTorch has no
//     forward to wrap, so the thread's autocast state is what carries it).
//   - DDP keeps float32 parameters and gradients (accelerate's DDP + autocast).
//   - Sharded strategies keep float32 master weights in each rank's shard only; the parameters
//     the model computes with are low-precision copies, gathered in the low precision (half the
//     bytes), and gradients are reduced in it (FSDP's param_dtype = reduce_dtype).
//   - fp16 adds dynamic loss scaling (precision/loss_scaler.h).
//
// Thread-safety: AutocastScope changes the calling thread's state only.

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <string>

#include "runtime/env.h"

namespace cxxlaunch::runtime {

// From CXXLAUNCH_MIXED_PRECISION's values. Throws InvalidArgument for fp16 on a CPU device
// (LibTorch has no half-precision matmul on CPU) and for unknown names.
PrecisionPolicy precisionPolicy(const std::string& mixed_precision, c10::DeviceType device);

// The calling thread's autocast state for `device`.
bool autocastEnabled(c10::DeviceType device);
c10::ScalarType autocastDtype(c10::DeviceType device);

// Sets the calling thread's autocast for `device` (enabled, in `dtype`, cast cache off: weights
// change in place at every step, so a cached cast would go stale) and restores the previous
// state when it ends. A disabled scope turns autocast off, e.g. around backward.
class AutocastScope {
 public:
  AutocastScope(c10::DeviceType device, c10::ScalarType dtype, bool enabled);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  c10::DeviceType device_;
  bool was_enabled_, cache_was_enabled_;
  c10::ScalarType previous_dtype_;
};

}  // namespace cxxlaunch::runtime
