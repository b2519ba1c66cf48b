// Host-side CUDA plumbing (device.h): every runtime call through CXXLAUNCH_CUDA_CHECK.

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <string>
#include <utility>

#include "common/host.h"
#include "runtime/kernels/cuda/check.h"
#include "runtime/kernels/cuda/device.h"

namespace cxxlaunch::runtime::kernels::cuda {
namespace detail {

void throwCudaError(const char* call, const char* where, cudaError_t err) {
  // Reported here, so not again by the next launch check (cudaGetLastError) of this thread. A
  // sticky error (a kernel fault) stays: every later call reports it.
  (void)cudaGetLastError();
  int device = -1;
  const std::string device_text =
      cudaGetDevice(&device) == cudaSuccess ? std::to_string(device) : std::string("?");
  throw CudaError(std::string(call) + " failed" + where + ": " + cudaGetErrorName(err) + " (" +
                  cudaGetErrorString(err) + ") on host " + hostName() + ", CUDA device " +
                  device_text);
}

}  // namespace detail

int deviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: not an error for the caller
    return 0;
  }
  return count;
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes > 0) CXXLAUNCH_CUDA_CHECK(cudaMalloc(&data_, bytes), "");
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) (void)cudaFree(data_);  // a destructor must not throw
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) (void)cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void copyToDevice(void* device_dst, const void* host_src, std::size_t bytes) {
  CXXLAUNCH_CUDA_CHECK(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice), "");
}

void copyToHost(void* host_dst, const void* device_src, std::size_t bytes) {
  CXXLAUNCH_CUDA_CHECK(cudaMemcpy(host_dst, device_src, bytes, cudaMemcpyDeviceToHost), "");
}

void copyDeviceToDevice(void* device_dst, const void* device_src, std::size_t bytes,
                        Stream stream) {
  CXXLAUNCH_CUDA_CHECK(
      cudaMemcpyAsync(device_dst, device_src, bytes, cudaMemcpyDeviceToDevice, stream), "");
}

void synchronize(Stream stream) { CXXLAUNCH_CUDA_CHECK(cudaStreamSynchronize(stream), ""); }

}  // namespace cxxlaunch::runtime::kernels::cuda
