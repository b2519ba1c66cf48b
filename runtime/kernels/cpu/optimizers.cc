#include "runtime/kernels/cpu/optimizers.h"

namespace cxxlaunch::runtime::kernels {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CXXLAUNCH_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CXXLAUNCH_CPU_CLONES
#endif

CXXLAUNCH_CPU_CLONES
void adamStep(float* __restrict param, const float* __restrict grad, float* __restrict exp_avg,
              float* __restrict exp_avg_sq, int64_t n, const AdamScalars& s) {
  const AdamScalars k = s;  // a local copy: no aliasing question for the vectoriser
  for (int64_t i = 0; i < n; ++i) adamElement(param[i], grad[i], exp_avg[i], exp_avg_sq[i], k);
}

CXXLAUNCH_CPU_CLONES
void sgdStep(float* __restrict param, const float* __restrict grad,
             float* __restrict momentum_buffer, int64_t n, const SgdScalars& s) {
  const SgdScalars k = s;
  if (momentum_buffer == nullptr || k.momentum == 0) {
    for (int64_t i = 0; i < n; ++i) sgdElement(param[i], grad[i], nullptr, k);
    return;
  }
  for (int64_t i = 0; i < n; ++i) sgdElement(param[i], grad[i], momentum_buffer + i, k);
}

CXXLAUNCH_CPU_CLONES
double sumOfSquares(const float* __restrict x, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

CXXLAUNCH_CPU_CLONES
void scaleInPlace(float* __restrict x, int64_t n, float factor) {
  for (int64_t i = 0; i < n; ++i) x[i] *= factor;
}

CXXLAUNCH_CPU_CLONES
bool allFinite(const float* __restrict x, int64_t n) {
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) finite &= isFiniteFloat(x[i]);
  return finite;
}

CXXLAUNCH_CPU_CLONES
void castFloatToBFloat16(const float* __restrict from, uint16_t* __restrict to, int64_t n) {
  for (int64_t i = 0; i < n; ++i) to[i] = floatToBFloat16(from[i]);
}

CXXLAUNCH_CPU_CLONES
void castBFloat16ToFloat(const uint16_t* __restrict from, float* __restrict to, int64_t n) {
  for (int64_t i = 0; i < n; ++i) to[i] = bfloat16ToFloat(from[i]);
}

CXXLAUNCH_CPU_CLONES
void castFloatToHalf(const float* __restrict from, uint16_t* __restrict to, int64_t n) {
  for (int64_t i = 0; i < n; ++i) to[i] = floatToHalf(from[i]);
}

CXXLAUNCH_CPU_CLONES
void castHalfToFloat(const uint16_t* __restrict from, float* __restrict to, int64_t n) {
  for (int64_t i = 0; i < n; ++i) to[i] = halfToFloat(from[i]);
}

}  // namespace cxxlaunch::runtime::kernels
