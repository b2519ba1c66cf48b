// The shard optimizers' CUDA kernels (optimizers.h). Each elementwise kernel is one grid-stride
// loop over 4-element vectors (16-byte loads and stores when every array is aligned for them),
// then the tail element by element; the per-element math is element_math.h's, written once for
// the CPU loops and these kernels. Compiled with --fmad=false: a fused multiply-add rounds once
// where the CPU loop (built with -ffp-contract=off) rounds twice, and parity is the point.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/error.h"
#include "runtime/kernels/cuda/check.h"
#include "runtime/kernels/cuda/optimizers.h"
#include "runtime/kernels/element_math.h"

namespace cxxlaunch::runtime::kernels::cuda {
namespace {

constexpr int kThreads = 256;
// Enough resident blocks to fill any current GPU several times over; the grid-stride loops take
// the rest. Fixed (not per device), so a reduction sums in the same order on every GPU.
constexpr int64_t kMaxBlocks = kSumOfSquaresScratch - 1;

// Blocks for n elements of which n_vec 4-element vectors go first.
int blocksFor(int64_t n_vec, int64_t n) {
  const int64_t work = n_vec > 0 ? n_vec : n;
  return static_cast<int>(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

bool aligned(const void* p, std::uintptr_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

void checkCount(const char* what, int64_t n) {
  if (n < 0) {
    throw ::cxxlaunch::InvalidArgument(std::string("kernels::cuda::") + what +
                                       ": negative element count " + std::to_string(n));
  }
}

__device__ __forceinline__ int64_t globalThread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t gridThreads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// Op::vector(j) handles elements 4j..4j+3, Op::scalar(i) element i.
template <class Op>
__global__ void __launch_bounds__(kThreads) elementwiseKernel(Op op, int64_t n_vec, int64_t n) {
  const int64_t stride = gridThreads();
  for (int64_t j = globalThread(); j < n_vec; j += stride) op.vector(j);
  for (int64_t i = 4 * n_vec + globalThread(); i < n; i += stride) op.scalar(i);
}

template <class Op>
void launchElementwise(const char* what, const Op& op, int64_t n, bool vectorise, Stream stream) {
  checkCount(what, n);
  if (n == 0) return;
  const int64_t n_vec = vectorise ? n / 4 : 0;
  elementwiseKernel<<<blocksFor(n_vec, n), kThreads, 0, stream>>>(op, n_vec, n);
  CXXLAUNCH_CUDA_CHECK(cudaGetLastError(), (std::string(" launching ") + what).c_str());
}

template <class T, class Vec>
__device__ __forceinline__ Vec load4(const T* p, int64_t j) {
  return reinterpret_cast<const Vec*>(p)[j];
}
template <class T, class Vec>
__device__ __forceinline__ void store4(T* p, int64_t j, const Vec& v) {
  reinterpret_cast<Vec*>(p)[j] = v;
}

struct AdamOp {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  AdamScalars k;

  __device__ void scalar(int64_t i) const {
    adamElement(param[i], grad[i], exp_avg[i], exp_avg_sq[i], k);
  }
  __device__ void vector(int64_t j) const {
    float4 p = load4<float, float4>(param, j);
    const float4 g = load4<float, float4>(grad, j);
    float4 m = load4<float, float4>(exp_avg, j);
    float4 v = load4<float, float4>(exp_avg_sq, j);
    adamElement(p.x, g.x, m.x, v.x, k);
    adamElement(p.y, g.y, m.y, v.y, k);
    adamElement(p.z, g.z, m.z, v.z, k);
    adamElement(p.w, g.w, m.w, v.w, k);
    store4(param, j, p);
    store4(exp_avg, j, m);
    store4(exp_avg_sq, j, v);
  }
};

template <bool kMomentum>
struct SgdOp {
  float* param;
  const float* grad;
  float* momentum_buffer;
  SgdScalars k;

  __device__ void scalar(int64_t i) const {
    sgdElement(param[i], grad[i], kMomentum ? momentum_buffer + i : nullptr, k);
  }
  __device__ void vector(int64_t j) const {
    float4 p = load4<float, float4>(param, j);
    const float4 g = load4<float, float4>(grad, j);
    if constexpr (kMomentum) {
      float4 b = load4<float, float4>(momentum_buffer, j);
      sgdElement(p.x, g.x, &b.x, k);
      sgdElement(p.y, g.y, &b.y, k);
      sgdElement(p.z, g.z, &b.z, k);
      sgdElement(p.w, g.w, &b.w, k);
      store4(momentum_buffer, j, b);
    } else {
      sgdElement(p.x, g.x, nullptr, k);
      sgdElement(p.y, g.y, nullptr, k);
      sgdElement(p.z, g.z, nullptr, k);
      sgdElement(p.w, g.w, nullptr, k);
    }
    store4(param, j, p);
  }
};

struct ScaleOp {
  float* x;
  float factor;

  __device__ void scalar(int64_t i) const { x[i] *= factor; }
  __device__ void vector(int64_t j) const {
    float4 v = load4<float, float4>(x, j);
    v.x *= factor;
    v.y *= factor;
    v.z *= factor;
    v.w *= factor;
    store4(x, j, v);
  }
};

// The 16-bit formats of the casts: element_math's conversions as types the ops are templated on.
struct BFloat16Format {
  __device__ static uint16_t narrow(float f) { return floatToBFloat16(f); }
  __device__ static float widen(uint16_t b) { return bfloat16ToFloat(b); }
};
struct HalfFormat {
  __device__ static uint16_t narrow(float f) { return floatToHalf(f); }
  __device__ static float widen(uint16_t h) { return halfToFloat(h); }
};

// float -> 16-bit raw bits.
template <class Format>
struct NarrowOp {
  const float* from;
  uint16_t* to;

  __device__ void scalar(int64_t i) const { to[i] = Format::narrow(from[i]); }
  __device__ void vector(int64_t j) const {
    const float4 f = load4<float, float4>(from, j);
    store4(to, j,
           make_ushort4(Format::narrow(f.x), Format::narrow(f.y), Format::narrow(f.z),
                        Format::narrow(f.w)));
  }
};

// 16-bit raw bits -> float.
template <class Format>
struct WidenOp {
  const uint16_t* from;
  float* to;

  __device__ void scalar(int64_t i) const { to[i] = Format::widen(from[i]); }
  __device__ void vector(int64_t j) const {
    const ushort4 h = load4<uint16_t, ushort4>(from, j);
    store4(to, j,
           make_float4(Format::widen(h.x), Format::widen(h.y), Format::widen(h.z),
                       Format::widen(h.w)));
  }
};

// Finiteness, optionally fused with the unscale. Every thread of a block reaches the
// __syncthreads_or, and one store per block that saw a non-finite value sets the flag.
template <bool kScale>
__global__ void __launch_bounds__(kThreads)
    finiteKernel(float* x, int64_t n_vec, int64_t n, float inv_scale, int32_t* found_nonfinite) {
  const int64_t stride = gridThreads();
  bool bad = false;
  for (int64_t j = globalThread(); j < n_vec; j += stride) {
    float4 v = load4<float, float4>(x, j);
    bad |= !isFiniteFloat(v.x) || !isFiniteFloat(v.y) || !isFiniteFloat(v.z) || !isFiniteFloat(v.w);
    if constexpr (kScale) {
      v.x *= inv_scale;
      v.y *= inv_scale;
      v.z *= inv_scale;
      v.w *= inv_scale;
      store4(x, j, v);
    }
  }
  for (int64_t i = 4 * n_vec + globalThread(); i < n; i += stride) {
    const float v = x[i];
    bad |= !isFiniteFloat(v);
    if constexpr (kScale) x[i] = v * inv_scale;
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found_nonfinite = 1;
}

// A block's sum of its threads' values, in a fixed tree order; valid in thread 0.
__device__ double blockSum(double value) {
  __shared__ double partial[kThreads];
  partial[threadIdx.x] = value;
  __syncthreads();
  for (int offset = kThreads / 2; offset > 0; offset /= 2) {
    if (static_cast<int>(threadIdx.x) < offset)
      partial[threadIdx.x] += partial[threadIdx.x + offset];
    __syncthreads();
  }
  return partial[0];
}

__global__ void __launch_bounds__(kThreads)
    sumOfSquaresPartials(const float* x, int64_t n_vec, int64_t n, double* partials) {
  const int64_t stride = gridThreads();
  double sum = 0;
  for (int64_t j = globalThread(); j < n_vec; j += stride) {
    const float4 v = load4<float, float4>(x, j);
    sum += static_cast<double>(v.x) * v.x;
    sum += static_cast<double>(v.y) * v.y;
    sum += static_cast<double>(v.z) * v.z;
    sum += static_cast<double>(v.w) * v.w;
  }
  for (int64_t i = 4 * n_vec + globalThread(); i < n; i += stride) {
    sum += static_cast<double>(x[i]) * x[i];
  }
  const double block = blockSum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = block;
}

// One block: result[0] (+)= the sum of partials[0, count).
__global__ void __launch_bounds__(kThreads)
    sumOfSquaresFinish(double* result, const double* partials, int count, bool accumulate) {
  double sum = 0;
  for (int i = threadIdx.x; i < count; i += kThreads) sum += partials[i];
  const double total = blockSum(sum);
  if (threadIdx.x == 0) result[0] = (accumulate ? result[0] : 0.0) + total;
}

}  // namespace

void adamStep(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
              const AdamScalars& s, Stream stream) {
  const bool vectorise =
      aligned(param, 16) && aligned(grad, 16) && aligned(exp_avg, 16) && aligned(exp_avg_sq, 16);
  launchElementwise("adamStep", AdamOp{param, grad, exp_avg, exp_avg_sq, s}, n, vectorise, stream);
}

void sgdStep(float* param, const float* grad, float* momentum_buffer, int64_t n,
             const SgdScalars& s, Stream stream) {
  if (momentum_buffer == nullptr || s.momentum == 0) {
    launchElementwise("sgdStep", SgdOp<false>{param, grad, nullptr, s}, n,
                      aligned(param, 16) && aligned(grad, 16), stream);
    return;
  }
  launchElementwise("sgdStep", SgdOp<true>{param, grad, momentum_buffer, s}, n,
                    aligned(param, 16) && aligned(grad, 16) && aligned(momentum_buffer, 16),
                    stream);
}

void sumOfSquares(const float* x, int64_t n, double* result, bool accumulate, Stream stream) {
  checkCount("sumOfSquares", n);
  const int64_t n_vec = aligned(x, 16) ? n / 4 : 0;
  const int blocks = n == 0 ? 0 : blocksFor(n_vec, n);
  if (blocks > 0) {
    sumOfSquaresPartials<<<blocks, kThreads, 0, stream>>>(x, n_vec, n, result + 1);
    CXXLAUNCH_CUDA_CHECK(cudaGetLastError(), " launching sumOfSquares");
  }
  sumOfSquaresFinish<<<1, kThreads, 0, stream>>>(result, result + 1, blocks, accumulate);
  CXXLAUNCH_CUDA_CHECK(cudaGetLastError(), " launching sumOfSquares (finish)");
}

double readDouble(const double* device_value, Stream stream) {
  double value = 0;
  CXXLAUNCH_CUDA_CHECK(
      cudaMemcpyAsync(&value, device_value, sizeof(value), cudaMemcpyDeviceToHost, stream), "");
  CXXLAUNCH_CUDA_CHECK(cudaStreamSynchronize(stream), " reading a device double");
  return value;
}

void scaleInPlace(float* x, int64_t n, float factor, Stream stream) {
  launchElementwise("scaleInPlace", ScaleOp{x, factor}, n, aligned(x, 16), stream);
}

void checkFinite(const float* x, int64_t n, int32_t* found_nonfinite, Stream stream) {
  checkCount("checkFinite", n);
  if (n == 0) return;
  const int64_t n_vec = aligned(x, 16) ? n / 4 : 0;
  // The kernel only reads x when it does not scale.
  finiteKernel<false><<<blocksFor(n_vec, n), kThreads, 0, stream>>>(const_cast<float*>(x), n_vec, n,
                                                                    1.0f, found_nonfinite);
  CXXLAUNCH_CUDA_CHECK(cudaGetLastError(), " launching checkFinite");
}

void unscaleAndCheckFinite(float* x, int64_t n, float inv_scale, int32_t* found_nonfinite,
                           Stream stream) {
  checkCount("unscaleAndCheckFinite", n);
  if (n == 0) return;
  const int64_t n_vec = aligned(x, 16) ? n / 4 : 0;
  finiteKernel<true>
      <<<blocksFor(n_vec, n), kThreads, 0, stream>>>(x, n_vec, n, inv_scale, found_nonfinite);
  CXXLAUNCH_CUDA_CHECK(cudaGetLastError(), " launching unscaleAndCheckFinite");
}

void clearFlag(int32_t* flag, Stream stream) {
  CXXLAUNCH_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(*flag), stream), "");
}

bool readFlag(const int32_t* flag, Stream stream) {
  int32_t value = 0;
  CXXLAUNCH_CUDA_CHECK(cudaMemcpyAsync(&value, flag, sizeof(value), cudaMemcpyDeviceToHost, stream),
                       "");
  CXXLAUNCH_CUDA_CHECK(cudaStreamSynchronize(stream), " reading a device flag");
  return value != 0;
}

void castFloatToBFloat16(const float* from, uint16_t* to, int64_t n, Stream stream) {
  launchElementwise("castFloatToBFloat16", NarrowOp<BFloat16Format>{from, to}, n,
                    aligned(from, 16) && aligned(to, 8), stream);
}

void castBFloat16ToFloat(const uint16_t* from, float* to, int64_t n, Stream stream) {
  launchElementwise("castBFloat16ToFloat", WidenOp<BFloat16Format>{from, to}, n,
                    aligned(from, 8) && aligned(to, 16), stream);
}

void castFloatToHalf(const float* from, uint16_t* to, int64_t n, Stream stream) {
  launchElementwise("castFloatToHalf", NarrowOp<HalfFormat>{from, to}, n,
                    aligned(from, 16) && aligned(to, 8), stream);
}

void castHalfToFloat(const uint16_t* from, float* to, int64_t n, Stream stream) {
  launchElementwise("castHalfToFloat", WidenOp<HalfFormat>{from, to}, n,
                    aligned(from, 8) && aligned(to, 16), stream);
}

}  // namespace cxxlaunch::runtime::kernels::cuda
