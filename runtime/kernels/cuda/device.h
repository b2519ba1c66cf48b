#pragma once
// The host-side CUDA plumbing the kernels' callers, tests and benchmarks need, behind plain C++
// (no CUDA header): the stream type, the error type every checked CUDA call throws, device
// discovery, an owning device allocation and copies. Implemented in device.cu (cxxlaunch_cuda).
//
// Thread-safety: every function may be called from any thread; calls act on the calling thread's
// current device (cudaSetDevice), as the CUDA runtime does.

#include <cstddef>

#include "common/error.h"

struct CUstream_st;

namespace cxxlaunch::runtime::kernels::cuda {

// cudaStream_t without the CUDA headers; nullptr is the legacy default stream.
using Stream = CUstream_st*;

// A CUDA runtime call failed. `what` names the call, the CUDA error text, the host and the device.
class CudaError : public ::cxxlaunch::Error {
 public:
  using Error::Error;
};

// The number of CUDA devices visible to this process; 0 when there is none or no driver (this
// one call does not throw, so a test or a benchmark can ask before touching the GPU).
int deviceCount();

// cudaMalloc'd memory owned by one object: freed in the destructor, movable, not copyable.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);  // throws CudaError when the allocation fails
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// Copies that return when the bytes are there (cudaMemcpy: ordered after all work queued on the
// legacy default stream).
void copyToDevice(void* device_dst, const void* host_src, std::size_t bytes);
void copyToHost(void* host_dst, const void* device_src, std::size_t bytes);

// Queued on `stream`; returns at once.
void copyDeviceToDevice(void* device_dst, const void* device_src, std::size_t bytes, Stream stream);

// Waits until everything queued on `stream` ran; throws CudaError if any of it failed.
void synchronize(Stream stream);

}  // namespace cxxlaunch::runtime::kernels::cuda
