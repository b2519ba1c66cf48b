#pragma once
// One AdamW update over contiguous float32 arrays in a single pass: decoupled weight decay,
// both moments, bias correction and the step. Plain C++ with no LibTorch, built at -O3 with
// AVX2 and AVX-512 clones so it vectorises on whatever CPU runs it. Internal to runtime/.

#include <cstdint>

namespace cxxlaunch::runtime {

struct AdamWScalars {
  float decay;         // 1 - lr * weight_decay
  float beta1, beta2;  // moment coefficients
  float one_minus_beta1, one_minus_beta2;
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step)
  float eps;
  float step_size;  // lr / (1 - beta1^step)
};

// param, exp_avg and exp_avg_sq are updated in place, elements [begin, end).
void adamwUpdate(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t begin,
                 int64_t end, const AdamWScalars& s);

}  // namespace cxxlaunch::runtime
