// The Llama layers' fused kernels (layers.h). Row kernels (RMSNorm, cross-entropy) take one block
// per row and reduce in registers, then across the block's warps; the elementwise ones (rotary,
// SwiGLU) are grid-stride loops. Every sum runs in a fixed order, so results repeat bit for bit.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/error.h"
#include "runtime/kernels/cuda/check.h"
#include "runtime/kernels/cuda/layers.h"

namespace cxxlaunch::runtime::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMaxBlocks = 4096;
// The RMSNorm weight gradient's row chunks: partial sums per chunk, then one fixed-order sum.
constexpr int64_t kRowChunks = 128;

void checkShape(const char* what, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) {
    throw ::cxxlaunch::InvalidArgument(std::string("kernels::cuda::") + what + ": negative size " +
                                       std::to_string(rows) + " x " + std::to_string(cols));
  }
}

void checkLaunch(const char* what) {
  CXXLAUNCH_CUDA_CHECK(cudaGetLastError(), (std::string(" launching ") + what).c_str());
}

int gridFor(int64_t work) {
  return static_cast<int>(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

__device__ __forceinline__ float toFloat(float v) { return v; }
__device__ __forceinline__ float toFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T>
__device__ __forceinline__ T fromFloat(float v);
template <>
__device__ __forceinline__ float fromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
// v as the activations' dtype holds it (the unfused math's intermediate tensors).
template <class T>
__device__ __forceinline__ float rounded(float v) {
  return toFloat(fromFloat<T>(v));
}

__device__ __forceinline__ int64_t globalThread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t gridThreads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// The block's sum of v, on every thread (kThreads threads).
__device__ float blockSum(float v) {
  __shared__ float partial[kWarps];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < kWarps; ++w) total += partial[w];
  return total;
}

// An online logsumexp's state: the max seen and the sum of exp(x - max).
struct MaxSum {
  float max, sum;
};
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}
// The state with one more value x: one exponential per element.
__device__ __forceinline__ MaxSum add(MaxSum a, float x) {
  if (x == -INFINITY) return a;
  if (x <= a.max) return {a.max, a.sum + expf(x - a.max)};
  return {x, a.sum * expf(a.max - x) + 1.0f};
}
__device__ MaxSum blockMaxSum(MaxSum v) {
  __shared__ MaxSum partial[kWarps];
  for (int offset = 16; offset > 0; offset /= 2) {
    v = combine(v, {__shfl_xor_sync(0xffffffffu, v.max, offset),
                    __shfl_xor_sync(0xffffffffu, v.sum, offset)});
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  MaxSum total{-INFINITY, 0.0f};
  for (int w = 0; w < kWarps; ++w) total = combine(total, partial[w]);
  return total;
}

// ---- RMSNorm ------------------------------------------------------------------------------------

template <class T>
__global__ void __launch_bounds__(kThreads)
    rmsNormForwardKernel(const T* x, const T* weight, T* y, float* inv_rms, int64_t cols,
                         float eps) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  T* yr = y + row * cols;
  float squares = 0;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
    const float v = toFloat(xr[j]);
    squares += v * v;
  }
  const float r = rsqrtf(blockSum(squares) / static_cast<float>(cols) + eps);
  if (threadIdx.x == 0) inv_rms[row] = r;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
    yr[j] = fromFloat<T>(toFloat(weight[j]) * rounded<T>(toFloat(xr[j]) * r));
  }
}

// d/dx of w * (x r), r = (mean(x^2) + eps)^-1/2: r g - x r^3 (g . x) / cols, g = grad_y * w.
template <class T>
__global__ void __launch_bounds__(kThreads)
    rmsNormGradXKernel(const T* grad_y, const T* x, const T* weight, const float* inv_rms,
                       T* grad_x, int64_t cols) {
  const int64_t row = blockIdx.x;
  const T* gr = grad_y + row * cols;
  const T* xr = x + row * cols;
  T* out = grad_x + row * cols;
  const float r = inv_rms[row];
  float dot = 0;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
    dot += toFloat(gr[j]) * toFloat(weight[j]) * toFloat(xr[j]);
  }
  const float k = r * r * r * blockSum(dot) / static_cast<float>(cols);
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
    const float g = toFloat(gr[j]) * toFloat(weight[j]);
    out[j] = fromFloat<T>(r * g - toFloat(xr[j]) * k);
  }
}

// scratch[chunk][j] = sum over the chunk's rows of grad_y * dtype(x r); a thread per column, so
// neighbouring threads read neighbouring elements.
template <class T>
__global__ void __launch_bounds__(kThreads)
    rmsNormGradWeightPartialKernel(const T* grad_y, const T* x, const float* inv_rms,
                                   float* scratch, int64_t rows, int64_t cols, int64_t chunk_rows) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (j >= cols) return;
  const int64_t chunk = blockIdx.y;
  const int64_t first = chunk * chunk_rows;
  const int64_t last = first + chunk_rows < rows ? first + chunk_rows : rows;
  float sum = 0;
  for (int64_t r = first; r < last; ++r) {
    sum += toFloat(grad_y[r * cols + j]) * rounded<T>(toFloat(x[r * cols + j]) * inv_rms[r]);
  }
  scratch[chunk * cols + j] = sum;
}

__global__ void __launch_bounds__(kThreads)
    sumChunksKernel(const float* scratch, float* out, int64_t chunks, int64_t cols) {
  const int64_t j = globalThread();
  if (j >= cols) return;
  float sum = 0;
  for (int64_t c = 0; c < chunks; ++c) sum += scratch[c * cols + j];
  out[j] = sum;
}

// ---- rotary -------------------------------------------------------------------------------------

template <class T>
__global__ void __launch_bounds__(kThreads)
    rotaryKernel(const T* x, T* out, const float* cos, const float* sin, const int64_t* positions,
                 int64_t tokens, int64_t row_length, int64_t heads, int64_t head_dim,
                 bool inverse) {
  const int64_t half = head_dim / 2, pairs = tokens * heads * half;
  for (int64_t p = globalThread(); p < pairs; p += gridThreads()) {
    const int64_t i = p % half, token = p / (half * heads);
    const int64_t position = positions != nullptr ? positions[token] : token % row_length;
    const T* in = x + (p / half) * head_dim;
    T* v = out + (p / half) * head_dim;
    const float a = toFloat(in[i]), b = toFloat(in[i + half]);
    const float* c = cos + position * head_dim;
    const float* s = sin + position * head_dim;
    if (!inverse) {
      v[i] = fromFloat<T>(a * c[i] - b * s[i]);
      v[i + half] = fromFloat<T>(b * c[i + half] + a * s[i + half]);
    } else {
      v[i] = fromFloat<T>(a * c[i] + b * s[i + half]);
      v[i + half] = fromFloat<T>(b * c[i + half] - a * s[i]);
    }
  }
}

// ---- SwiGLU -------------------------------------------------------------------------------------

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

template <class T>
__global__ void __launch_bounds__(kThreads)
    swigluForwardKernel(const T* gate, const T* up, T* out, int64_t n) {
  for (int64_t i = globalThread(); i < n; i += gridThreads()) {
    const float g = toFloat(gate[i]);
    out[i] = fromFloat<T>(rounded<T>(g * sigmoid(g)) * toFloat(up[i]));
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    swigluBackwardKernel(const T* grad_out, const T* gate, const T* up, T* grad_gate, T* grad_up,
                         int64_t n) {
  for (int64_t i = globalThread(); i < n; i += gridThreads()) {
    const float g = toFloat(gate[i]), u = toFloat(up[i]), d = toFloat(grad_out[i]);
    const float s = sigmoid(g);
    grad_up[i] = fromFloat<T>(d * rounded<T>(g * s));
    // silu'(g) = s (1 + g (1 - s)); the unfused math's grad of silu sees d * up in dtype.
    grad_gate[i] = fromFloat<T>(rounded<T>(d * u) * s * (1.0f + g * (1.0f - s)));
  }
}

// ---- cross-entropy ------------------------------------------------------------------------------

template <class T>
__global__ void __launch_bounds__(kThreads)
    crossEntropyForwardKernel(const T* logits, const int64_t* labels, float* lse, float* loss,
                              int64_t vocab) {
  const int64_t row = blockIdx.x;
  const T* lr = logits + row * vocab;
  MaxSum state{-INFINITY, 0.0f};
  for (int64_t j = threadIdx.x; j < vocab; j += kThreads) state = add(state, toFloat(lr[j]));
  state = blockMaxSum(state);
  if (threadIdx.x == 0) {
    const float value = state.max + logf(state.sum);
    lse[row] = value;
    loss[row] = value - toFloat(lr[labels[row]]);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    crossEntropyBackwardKernel(T* logits, const int64_t* labels, const float* lse,
                               const float* scale, int64_t vocab) {
  const int64_t row = blockIdx.x;
  T* lr = logits + row * vocab;
  const float m = lse[row], k = *scale;
  const int64_t label = labels[row];
  for (int64_t j = threadIdx.x; j < vocab; j += kThreads) {
    const float p = expf(toFloat(lr[j]) - m);
    lr[j] = fromFloat<T>((p - (j == label ? 1.0f : 0.0f)) * k);
  }
}

// Runs `launch` with the kernel's element type.
template <class Launch>
void dispatch(DType dtype, Launch&& launch) {
  if (dtype == DType::kFloat32) {
    launch(float{});
  } else {
    launch(__nv_bfloat16{});
  }
}

// Row kernels take one block per row: at most 2^31 - 1 rows per launch, so rows go in slices.
constexpr int64_t kMaxGridRows = (int64_t{1} << 31) - 1;

}  // namespace

void rmsNormForward(const void* x, const void* weight, void* y, float* inv_rms, int64_t rows,
                    int64_t cols, float eps, DType dtype, Stream stream) {
  checkShape("rmsNormForward", rows, cols);
  if (rows == 0 || cols == 0) return;
  dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    for (int64_t first = 0; first < rows; first += kMaxGridRows) {
      const int64_t n = std::min(kMaxGridRows, rows - first);
      rmsNormForwardKernel<T><<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
          static_cast<const T*>(x) + first * cols, static_cast<const T*>(weight),
          static_cast<T*>(y) + first * cols, inv_rms + first, cols, eps);
      checkLaunch("rmsNormForward");
    }
  });
}

int64_t rmsNormBackwardScratch(int64_t rows, int64_t cols) {
  return std::min(rows, kRowChunks) * cols;
}

void rmsNormBackward(const void* grad_y, const void* x, const void* weight, const float* inv_rms,
                     void* grad_x, float* grad_weight, float* scratch, int64_t rows, int64_t cols,
                     DType dtype, Stream stream) {
  checkShape("rmsNormBackward", rows, cols);
  if (cols == 0) return;
  if (rows == 0) {
    CXXLAUNCH_CUDA_CHECK(cudaMemsetAsync(grad_weight, 0, cols * sizeof(float), stream), "");
    return;
  }
  const int64_t chunks = std::min(rows, kRowChunks);
  const int64_t chunk_rows = (rows + chunks - 1) / chunks;
  dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    const T* gy = static_cast<const T*>(grad_y);
    const T* xs = static_cast<const T*>(x);
    for (int64_t first = 0; first < rows; first += kMaxGridRows) {
      const int64_t n = std::min(kMaxGridRows, rows - first);
      rmsNormGradXKernel<T><<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
          gy + first * cols, xs + first * cols, static_cast<const T*>(weight), inv_rms + first,
          static_cast<T*>(grad_x) + first * cols, cols);
      checkLaunch("rmsNormBackward");
    }
    const dim3 grid(static_cast<unsigned>((cols + kThreads - 1) / kThreads),
                    static_cast<unsigned>(chunks));
    rmsNormGradWeightPartialKernel<T>
        <<<grid, kThreads, 0, stream>>>(gy, xs, inv_rms, scratch, rows, cols, chunk_rows);
    checkLaunch("rmsNormBackward");
  });
  sumChunksKernel<<<static_cast<unsigned>((cols + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      scratch, grad_weight, chunks, cols);
  checkLaunch("rmsNormBackward");
}

void rotary(const void* x, void* out, const float* cos, const float* sin, const int64_t* positions,
            int64_t tokens, int64_t row_length, int64_t heads, int64_t head_dim, bool inverse,
            DType dtype, Stream stream) {
  checkShape("rotary", tokens, heads * head_dim);
  if (head_dim % 2 != 0 || (positions == nullptr && row_length < 1)) {
    throw ::cxxlaunch::InvalidArgument(
        "kernels::cuda::rotary: head_dim must be even and row_length >= 1 without "
        "positions, got head_dim " +
        std::to_string(head_dim) + ", row_length " + std::to_string(row_length));
  }
  const int64_t pairs = tokens * heads * (head_dim / 2);
  if (pairs == 0) return;
  dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    rotaryKernel<T><<<gridFor(pairs), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<T*>(out), cos, sin, positions, tokens, row_length,
        heads, head_dim, inverse);
    checkLaunch("rotary");
  });
}

void swigluForward(const void* gate, const void* up, void* out, int64_t n, DType dtype,
                   Stream stream) {
  checkShape("swigluForward", n, 1);
  if (n == 0) return;
  dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    swigluForwardKernel<T><<<gridFor(n), kThreads, 0, stream>>>(
        static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out), n);
    checkLaunch("swigluForward");
  });
}

void swigluBackward(const void* grad_out, const void* gate, const void* up, void* grad_gate,
                    void* grad_up, int64_t n, DType dtype, Stream stream) {
  checkShape("swigluBackward", n, 1);
  if (n == 0) return;
  dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    swigluBackwardKernel<T><<<gridFor(n), kThreads, 0, stream>>>(
        static_cast<const T*>(grad_out), static_cast<const T*>(gate), static_cast<const T*>(up),
        static_cast<T*>(grad_gate), static_cast<T*>(grad_up), n);
    checkLaunch("swigluBackward");
  });
}

void crossEntropyForward(const void* logits, const int64_t* labels, float* lse, float* loss,
                         int64_t rows, int64_t vocab, DType dtype, Stream stream) {
  checkShape("crossEntropyForward", rows, vocab);
  if (rows == 0 || vocab == 0) return;
  dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    for (int64_t first = 0; first < rows; first += kMaxGridRows) {
      const int64_t n = std::min(kMaxGridRows, rows - first);
      crossEntropyForwardKernel<T><<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
          static_cast<const T*>(logits) + first * vocab, labels + first, lse + first, loss + first,
          vocab);
      checkLaunch("crossEntropyForward");
    }
  });
}

void crossEntropyBackward(void* logits, const int64_t* labels, const float* lse, const float* scale,
                          int64_t rows, int64_t vocab, DType dtype, Stream stream) {
  checkShape("crossEntropyBackward", rows, vocab);
  if (rows == 0 || vocab == 0) return;
  dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    for (int64_t first = 0; first < rows; first += kMaxGridRows) {
      const int64_t n = std::min(kMaxGridRows, rows - first);
      crossEntropyBackwardKernel<T><<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
          static_cast<T*>(logits) + first * vocab, labels + first, lse + first, scale, vocab);
      checkLaunch("crossEntropyBackward");
    }
  });
}

}  // namespace cxxlaunch::runtime::kernels::cuda
