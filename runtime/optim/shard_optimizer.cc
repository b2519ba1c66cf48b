#include "runtime/optim/shard_optimizer.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/host_memory.h"
#include "runtime/optim/device_kernels.h"
#include "tensorfile/checkpoint_schema.h"

namespace cxxlaunch::runtime {
namespace {

template <typename Options>
const Options* optionsAs(const torch::optim::OptimizerParamGroup& group) {
  return dynamic_cast<const Options*>(&group.options());
}

kernels::AdamScalars adamScalars(double lr, std::tuple<double, double> betas, double eps,
                                 double weight_decay, bool decoupled, int64_t step) {
  const double beta1 = std::get<0>(betas), beta2 = std::get<1>(betas);
  const auto t = static_cast<double>(step);
  return {.decay = static_cast<float>(decoupled ? 1 - lr * weight_decay : 1),
          .l2 = static_cast<float>(decoupled ? 0 : weight_decay),
          .beta1 = static_cast<float>(beta1),
          .beta2 = static_cast<float>(beta2),
          .one_minus_beta1 = static_cast<float>(1 - beta1),
          .one_minus_beta2 = static_cast<float>(1 - beta2),
          .bias_correction2_sqrt = static_cast<float>(std::sqrt(1 - std::pow(beta2, t))),
          .eps = static_cast<float>(eps),
          .step_size = static_cast<float>(lr / (1 - std::pow(beta1, t)))};
}

}  // namespace

ShardOptimizer::ShardOptimizer(torch::optim::Optimizer& optimizer) : optimizer_(optimizer) {
  const auto& groups = optimizer.param_groups();
  if (groups.empty()) throw InvalidArgument("the optimizer has no parameter groups");
  const auto& first = groups.front();
  if (optionsAs<torch::optim::AdamWOptions>(first) != nullptr) {
    kind_ = Kind::kAdamW;
  } else if (optionsAs<torch::optim::AdamOptions>(first) != nullptr) {
    kind_ = Kind::kAdam;
  } else if (optionsAs<torch::optim::SGDOptions>(first) != nullptr) {
    kind_ = Kind::kSgd;
  } else {
    throw InvalidArgument(
        "sharded strategies and mixed precision run the optimizer on flat fp32 shards and can "
        "do so for torch::optim::AdamW, Adam and SGD (and cxxlaunch::runtime::FusedAdamW); "
        "build one of those, or train with strategy ddp in fp32 (mixed_precision no)");
  }
  for (const auto& group : groups) {
    if (const auto* o = optionsAs<torch::optim::AdamWOptions>(group); o && o->amsgrad()) {
      throw InvalidArgument(
          "amsgrad cannot run on shards yet; turn it off or use strategy ddp in fp32");
    }
    if (const auto* o = optionsAs<torch::optim::AdamOptions>(group); o && o->amsgrad()) {
      throw InvalidArgument(
          "amsgrad cannot run on shards yet; turn it off or use strategy ddp in fp32");
    }
  }
}

const char* ShardOptimizer::name() const {
  switch (kind_) {
    case Kind::kAdamW:
      return "AdamW";
    case Kind::kAdam:
      return "Adam";
    case Kind::kSgd:
      return "SGD";
  }
  return "?";
}

size_t ShardOptimizer::groupOf(const torch::Tensor& param) const {
  const auto& groups = optimizer_.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const auto& p : groups[g].params()) {
      if (p.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return g;
    }
  }
  throw InvalidArgument(
      "a trainable parameter of the model is in no parameter group of the optimizer; build the "
      "optimizer over model->parameters(), or freeze the parameter (requires_grad false)");
}

size_t ShardOptimizer::stateArrays() const {
  if (kind_ != Kind::kSgd) return 2;
  for (const auto& group : optimizer_.param_groups()) {
    if (optionsAs<torch::optim::SGDOptions>(group)->momentum() != 0) return 1;
  }
  return 0;
}

size_t ShardOptimizer::addShard(int64_t numel, std::vector<Segment> segments, c10::Device device,
                                bool own_state) {
  shards_.push_back(Shard{numel, std::move(segments), device, own_state, {}});
  return shards_.size() - 1;
}

std::vector<std::string> ShardOptimizer::stateNames() const {
  if (kind_ != Kind::kSgd) return {tensorfile::kExpAvgArray, tensorfile::kExpAvgSqArray};
  if (stateArrays() == 1) return {tensorfile::kMomentumBufferArray};
  return {};
}

std::vector<torch::Tensor> ShardOptimizer::state(size_t index) {
  return allocatedState(index, /*zeroed=*/true);
}

std::vector<torch::Tensor> ShardOptimizer::stateToOverwrite(size_t index) {
  // Zeroing first would write the memory twice (and fault it in on the zeroing's one thread).
  return allocatedState(index, /*zeroed=*/false);
}

const std::vector<torch::Tensor>& ShardOptimizer::allocatedState(size_t index, bool zeroed) {
  Shard& shard = shards_[index];
  if (shard.own_state && shard.state.empty()) {
    const auto options = torch::TensorOptions(shard.device);
    for (size_t i = 0; i < stateArrays(); ++i) {
      auto t = torch::empty({shard.numel}, options);
      if (zeroed) {
        // Faulted in at once (and as huge pages) first: zeroing page by page is slow in a VM.
        if (t.is_cpu()) prefaultForWriting(t.data_ptr(), static_cast<size_t>(t.nbytes()));
        t.zero_();
      }
      shard.state.push_back(std::move(t));
    }
  }
  return shard.state;
}

void ShardOptimizer::step(size_t index, float* param, const float* grad, float* const* state) {
  stepRange(index, 0, shards_[index].numel, param, grad, state);
}

void ShardOptimizer::stepRange(size_t index, int64_t begin, int64_t end, float* param,
                               const float* grad, float* const* state) {
  Shard& shard = shards_[index];
  allocatedState(index, /*zeroed=*/true);
  std::vector<float*> own;
  for (auto& t : shard.state) own.push_back(t.data_ptr<float>() + begin);
  if (state == nullptr) state = own.data();
  const auto& groups = optimizer_.param_groups();
  for (const Segment& seg : shard.segments) {
    const int64_t from = std::max(seg.begin, begin), to = std::min(seg.end, end);
    if (from >= to) continue;
    const auto& group = groups[seg.group];
    float* p = param + (from - begin);
    const float* g = grad + (from - begin);
    if (kind_ == Kind::kSgd) {
      const auto& o = *optionsAs<torch::optim::SGDOptions>(group);
      const kernels::SgdScalars s{.lr = static_cast<float>(o.lr()),
                                  .momentum = static_cast<float>(o.momentum()),
                                  .dampening = static_cast<float>(o.dampening()),
                                  .weight_decay = static_cast<float>(o.weight_decay()),
                                  .nesterov = o.nesterov(),
                                  .first_step = steps_ == 1};
      float* buf = o.momentum() != 0 ? state[0] + (from - begin) : nullptr;
      device_kernels::sgdStep(shard.device, p, g, buf, to - from, s);
      continue;
    }
    kernels::AdamScalars s;
    if (kind_ == Kind::kAdamW) {
      const auto& o = *optionsAs<torch::optim::AdamWOptions>(group);
      s = adamScalars(o.lr(), o.betas(), o.eps(), o.weight_decay(), true, steps_);
    } else {
      const auto& o = *optionsAs<torch::optim::AdamOptions>(group);
      s = adamScalars(o.lr(), o.betas(), o.eps(), o.weight_decay(), false, steps_);
    }
    float* m = state[0] + (from - begin);
    float* v = state[1] + (from - begin);
    device_kernels::adamStep(shard.device, p, g, m, v, to - from, s);
  }
}

size_t ShardOptimizer::stateBytes() const {
  size_t bytes = 0;
  for (const auto& shard : shards_) {
    for (const auto& t : shard.state) bytes += static_cast<size_t>(t.numel()) * t.element_size();
  }
  return bytes;
}

}  // namespace cxxlaunch::runtime
