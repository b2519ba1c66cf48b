#include "runtime/flat/flat_param.h"

#include <torch/torch.h>

#include "common/error.h"
#include "runtime/deferred_init.h"

namespace cxxlaunch::runtime {

FlatParameter::FlatParameter(std::vector<torch::Tensor> params, std::vector<std::string> names,
                             int world_size, int rank)
    : params_(std::move(params)), names_(std::move(names)) {
  layOut(world_size, rank);
  full_ = torch::zeros({padded_}, params_.front().options());
  pointParamsIntoBuffer();
}

FlatParameter FlatParameter::layoutOf(std::vector<torch::Tensor> params,
                                      std::vector<std::string> names) {
  FlatParameter flat;
  flat.params_ = std::move(params);
  flat.names_ = std::move(names);
  flat.layOut(1, 0);
  flat.resident_ = false;
  return flat;
}

void FlatParameter::layOut(int world_size, int rank) {
  if (params_.empty()) throw InvalidArgument("a flat parameter needs at least one parameter");
  for (const auto& p : params_) {
    if (p.scalar_type() != params_.front().scalar_type() ||
        p.device() != params_.front().device()) {
      throw InvalidArgument("the parameters of one shard unit must share dtype and device ('" +
                            names_.front() + "' and '" + names_[offsets_.size()] + "' differ)");
    }
    offsets_.push_back(numel_);
    numel_ += p.numel();
  }
  const int64_t world = world_size;
  padded_ = (numel_ + world - 1) / world * world;
  shard_numel_ = padded_ / world;
  shard_begin_ = shard_numel_ * rank;
}

void FlatParameter::pointParamsIntoBuffer() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto view = full_.narrow(0, offsets_[i], params_[i].numel()).view(params_[i].sizes());
    if (isDeferred(params_[i])) {  // built under a DeferredInit: its values are made here
      materializeInto(params_[i], view);
    } else {
      view.copy_(params_[i]);
    }
    params_[i].set_data(view);
  }
}

void FlatParameter::convert(torch::ScalarType dtype) {
  if (!resident_) throw InvalidArgument("a released flat parameter cannot change its dtype");
  if (full_.scalar_type() == dtype) return;
  full_ = torch::zeros({padded_}, full_.options().dtype(dtype));
  pointParamsIntoBuffer();  // copy_ converts, rounding to nearest even
}

namespace {
// The storage's bytes replaced by `bytes` others, from the pool or from its own allocator (the
// CPU's, or LibTorch's CUDA caching allocator on the current device), its identity kept: every
// view and autograd's saved tensors point at it. The old bytes go to the pool, if any; their
// contents are not kept (a restore is followed by a gather).
void resizeStorage(const torch::Tensor& t, size_t bytes, BufferPool* pool) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  c10::Allocator* allocator = storage->allocator();
  const size_t old_bytes = storage->nbytes();
  c10::DataPtr old = storage->set_data_ptr(pool != nullptr ? pool->take(bytes, allocator)
                                                           : allocator->allocate(bytes));
  storage->set_nbytes(bytes);
  if (pool != nullptr) pool->give(std::move(old), old_bytes);
}
}  // namespace

void FlatParameter::release(BufferPool* pool) {
  if (!resident_) return;
  resizeStorage(full_, 0, pool);
  resident_ = false;
}

void FlatParameter::restore(BufferPool* pool) {
  if (resident_) return;
  resizeStorage(full_, static_cast<size_t>(padded_) * full_.element_size(), pool);
  resident_ = true;
}

size_t FlatParameter::residentBytes() const {
  return resident_ ? static_cast<size_t>(padded_) * full_.element_size() : 0;
}

}  // namespace cxxlaunch::runtime
