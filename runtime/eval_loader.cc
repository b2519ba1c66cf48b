#include <algorithm>

#include "runtime/accelerator.h"

namespace cxxlaunch::runtime {

int64_t EvalSampler::batchesOf(size_t examples, size_t world, size_t batch_size) {
  const size_t per_round = world * batch_size;
  return static_cast<int64_t>((examples + per_round - 1) / per_round);
}

EvalSampler::EvalSampler(size_t examples, size_t world, size_t rank, size_t batch_size) {
  const auto batches = static_cast<size_t>(batchesOf(examples, world, batch_size));
  indices_.reserve(batches * batch_size);
  for (size_t k = 0; k < batches; ++k) {
    const size_t first = (k * world + rank) * batch_size;
    for (size_t j = 0; j < batch_size; ++j) indices_.push_back((first + j) % examples);
  }
}

torch::optional<std::vector<size_t>> EvalSampler::next(size_t batch_size) {
  if (next_ >= indices_.size()) return torch::nullopt;
  const size_t end = std::min(indices_.size(), next_ + batch_size);
  std::vector<size_t> batch(indices_.begin() + static_cast<std::ptrdiff_t>(next_),
                            indices_.begin() + static_cast<std::ptrdiff_t>(end));
  next_ = end;
  return batch;
}

}  // namespace cxxlaunch::runtime
