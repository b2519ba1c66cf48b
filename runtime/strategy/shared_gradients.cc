#include "runtime/strategy/shared_gradients.h"

#include <torch/torch.h>

namespace cxxlaunch::runtime {

SharedGradients::SharedGradients(Backend& backend, size_t count, size_t bytes) : bytes_(bytes) {
  for (size_t i = 0; i < count; ++i) {
    std::shared_ptr<void> memory = backend.sharedBuffer(bytes);
    if (!memory) break;  // the same answer on every rank
    slots_.push_back({std::move(memory)});
  }
}

torch::Tensor SharedGradients::lend(size_t unit, int64_t numel, torch::ScalarType dtype) {
  if (static_cast<size_t>(numel) * c10::elementSize(dtype) > bytes_) return {};
  for (auto& slot : slots_) {
    if (slot.owner != kFree) continue;
    slot.owner = unit;
    ++lends_;
    // The tensor keeps the memory mapped: it may outlive the strategy.
    return torch::from_blob(
               slot.memory.get(), {numel}, [keep = slot.memory](void*) {},
               torch::TensorOptions().dtype(dtype))
        .zero_();
  }
  return {};
}

void SharedGradients::giveBack(size_t unit) {
  for (auto& slot : slots_) {
    if (slot.owner == unit) slot.owner = kFree;
  }
}

}  // namespace cxxlaunch::runtime
