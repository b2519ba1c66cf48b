#pragma once
// The shard kernels on float32 tensors wherever they live: the CPU loops (kernels/cpu, split
// across LibTorch's intra-op threads) for host memory, the CUDA kernels (kernels/cuda, on the
// legacy default stream, which is LibTorch's default stream and the one NcclBackend orders its
// collectives after) for GPU memory. The strategies call these, never a loop of one device.
//
// A GPU tensor in a build without the CUDA kernels (no nvcc) throws InvalidArgument.

#include <ATen/core/Tensor.h>

#include "runtime/kernels/element_math.h"

namespace cxxlaunch::runtime::device_kernels {

// Raw float32 arrays of `n` elements on `device` (the shard optimizers' per-segment update).
void adamStep(c10::Device device, float* param, const float* grad, float* exp_avg,
              float* exp_avg_sq, int64_t n, const kernels::AdamScalars& s);
void sgdStep(c10::Device device, float* param, const float* grad, float* momentum_buffer, int64_t n,
             const kernels::SgdScalars& s);

// On a contiguous float32 tensor.
double sumOfSquares(const at::Tensor& x);  // in double: the global norm's partial sum
void scaleInPlace(const at::Tensor& x, float factor);
bool allFinite(const at::Tensor& x);  // no inf, no NaN (the loss scaler's check)

}  // namespace cxxlaunch::runtime::device_kernels
