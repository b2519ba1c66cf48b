#include "runtime/adamw_kernel.h"

#include <cmath>

namespace cxxlaunch::runtime {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CXXLAUNCH_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CXXLAUNCH_CPU_CLONES
#endif

// The same arithmetic, in the same order, as LibTorch's AdamW::step (p *= decay;
// m = m*beta1 + (1-beta1)*g; v = v*beta2 + (1-beta2)*g*g; p -= step_size * m / (sqrt(v)/sqrt(bc2)
// + eps)), one element at a time instead of seven passes over memory.
CXXLAUNCH_CPU_CLONES
void adamwUpdate(float* __restrict param, const float* __restrict grad, float* __restrict exp_avg,
                 float* __restrict exp_avg_sq, int64_t begin, int64_t end, const AdamWScalars& s) {
  const AdamWScalars k = s;  // local copy: no aliasing question for the vectoriser
  for (int64_t i = begin; i < end; ++i) {
    const float g = grad[i];
    const float m = exp_avg[i] * k.beta1 + k.one_minus_beta1 * g;
    const float v = exp_avg_sq[i] * k.beta2 + k.one_minus_beta2 * (g * g);
    const float denom = std::sqrt(v) / k.bias_correction2_sqrt + k.eps;
    param[i] = param[i] * k.decay - k.step_size * (m / denom);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
  }
}

}  // namespace cxxlaunch::runtime
