#pragma once
// The one check of CUDA runtime return values inside cxxlaunch_cuda (.cu files only): throws
// CudaError naming the call, the CUDA error, the host and the current device.

#include <cuda_runtime_api.h>

#include <string>

#include "runtime/kernels/cuda/device.h"

namespace cxxlaunch::runtime::kernels::cuda::detail {

[[noreturn]] void throwCudaError(const char* call, const char* where, cudaError_t err);

}  // namespace cxxlaunch::runtime::kernels::cuda::detail

// CXXLAUNCH_CUDA_CHECK(cudaMemcpy(...), "") or, after a kernel launch,
// CXXLAUNCH_CUDA_CHECK(cudaGetLastError(), " launching adamStep").
#define CXXLAUNCH_CUDA_CHECK(call, where)                                                        \
  do {                                                                                           \
    const cudaError_t cxxlaunch_err_ = (call);                                                   \
    if (cxxlaunch_err_ != cudaSuccess) {                                                         \
      ::cxxlaunch::runtime::kernels::cuda::detail::throwCudaError(#call, where, cxxlaunch_err_); \
    }                                                                                            \
  } while (0)
