#pragma once
// CUDA kernels of the shard optimizers and of mixed precision, on contiguous device arrays: the
// same operations as kernels/cpu/optimizers.h, with the same per-element math
// (kernels/element_math.h), so each result equals the CPU loop's bit for bit (the kernels are
// compiled without FMA contraction, with IEEE sqrt and division, as the CPU loops are).
//
// Every function queues its work on `stream` and returns at once, unless it says it waits. Bad
// arguments (negative counts) throw InvalidArgument; a failed CUDA call throws CudaError naming
// it; a fault inside a kernel surfaces at the next call that waits on the stream. Pointers are
// device pointers; arrays of one call must not overlap (except where noted). Calls on different
// streams may come from different threads; one call's scratch memory is its own.

#include <cstdint>

#include "runtime/kernels/cuda/device.h"
#include "runtime/kernels/element_math.h"

namespace cxxlaunch::runtime::kernels::cuda {

// Adam/AdamW: param, exp_avg and exp_avg_sq updated in place, n elements.
void adamStep(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
              const AdamScalars& s, Stream stream);

// SGD; momentum_buffer may be null when s.momentum == 0.
void sgdStep(float* param, const float* grad, float* momentum_buffer, int64_t n,
             const SgdScalars& s, Stream stream);

// Sum of x[i]^2 in double (the global gradient norm's partial sum), run-to-run deterministic
// (no atomics: per-block partials, then one block adds them in a fixed order).
// `result` points at kSumOfSquaresScratch doubles of device memory: result[0] receives the sum
// (or has it added, with accumulate = true, so one result covers several buffers queued on the
// same stream); the rest is scratch that the call overwrites.
constexpr int64_t kSumOfSquaresScratch = 1 + 1024;
void sumOfSquares(const float* x, int64_t n, double* result, bool accumulate, Stream stream);

// Waits for `stream`, then returns *device_value (e.g. a sumOfSquares result).
double readDouble(const double* device_value, Stream stream);

// x[i] *= factor (clipping).
void scaleInPlace(float* x, int64_t n, float factor, Stream stream);

// The fp16 loss scaler's overflow check: sets *found_nonfinite to 1 when any x[i] is inf or NaN.
// The flag is only ever set, never cleared, so one flag covers many buffers: clear it with
// clearFlag before the first, read it with readFlag after the last.
void checkFinite(const float* x, int64_t n, int32_t* found_nonfinite, Stream stream);

// The unscale fused with the check, in one pass: x[i] *= inv_scale (1 / loss_scale) and
// *found_nonfinite = 1 when any x[i] was inf or NaN before scaling.
void unscaleAndCheckFinite(float* x, int64_t n, float inv_scale, int32_t* found_nonfinite,
                           Stream stream);

void clearFlag(int32_t* flag, Stream stream);
// Waits for `stream`, then returns whether *flag is set.
bool readFlag(const int32_t* flag, Stream stream);

// Cast-copies between float32 master weights and bfloat16 / IEEE half compute copies (raw bits),
// rounded to nearest even as LibTorch's .to(kBFloat16 / kHalf) on the CPU.
void castFloatToBFloat16(const float* from, uint16_t* to, int64_t n, Stream stream);
void castBFloat16ToFloat(const uint16_t* from, float* to, int64_t n, Stream stream);
void castFloatToHalf(const float* from, uint16_t* to, int64_t n, Stream stream);
void castHalfToFloat(const uint16_t* from, float* to, int64_t n, Stream stream);

}  // namespace cxxlaunch::runtime::kernels::cuda
