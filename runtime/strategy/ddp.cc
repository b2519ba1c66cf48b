#include "runtime/strategy/ddp.h"

#include <torch/torch.h>

#include <functional>

#include "common/error.h"
#include "runtime/comm/tensor_ops.h"
#include "runtime/strategy/model_state.h"
#include "runtime/strategy/unit_plan.h"

namespace cxxlaunch::runtime {

DType dtypeOf(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat:
      return DType::kFloat32;
    case at::kDouble:
      return DType::kFloat64;
    case at::kHalf:
      return DType::kFloat16;
    case at::kBFloat16:
      return DType::kBFloat16;
    case at::kInt:
      return DType::kInt32;
    case at::kLong:
      return DType::kInt64;
    case at::kByte:
      return DType::kUInt8;
    default:
      throw InvalidArgument(std::string("collectives do not carry tensors of type ") +
                            c10::toString(tensor.scalar_type()));
  }
}

WorkPtr allreduce(Backend& backend, at::Tensor& tensor, ReduceOp op) {
  TORCH_CHECK(tensor.is_contiguous(), "allreduce needs a contiguous tensor");
  return backend.allreduce(tensor.data_ptr(), static_cast<size_t>(tensor.numel()), dtypeOf(tensor),
                           op);
}

WorkPtr broadcast(Backend& backend, at::Tensor& tensor, int root) {
  TORCH_CHECK(tensor.is_contiguous(), "broadcast needs a contiguous tensor");
  return backend.broadcast(tensor.data_ptr(), static_cast<size_t>(tensor.numel()), dtypeOf(tensor),
                           root);
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 std::shared_ptr<Backend> backend,
                                                 DdpOptions options)
    : module_(std::move(module)),
      backend_(std::move(backend)),
      find_unused_(options.find_unused_parameters) {
  if (options.broadcast_initial_state) broadcastState(0);
  const UnitPlan plan =
      planUnits(*module_, {.module_units = false, .bucket_bytes = options.bucket_bytes});
  std::vector<std::vector<torch::Tensor>> groups;
  for (const auto& unit : plan.units) {
    Bucket& bucket = buckets_.emplace_back();
    int64_t offset = 0;
    for (const auto& param : unit.params) {
      slots_.push_back({.param = param, .offset = offset});
      bucket.slots.push_back(slots_.size() - 1);
      offset += param.numel();
    }
    groups.push_back(unit.params);
  }
  allocateBuckets();
  for (auto& bucket : buckets_) {
    for (size_t s : bucket.slots) {
      Slot& slot = slots_[s];
      // A tensor over the bucket's memory, not an autograd view of it: optimizers may detach_()
      // and zero_() a gradient in place. The deleter keeps the bucket alive.
      slot.place = torch::from_blob(
          static_cast<char*>(bucket.flat.data_ptr()) + slot.offset * bucket.flat.element_size(),
          slot.param.sizes(), [keep = bucket.flat](void*) {}, bucket.flat.options());
    }
  }
  used_ = torch::zeros({static_cast<int64_t>(slots_.size())}, torch::kInt);
  readiness_ = std::make_unique<GradientReadiness>(
      groups, plan.reduce_order, [this](size_t b, size_t m) { onGradientReady(b, m); });
}

DistributedDataParallel::~DistributedDataParallel() {
  readiness_.reset();  // no hook runs from here on
  for (auto& bucket : buckets_) {
    if (bucket.work) {
      try {
        bucket.work->wait();
      } catch (...) {
        // Destruction must not throw; the error was or will be reported by finishBackward.
      }
    }
  }
}

void DistributedDataParallel::allocateBuckets() {
  // Each bucket's place in one block, 64-byte aligned (as LibTorch aligns its own tensors).
  std::vector<int64_t> numels;
  std::vector<size_t> offsets;
  size_t total = 0;
  bool on_cpu = true;
  for (const auto& bucket : buckets_) {
    const auto& first = slots_[bucket.slots.front()].param;
    on_cpu = on_cpu && first.device().is_cpu();
    int64_t numel = 0;
    for (size_t s : bucket.slots) numel += slots_[s].param.numel();
    numels.push_back(numel);
    offsets.push_back(total);
    total += (static_cast<size_t>(numel) * first.element_size() + 63) / 64 * 64;
  }
  // Where the backend has memory the ranks share, the buckets live there: the all-reduce reads
  // the peers' buckets in place and writes the average into every rank's, with no copy. The
  // same decision on every rank (same model), so that all of them ask.
  shared_ = on_cpu && !buckets_.empty() && backend_->worldSize() > 1 ? backend_->sharedBuffer(total)
                                                                     : nullptr;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const auto& options = slots_[buckets_[b].slots.front()].param.options();
    buckets_[b].flat = shared_ ? torch::from_blob(
                                     static_cast<char*>(shared_.get()) + offsets[b], {numels[b]},
                                     [keep = shared_](void*) {}, options)
                               : torch::zeros({numels[b]}, options);
  }
}

void DistributedDataParallel::broadcastState(int root) {
  broadcastModuleState(*backend_, *module_, root);
}

bool DistributedDataParallel::livesInBucket(const Slot& slot) {
  const auto& grad = slot.param.grad();
  return grad.defined() && grad.data_ptr() == slot.place.data_ptr();
}

void DistributedDataParallel::moveIntoBucket(Slot& slot) {
  if (livesInBucket(slot)) return;
  torch::NoGradGuard no_grad;
  auto& grad = slot.param.mutable_grad();
  if (grad.defined()) {
    slot.place.copy_(grad);
  } else {
    slot.place.zero_();  // unused in this forward: contributes nothing
  }
}

// Runs after autograd accumulated this backward's gradient into param.grad().
void DistributedDataParallel::onGradientReady(size_t bucket, size_t member) {
  if (!sync_) return;
  std::lock_guard<std::mutex> lock(mu_);
  readiness_->markReady(bucket, member);
  Slot& slot = slots_[buckets_[bucket].slots[member]];
  moveIntoBucket(slot);
  slot.param.mutable_grad() = slot.place;  // from now on autograd accumulates in the bucket
  slot.used = true;
  launchReadyBuckets();
}

void DistributedDataParallel::launchReadyBuckets() {
  // In bucket order on every rank, so that the collectives match across ranks.
  for (size_t b; (b = readiness_->nextToLaunch()) != GradientReadiness::kNone;) {
    buckets_[b].work = allreduce(*backend_, buckets_[b].flat, ReduceOp::kAvg);
  }
}

void DistributedDataParallel::finishBackward() {
  if (!sync_) return;
  std::vector<WorkPtr> works;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [b, m] : readiness_->pending()) {
      moveIntoBucket(slots_[buckets_[b].slots[m]]);  // accumulated in noSync steps, or zero
      readiness_->markReady(b, m);
    }
    launchReadyBuckets();
    for (auto& bucket : buckets_) works.push_back(bucket.work);
    auto used = used_.accessor<int32_t, 1>();
    for (size_t i = 0; i < slots_.size(); ++i) {
      used[static_cast<int64_t>(i)] = find_unused_ ? slots_[i].used : 1;
    }
    if (find_unused_) works.push_back(allreduce(*backend_, used_, ReduceOp::kMax));
  }
  for (auto& work : works) work->wait();
  std::lock_guard<std::mutex> lock(mu_);
  auto used_anywhere = used_.accessor<int32_t, 1>();
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    slot.used = false;
    // The average is in place; a parameter no rank used keeps its gradient as it was.
    if (used_anywhere[static_cast<int64_t>(i)] != 0) slot.param.mutable_grad() = slot.place;
  }
  for (auto& bucket : buckets_) bucket.work.reset();
  readiness_->reset();
}

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& ddp)
    : ddp_(ddp), previous_(ddp.sync_) {
  ddp_.sync_ = false;
}

DistributedDataParallel::NoSync::~NoSync() { ddp_.sync_ = previous_; }

}  // namespace cxxlaunch::runtime
