#include "runtime/strategy/shard_unit.h"

#include <torch/torch.h>

#include "runtime/comm/tensor_ops.h"
#include "runtime/strategy/shard_store.h"

namespace cxxlaunch::runtime {

// ---- parameters -----------------------------------------------------------------------------

void ShardUnit::unshard(const UnitContext& c) {
  TORCH_INTERNAL_ASSERT(state_ == State::kSharded, "unshard of unit '", name_, "' not sharded");
  // In the compute dtype: a bf16 gather moves half the bytes. On the device: a master offloaded
  // to the host is copied up (or the device's copy read).
  torch::Tensor input = device_shard_.defined()
                            ? device_shard_
                            : c.store->master(*this).to(flat_.full().device(), c.compute_dtype);
  flat_.restore(c.pool);
  gather_input_ = std::move(input);
  gather_ = c.shards->allGather(gather_input_.data_ptr(), flat_.full().data_ptr(),
                                static_cast<size_t>(flat_.shardNumel()), dtypeOf(flat_.full()));
  state_ = State::kGathering;
}

void ShardUnit::waitUnsharded() {
  if (state_ != State::kGathering) return;
  gather_->wait();
  gather_.reset();
  gather_input_ = torch::Tensor();
  state_ = State::kUnsharded;
}

void ShardUnit::prefetch(const UnitContext& c) {
  if (state_ == State::kSharded) unshard(c);
}

void ShardUnit::gatherNow(const UnitContext& c) {
  prefetch(c);
  waitUnsharded();
}

bool ShardUnit::reshardIfRouted(const UnitContext& c) {
  if (!c.policy.reshard_after_forward || !routed_) return false;
  waitUnsharded();  // never free memory a collective is writing
  if (state_ == State::kSharded) return true;
  if (c.policy.device_keeps_shard && !device_shard_.defined()) {
    device_shard_ = flat_.shard().clone();  // the gathers' input from now on (current values)
  }
  flat_.release(c.pool);
  state_ = State::kSharded;
  return true;
}

void ShardUnit::preForward(const UnitContext& c) {
  training_ = TrainingState::kForward;
  gatherNow(c);
}

bool ShardUnit::postForward(const UnitContext& c) {
  routed_ = true;
  training_ = TrainingState::kIdle;
  return reshardIfRouted(c);
}

void ShardUnit::preBackward(const UnitContext& c) {
  training_ = TrainingState::kPreBackward;
  gatherNow(c);
}

bool ShardUnit::postBackward(const UnitContext& c) {
  training_ = TrainingState::kPostBackward;
  return reshardIfRouted(c);
}

bool ShardUnit::rest(const UnitContext& c) {
  training_ = TrainingState::kIdle;
  return reshardIfRouted(c);
}

WorkPtr ShardUnit::afterStep(const UnitContext& c) {
  if (device_shard_.defined()) device_shard_.copy_(master_);
  if (c.policy.reshard_after_forward && routed_) return nullptr;  // gathered at its next use
  // The whole buffer is resident here: this rank's slice is the gather's input, in place.
  if (master_.defined() && master_.data_ptr() != flat_.shard().data_ptr()) {
    flat_.shard().copy_(master_);  // (nvme params: copied as they were updated)
  }
  if (!c.policy.shard_optimizer) return nullptr;  // every rank stepped everything
  return c.shards->allGather(flat_.shard().data_ptr(), flat_.full().data_ptr(),
                             static_cast<size_t>(flat_.shardNumel()), dtypeOf(flat_.full()));
}

void ShardUnit::drain() noexcept {
  for (auto* work : {&reduce_, &gather_}) {
    try {
      if (*work) (*work)->wait();
    } catch (...) {
      // Destruction must not throw; the error was or will be reported where it was waited on.
    }
  }
}

// ---- gradients ------------------------------------------------------------------------------

void ShardUnit::placeGradientsIn(torch::Tensor buffer) {
  grad_full_ = std::move(buffer);
  replicated_gradients_ = true;
  auto* base = static_cast<char*>(grad_full_.data_ptr());
  grad_places_.clear();
  for (size_t i = 0; i < flat_.params().size(); ++i) {
    const auto& p = flat_.params()[i];
    // A tensor over the buffer, not an autograd view: optimizers may detach_() a gradient.
    grad_places_.push_back(torch::from_blob(
        base + flat_.offset(i) * grad_full_.element_size(), p.sizes(),
        [keep = grad_full_](void*) {}, grad_full_.options()));
  }
}

void ShardUnit::fillGradientPlace(size_t index) {
  torch::NoGradGuard no_grad;
  const torch::Tensor& grad = flat_.params()[index].grad();
  torch::Tensor& place = grad_places_[index];
  if (grad.defined() && grad.data_ptr() == place.data_ptr()) return;  // accumulated there
  if (grad.defined()) {
    place.copy_(grad);
  } else {
    place.zero_();  // no gradient on this rank: contributes nothing
  }
}

void ShardUnit::pointGradientAtPlace(size_t index) {
  flat_.params()[index].mutable_grad() = grad_places_[index];
}

void ShardUnit::takeGradient(size_t index, const UnitContext& c) {
  torch::NoGradGuard no_grad;
  const torch::Tensor& param = flat_.params()[index];
  torch::Tensor& grad = param.mutable_grad();
  if (replicated_gradients_) {
    fillGradientPlace(index);
    grad = grad_places_[index];  // from now on autograd accumulates in the unit's buffer
    return;
  }
  const torch::ScalarType dtype = c.compute_dtype;
  // A unit of one parameter (an embedding, an output layer) takes autograd's gradient as its
  // full gradient: no second buffer of the unit's size, no copy.
  if (!grad_full_.defined() && flat_.params().size() == 1 && grad.defined() &&
      grad.is_contiguous() && grad.numel() == flat_.padded() && grad.scalar_type() == dtype &&
      grad.device() == flat_.full().device()) {
    grad_full_ = grad.detach().view({-1});
    grad = torch::Tensor();
  }
  if (!grad_full_.defined()) {
    const auto options = flat_.full().options().dtype(dtype);
    grad_full_ =
        c.pool ? c.pool->zeros(flat_.padded(), options) : torch::zeros({flat_.padded()}, options);
  }
  if (grad.defined()) {
    grad_full_.narrow(0, flat_.offset(index), param.numel()).view_as(param).copy_(grad);
  }
  grad = torch::Tensor();  // the full gradient lives on only in the unit's buffer
}

void ShardUnit::reduceGradients(const UnitContext& c) {
  if (replicated_gradients_) {
    reduce_ = c.every->allreduce(grad_full_.data_ptr(), static_cast<size_t>(flat_.padded()),
                                 dtypeOf(grad_full_), ReduceOp::kAvg);
    return;
  }
  grad_incoming_ = c.pool ? c.pool->empty(flat_.shardNumel(), grad_full_.options())
                          : torch::empty({flat_.shardNumel()}, grad_full_.options());
  reduce_ = c.shards->reduceScatter(grad_full_.data_ptr(), grad_incoming_.data_ptr(),
                                    static_cast<size_t>(flat_.shardNumel()), dtypeOf(grad_full_),
                                    ReduceOp::kAvg);
}

void ShardUnit::finishReduction(const UnitContext& c) {
  reduce_->wait();
  reduce_.reset();
  if (replicated_gradients_) {
    if (!grad_shard_.defined()) return;  // DDP: the parameters' gradients are the places
    const torch::Tensor mine = grad_full_.narrow(0, flat_.shardBegin(), flat_.shardNumel());
    // The fp32 shard is memory of its own under mixed precision and cpu offload.
    if (grad_shard_.data_ptr() != mine.data_ptr()) grad_shard_.copy_(mine);
    return;
  }
  if (c.replicas != nullptr) {  // hybrid: the average over the nodes of their nodes' averages
    c.replicas
        ->allreduce(grad_incoming_.data_ptr(), static_cast<size_t>(flat_.shardNumel()),
                    dtypeOf(grad_incoming_), ReduceOp::kAvg)
        ->wait();
  }
  c.store->addGradient(*this, grad_incoming_);  // accumulated across micro-steps
  dropGradientBuffers(c.pool);
}

void ShardUnit::zeroGradients(const UnitContext& c) {
  if (replicated_gradients_) {
    grad_full_.zero_();
  } else {
    c.store->zeroGradient(*this);
  }
}

void ShardUnit::useLentGradientBuffer(torch::Tensor zeroed) {
  grad_full_ = std::move(zeroed);
  full_gradient_lent_ = true;
}

void ShardUnit::dropGradientBuffers(BufferPool* pool) {
  if (pool) {
    pool->recycle(grad_incoming_);
    if (!full_gradient_lent_) pool->recycle(grad_full_);
  }
  grad_incoming_ = torch::Tensor();
  grad_full_ = torch::Tensor();
  full_gradient_lent_ = false;
}

size_t ShardUnit::gradientBufferBytes() const {
  return bytesOf(grad_full_) + bytesOf(grad_incoming_);
}

}  // namespace cxxlaunch::runtime
