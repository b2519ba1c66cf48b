#include "runtime/strategy/shard_store.h"

#include <torch/torch.h>

#include "runtime/optim/device_kernels.h"

namespace cxxlaunch::runtime {

MemoryStore::MemoryStore(ShardOptimizer& optimizer, torch::TensorOptions options,
                         bool free_gradients_between_steps)
    : optimizer_(optimizer), options_(options), free_gradients_(free_gradients_between_steps) {}

std::vector<torch::Tensor> MemoryStore::state(ShardUnit& u) {
  return optimizer_.state(u.optimizer_shard);
}

std::vector<torch::Tensor> MemoryStore::stateToOverwrite(ShardUnit& u) {
  return optimizer_.stateToOverwrite(u.optimizer_shard);
}

torch::Tensor& MemoryStore::gradShard(ShardUnit& u) {
  if (!u.grad_shard.defined()) u.grad_shard = torch::zeros({u.flat().shardNumel()}, options_);
  return u.grad_shard;
}

void MemoryStore::addGradient(ShardUnit& u, const torch::Tensor& incoming) {
  if (!u.grad_shard.defined()) {  // the first reduction since it was made or freed: one pass
    u.grad_shard = torch::empty({u.flat().shardNumel()}, options_).copy_(incoming);
    return;
  }
  // cpu offload: the incoming shard comes down first
  u.grad_shard.add_(incoming.to(u.grad_shard.device()));
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
    u.grad_shard = torch::Tensor();  // gradShard makes it again, zeroed
  } else if (u.grad_shard.defined()) {
    u.grad_shard.zero_();
  }
}

void MemoryStore::step(std::vector<ShardUnit>& units) {
  for (auto& u : units) {
    optimizer_.step(u.optimizer_shard, u.master.data_ptr<float>(), gradShard(u).data_ptr<float>());
  }
}

}  // namespace cxxlaunch::runtime
