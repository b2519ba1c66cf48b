#include "runtime/strategy/shard_unit.h"

#include <torch/torch.h>

#include "runtime/comm/tensor_ops.h"

namespace cxxlaunch::runtime {

void ShardUnit::unshard(Backend& group, torch::Tensor input, BufferPool* pool) {
  TORCH_INTERNAL_ASSERT(state_ == State::kSharded, "unshard of unit '", name_, "' not sharded");
  flat_.restore(pool);
  gather_input_ = std::move(input);
  gather_ = group.allGather(gather_input_.data_ptr(), flat_.full().data_ptr(),
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

void ShardUnit::reshard(BufferPool* pool) {
  waitUnsharded();
  if (state_ == State::kSharded) return;
  flat_.release(pool);
  state_ = State::kSharded;
}

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

void ShardUnit::takeGradient(size_t index, torch::ScalarType dtype, BufferPool* pool) {
  torch::NoGradGuard no_grad;
  const torch::Tensor& param = flat_.params()[index];
  torch::Tensor& grad = param.mutable_grad();
  if (replicated_gradients_) {
    fillGradientPlace(index);
    grad = grad_places_[index];  // from now on autograd accumulates in the unit's buffer
    return;
  }
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
        pool ? pool->zeros(flat_.padded(), options) : torch::zeros({flat_.padded()}, options);
  }
  if (grad.defined()) {
    grad_full_.narrow(0, flat_.offset(index), param.numel()).view_as(param).copy_(grad);
  }
  grad = torch::Tensor();  // the full gradient lives on only in the unit's buffer
}

void ShardUnit::reduceGradients(Backend& group, BufferPool* pool) {
  if (replicated_gradients_) {
    reduce_ = group.allreduce(grad_full_.data_ptr(), static_cast<size_t>(flat_.padded()),
                              dtypeOf(grad_full_), ReduceOp::kAvg);
    return;
  }
  grad_incoming_ = pool ? pool->empty(flat_.shardNumel(), grad_full_.options())
                        : torch::empty({flat_.shardNumel()}, grad_full_.options());
  reduce_ = group.reduceScatter(grad_full_.data_ptr(), grad_incoming_.data_ptr(),
                                static_cast<size_t>(flat_.shardNumel()), dtypeOf(grad_full_),
                                ReduceOp::kAvg);
}

void ShardUnit::finishReduction(Backend* replicas) {
  reduce_->wait();
  reduce_.reset();
  if (replicas == nullptr) return;
  // Hybrid: the average over the nodes of their nodes' averages.
  replicas
      ->allreduce(grad_incoming_.data_ptr(), static_cast<size_t>(flat_.shardNumel()),
                  dtypeOf(grad_incoming_), ReduceOp::kAvg)
      ->wait();
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

void ShardUnit::drain() noexcept {
  for (auto* work : {&reduce_, &gather_}) {
    try {
      if (*work) (*work)->wait();
    } catch (...) {
      // Destruction must not throw; the error was or will be reported where it was waited on.
    }
  }
}

size_t ShardUnit::gradientBufferBytes() const {
  return bytesOf(grad_full_) + bytesOf(grad_incoming_);
}

}  // namespace cxxlaunch::runtime
