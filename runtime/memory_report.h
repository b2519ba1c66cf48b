#pragma once
// What Accelerator::memoryReport() says: the bytes of model state this rank holds.

#include <cstddef>
#include <string>

namespace cxxlaunch::runtime {

// Bytes of model state this rank holds now (Accelerator::memoryReport()).
struct MemoryReport {
  size_t parameters = 0;       // every parameter copy: compute copies and fp32 master shards
  size_t gradients = 0;        // full gradient buffers alive now, and gradient shards
  size_t optimizer_state = 0;  // moments / momentum buffers (nvme offload: the staging slots)
  size_t offloaded = 0;        // on disk (nvme offload), not in memory
  // In host memory, off the GPU (cpu offload: fp32 master and gradient shards, optimizer state);
  // not in total(), which counts the device's model state.
  size_t offloaded_to_cpu = 0;
  // The GPU's peak of allocated bytes (LibTorch's caching allocator: activations included), from
  // Accelerator::memoryReport on a GPU worker; 0 elsewhere.
  size_t device_peak = 0;
  // Freed buffers a step will allocate again, kept (ZeRO-3 on CPU: flat/buffer_pool.h); not
  // model state, so not in total().
  size_t kept_for_reuse = 0;
  size_t total() const { return parameters + gradients + optimizer_state; }
  std::string str() const;
};

}  // namespace cxxlaunch::runtime
