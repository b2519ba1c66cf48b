#pragma once
// CPU loops of the shard optimizers and of mixed precision over contiguous float32 arrays: one
// pass over memory each, the per-element math of kernels/element_math.h. Built at -O3 with AVX2
// and AVX-512 clones so they vectorise on whatever CPU runs them. Callers split large arrays
// across threads (at::parallel_for); each call here is single-threaded. Internal to runtime/.

#include <cstdint>

#include "runtime/kernels/element_math.h"

namespace cxxlaunch::runtime::kernels {

// Adam/AdamW: param, exp_avg and exp_avg_sq updated in place, n elements.
void adamStep(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
              const AdamScalars& s);

// SGD; momentum_buffer may be null when s.momentum == 0.
void sgdStep(float* param, const float* grad, float* momentum_buffer, int64_t n,
             const SgdScalars& s);

// Sum of x[i]^2, accumulated in double (the global gradient norm's partial sum).
double sumOfSquares(const float* x, int64_t n);

// x[i] *= factor (clipping, unscaling).
void scaleInPlace(float* x, int64_t n, float factor);

// Whether no element is inf or NaN (the fp16 loss scaler's overflow check).
bool allFinite(const float* x, int64_t n);

// Cast-copies between the float32 master weights and bfloat16 compute copies (raw bits), rounded
// to nearest even as LibTorch's .to(kBFloat16).
void castFloatToBFloat16(const float* from, uint16_t* to, int64_t n);
void castBFloat16ToFloat(const uint16_t* from, float* to, int64_t n);

// The same for IEEE half (fp16) compute copies (raw bits).
void castFloatToHalf(const float* from, uint16_t* to, int64_t n);
void castHalfToFloat(const uint16_t* from, float* to, int64_t n);

}  // namespace cxxlaunch::runtime::kernels
