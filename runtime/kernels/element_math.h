#pragma once
// The per-element arithmetic of the shard optimizers and the mixed-precision helpers, written
// once for both the CPU loops (kernels/cpu/) and the CUDA kernels (kernels/cuda/): the CPU tests
// cover exactly the arithmetic the GPU runs. Plain C++ (no LibTorch, no CUDA headers); under nvcc
// every function is also a device function.
//
// The order of operations is LibTorch's own (torch::optim::Adam, AdamW and SGD as of 1.13 and
// 2.x), so a shard step matches the optimizer a trainer built to float32 rounding.

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define CXXLAUNCH_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define CXXLAUNCH_HOST_DEVICE inline
#endif

namespace cxxlaunch::runtime::kernels {

// Adam and AdamW in one: Adam adds weight decay to the gradient (l2), AdamW decays the parameter
// (decay = 1 - lr * weight_decay). Bias corrections folded into step_size and
// bias_correction2_sqrt, as LibTorch computes them per step.
struct AdamScalars {
  float decay = 1;  // AdamW: 1 - lr * weight_decay; Adam: 1
  float l2 = 0;     // Adam: weight_decay; AdamW: 0
  float beta1 = 0.9f, beta2 = 0.999f;
  float one_minus_beta1 = 0.1f, one_minus_beta2 = 0.001f;
  float bias_correction2_sqrt = 1;  // sqrt(1 - beta2^step)
  float eps = 1e-8f;
  float step_size = 1e-3f;  // lr / (1 - beta1^step)
};

// Momentum SGD as torch::optim::SGD: d = g + wd*p; buf = first ? d : momentum*buf +
// (1-dampening)*d; d = nesterov ? d + momentum*buf : buf; p -= lr*d. Without momentum: p -= lr*d.
struct SgdScalars {
  float lr = 0.01f;
  float momentum = 0;
  float dampening = 0;
  float weight_decay = 0;
  bool nesterov = false;
  bool first_step = true;  // the momentum buffer starts as the first gradient
};

CXXLAUNCH_HOST_DEVICE void adamElement(float& param, float grad, float& exp_avg, float& exp_avg_sq,
                                       const AdamScalars& k) {
  const float g = grad + k.l2 * param;
  const float m = exp_avg * k.beta1 + k.one_minus_beta1 * g;
  const float v = exp_avg_sq * k.beta2 + k.one_minus_beta2 * (g * g);
  const float denom = sqrtf(v) / k.bias_correction2_sqrt + k.eps;
  param = param * k.decay - k.step_size * (m / denom);
  exp_avg = m;
  exp_avg_sq = v;
}

CXXLAUNCH_HOST_DEVICE void sgdElement(float& param, float grad, float* momentum_buffer,
                                      const SgdScalars& k) {
  float d = grad + k.weight_decay * param;
  if (momentum_buffer != nullptr) {
    const float buf = k.first_step ? d : k.momentum * *momentum_buffer + (1 - k.dampening) * d;
    *momentum_buffer = buf;
    d = k.nesterov ? d + k.momentum * buf : buf;
  }
  param = param - k.lr * d;
}

// bfloat16 and IEEE half as raw bits, converted the way LibTorch converts (round to nearest
// even; NaN stays NaN), so that a cast-copy here equals tensor.to(kBFloat16 / kHalf).
CXXLAUNCH_HOST_DEVICE uint32_t floatBits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, sizeof(u));
  return u;
}
CXXLAUNCH_HOST_DEVICE float bitsFloat(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, sizeof(f));
  return f;
}
CXXLAUNCH_HOST_DEVICE uint16_t floatToBFloat16(float f) {
  const uint32_t u = floatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
CXXLAUNCH_HOST_DEVICE float bfloat16ToFloat(uint16_t b) {
  return bitsFloat(static_cast<uint32_t>(b) << 16);
}

// IEEE binary16, as c10::Half converts on the CPU (fp16_ieee_from_fp32_value): round to nearest
// even, overflow to infinity, gradual underflow to the half denormals, NaN becomes the quiet NaN
// 0x7e00 with its sign kept. Integer arithmetic only, so the GPU gives the same bits without
// depending on its float rounding modes or on flush-to-zero.
CXXLAUNCH_HOST_DEVICE uint16_t floatToHalf(float f) {
  const uint32_t u = floatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: infinity
  if (a >= 0x38800000u) {  // a normal half: rebias the exponent, round off 13 mantissa bits
    const uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  if (a < 0x33000000u) return static_cast<uint16_t>(sign);  // below half of 2^-24: zero
  // A half denormal counts units of 2^-24: shift the full 24-bit significand right by 126 - e
  // (14..24) and round to nearest even on the bits shifted out. A carry into bit 10 yields the
  // smallest normal, which is the right encoding.
  const uint32_t shift = 126u - (a >> 23);
  const uint32_t significand = (a & 0x7fffffu) | 0x800000u;
  const uint32_t halfway = 1u << (shift - 1);
  const uint32_t rest = significand & ((1u << shift) - 1);
  uint32_t h = significand >> shift;
  if (rest > halfway || (rest == halfway && (h & 1u) != 0)) ++h;
  return static_cast<uint16_t>(sign | h);
}
// Exact (every half is a float). A NaN keeps its sign and payload and comes out quiet, as
// c10::Half's conversion (float arithmetic on the CPU) leaves it.
CXXLAUNCH_HOST_DEVICE float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) {
    if (mantissa == 0) return bitsFloat(sign | 0x7f800000u);  // infinity
    return bitsFloat(sign | 0x7fc00000u | (mantissa << 13));  // NaN, quieted
  }
  if (exponent != 0) return bitsFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
  // Zero or a denormal: mantissa * 2^-24, exact in float (no rounding, no flush: a float normal).
  const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
  return sign != 0 ? -magnitude : magnitude;
}

// True when f is neither infinite nor NaN (the loss scaler's overflow test).
CXXLAUNCH_HOST_DEVICE bool isFiniteFloat(float f) {
  return (floatBits(f) & 0x7f800000u) != 0x7f800000u;
}

}  // namespace cxxlaunch::runtime::kernels
