#pragma once
// SharedGradients: a few buffers of memory every rank maps (Backend::sharedBuffer: Gloo with
// every rank on this host), lent to ZeRO-2's units for their full gradient while it is filled
// and reduce-scattered. A reduce-scatter whose inputs all lie in such memory reads the peers'
// buffers where they are (comm/shm_collectives.h): no copy into the shared segment and out again,
// which was ZeRO-2's cost over DDP, whose buckets live there. A unit that finds no buffer free
// takes ordinary memory, and its reduction goes through the segment's slots as before.
//
// Thread-safety: none; the strategy's lock guards every call.

#include <torch/types.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "runtime/comm/backend.h"

namespace cxxlaunch::runtime {

class SharedGradients {
 public:
  // Registers `count` buffers of `bytes` each. A collective: every rank of `backend`, the same
  // arguments, at the same point. None when the backend shares no memory.
  SharedGradients(Backend& backend, size_t count, size_t bytes);

  bool empty() const { return slots_.empty(); }
  // `numel` zeros of `dtype` in a free buffer, lent to `unit`; undefined when none is free or
  // they would not fit.
  torch::Tensor lend(size_t unit, int64_t numel, torch::ScalarType dtype);
  // What `unit` was lent is free again (nothing when it was lent nothing).
  void giveBack(size_t unit);
  // How many times lend() lent a buffer.
  size_t lends() const { return lends_; }

 private:
  static constexpr size_t kFree = static_cast<size_t>(-1);
  struct Slot {
    std::shared_ptr<void> memory;
    size_t owner = kFree;
  };
  std::vector<Slot> slots_;
  size_t bytes_ = 0;
  size_t lends_ = 0;
};

}  // namespace cxxlaunch::runtime
