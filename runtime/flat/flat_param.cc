#include "runtime/flat/flat_param.h"

#include <ATen/native/Resize.h>
#include <torch/torch.h>

#include "common/error.h"

namespace cxxlaunch::runtime {

FlatParameter::FlatParameter(std::vector<torch::Tensor> params, std::vector<std::string> names,
                             int world_size, int rank)
    : params_(std::move(params)), names_(std::move(names)) {
  if (params_.empty()) throw InvalidArgument("a flat parameter needs at least one parameter");
  const auto options = params_.front().options();
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
  full_ = torch::zeros({padded_}, options);
  pointParamsIntoBuffer();
}

void FlatParameter::pointParamsIntoBuffer() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto view = full_.narrow(0, offsets_[i], params_[i].numel()).view(params_[i].sizes());
    view.copy_(params_[i]);
    params_[i].set_data(view);
  }
}

void FlatParameter::convert(torch::ScalarType dtype) {
  if (!resident_) throw InvalidArgument("a released flat parameter cannot change its dtype");
  if (full_.scalar_type() == dtype) return;
  full_ = torch::zeros({padded_}, full_.options().dtype(dtype));
  pointParamsIntoBuffer();  // copy_ converts, rounding to nearest even
}

void FlatParameter::release() {
  if (!resident_) return;
  // The storage keeps its identity (every view points at it); only its bytes go.
  at::native::resize_bytes_cpu(full_.storage().unsafeGetStorageImpl(), 0);
  resident_ = false;
}

void FlatParameter::restore() {
  if (resident_) return;
  at::native::resize_bytes_cpu(full_.storage().unsafeGetStorageImpl(),
                               static_cast<size_t>(padded_) * full_.element_size());
  resident_ = true;
}

size_t FlatParameter::residentBytes() const {
  return resident_ ? static_cast<size_t>(padded_) * full_.element_size() : 0;
}

}  // namespace cxxlaunch::runtime
