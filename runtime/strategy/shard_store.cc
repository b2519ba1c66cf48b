#include "runtime/strategy/shard_store.h"

#include <torch/torch.h>

#include "runtime/optim/device_kernels.h"

namespace cxxlaunch::runtime {

MemoryStore::MemoryStore(ShardOptimizer& optimizer, torch::TensorOptions options,
                         bool free_gradients_between_steps)
    : optimizer_(optimizer), options_(options), free_gradients_(free_gradients_between_steps) {}

std::vector<torch::Tensor> MemoryStore::state(ShardUnit& u) {
  return optimizer_.state(u.optimizerShard());
}

std::vector<torch::Tensor> MemoryStore::stateToOverwrite(ShardUnit& u) {
  return optimizer_.stateToOverwrite(u.optimizerShard());
}

torch::Tensor MemoryStore::gradShard(ShardUnit& u) {
  if (!u.gradientShard().defined()) {
    u.setGradientShard(torch::zeros({u.flat().shardNumel()}, options_));
  }
  return u.gradientShard();
}

void MemoryStore::addGradient(ShardUnit& u, const torch::Tensor& incoming) {
  const torch::Tensor& shard = u.gradientShard();
  if (!shard.defined()) {  // the first reduction since it was made or freed: one pass
    u.setGradientShard(torch::empty({u.flat().shardNumel()}, options_).copy_(incoming));
    return;
  }
  // cpu offload: the incoming shard comes down first
  shard.add_(incoming.to(shard.device()));
}

double MemoryStore::gradientSquares(ShardUnit& u) {
  return device_kernels::sumOfSquares(gradShard(u));
}

bool MemoryStore::gradientFinite(ShardUnit& u) { return device_kernels::allFinite(gradShard(u)); }

void MemoryStore::scaleGradient(ShardUnit& u, float factor) {
  device_kernels::scaleInPlace(gradShard(u), factor);
}

void MemoryStore::zeroGradient(ShardUnit& u) {
  if (free_gradients_) {
    u.setGradientShard(torch::Tensor());  // gradShard makes it again, zeroed
  } else if (u.gradientShard().defined()) {
    u.gradientShard().zero_();
  }
}

void MemoryStore::step(std::vector<ShardUnit>& units) {
  for (auto& u : units) {
    optimizer_.step(u.optimizerShard(), u.master().data_ptr<float>(),
                    gradShard(u).data_ptr<float>());
  }
}

}  // namespace cxxlaunch::runtime
