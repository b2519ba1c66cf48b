#pragma once
// BufferPool: freed buffers kept for the next allocation of their size, in size classes its owner
// declares from its schedule. A ZeRO-3 step gathers every unit twice and frees it after each use,
// and allocates each unit's full gradient and reduced shard once; all of them are of a few sizes,
// one per unit size. Host memory that goes back to the kernel costs a page fault per 4 KiB when it
// is allocated again (the kernel zeroes it first): on CPU that halved the step of a 100M-parameter
// model. A class keeps at most as many buffers of its size as the schedule has in use at once
// (the strategy counts them: sharded.cc), so the pool holds no more than the step's own peak of
// transients, and never a buffer of a size no one will ask for again.
// GPUs do not need it: LibTorch's CUDA caching allocator does the same.
//
// Thread-safety: every member may be called from any thread.

#include <c10/core/Allocator.h>
#include <torch/types.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <vector>

namespace cxxlaunch::runtime {

class BufferPool {
 public:
  BufferPool() = default;

  // Buffers of `bytes` are kept, at most `count` of them; classes of one size add up.
  void addClass(size_t bytes, size_t count);

  // `bytes` of memory: a kept buffer of exactly that size (the last given), else a new one from
  // `allocator`.
  c10::DataPtr take(size_t bytes, c10::Allocator* allocator);
  // Keeps `ptr` (of `bytes`) for a later take when its class has room; frees it otherwise.
  void give(c10::DataPtr ptr, size_t bytes);

  // A contiguous tensor (uninitialised, or zeroed) whose memory comes from take(), and its way
  // back: recycle() gives `t`'s memory to the pool when nothing else shares its storage, and
  // resets `t` either way.
  torch::Tensor empty(int64_t numel, const torch::TensorOptions& options);
  torch::Tensor zeros(int64_t numel, const torch::TensorOptions& options) {
    return empty(numel, options).zero_();
  }
  void recycle(torch::Tensor& t);

  size_t bytes() const;     // kept now
  size_t capacity() const;  // kept at most: every class full

 private:
  struct SizeClass {
    size_t count = 0;
    std::vector<c10::DataPtr> kept;  // the most recently given last: the warmest in cache
  };
  mutable std::mutex mu_;
  std::map<size_t, SizeClass> classes_;  // by bytes
};

}  // namespace cxxlaunch::runtime
