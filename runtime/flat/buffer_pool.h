#pragma once
// BufferPool: a few freed buffers kept for the next allocation of the same size. A ZeRO-3 step
// gathers every unit twice and frees it after each use, and allocates each unit's full gradient
// once; all of them are of a few equal sizes. Host memory that goes back to the kernel costs a
// page fault per 4 KiB when it is allocated again (the kernel zeroes it first): on CPU that
// halved the step of a 100M-parameter model. Keeping `capacity` buffers bounds what this holds
// to the transients a step has anyway (two gathers in flight, two gradients being reduced).
// GPUs do not need it: LibTorch's CUDA caching allocator does the same.
//
// Thread-safety: every member may be called from any thread.

#include <c10/core/Allocator.h>
#include <torch/types.h>

#include <cstddef>
#include <deque>
#include <mutex>

namespace cxxlaunch::runtime {

class BufferPool {
 public:
  explicit BufferPool(size_t capacity) : capacity_(capacity) {}

  // `bytes` of memory: a kept buffer of exactly that size, else a new one from `allocator`.
  c10::DataPtr take(size_t bytes, c10::Allocator* allocator);
  // Keeps `ptr` (of `bytes`) for a later take; beyond the capacity the oldest kept one is freed.
  void give(c10::DataPtr ptr, size_t bytes);

  // A zeroed contiguous tensor whose memory comes from take(), and its way back: recycle() gives
  // `t`'s memory to the pool when nothing else shares its storage, and resets `t` either way.
  torch::Tensor zeros(int64_t numel, const torch::TensorOptions& options);
  void recycle(torch::Tensor& t);

  size_t bytes() const;  // kept now

 private:
  struct Kept {
    size_t bytes;
    c10::DataPtr ptr;
  };
  const size_t capacity_;
  mutable std::mutex mu_;
  std::deque<Kept> kept_;  // oldest first
};

}  // namespace cxxlaunch::runtime
