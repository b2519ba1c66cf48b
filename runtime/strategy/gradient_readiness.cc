#include "runtime/strategy/gradient_readiness.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include "common/error.h"

namespace cxxlaunch::runtime {
namespace {

// Autograd's post-hook on a gradient accumulator: runs once the gradient is in param.grad().
class AfterAccumulation final : public torch::autograd::FunctionPostHook {
 public:
  explicit AfterAccumulation(std::function<void()> ready) : ready_(std::move(ready)) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    ready_();
    return outputs;
  }

 private:
  std::function<void()> ready_;
};

}  // namespace

GradientReadiness::GradientReadiness(const std::vector<std::vector<torch::Tensor>>& groups,
                                     std::vector<size_t> launch_order, OnGradient on_gradient)
    : launch_order_(std::move(launch_order)), on_gradient_(std::move(on_gradient)) {
  first_.push_back(0);
  for (const auto& group : groups) {
    first_.push_back(first_.back() + group.size());
    missing_.push_back(group.size());
  }
  ready_.assign(first_.back(), 0);
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t m = 0; m < groups[g].size(); ++m) {
      auto accumulator = torch::autograd::impl::grad_accumulator(groups[g][m]);
      const uintptr_t key = accumulator->add_post_hook(
          std::make_unique<AfterAccumulation>([this, g, m] { on_gradient_(g, m); }));
      hooks_.push_back({std::move(accumulator), key});
    }
  }
}

GradientReadiness::~GradientReadiness() {
  for (auto& hook : hooks_) hook.accumulator->del_post_hook(hook.key);
}

bool GradientReadiness::markReady(size_t group, size_t member) {
  char& ready = ready_[first_[group] + member];
  if (ready != 0) {
    throw InvalidArgument(
        "a parameter got a second gradient before the gradients were reduced (two backward "
        "passes in one micro-step, a parameter used by two shard units, or reentrant "
        "checkpointing); run one backward per micro-step (several losses: backward their sum)");
  }
  ready = 1;
  return --missing_[group] == 0;
}

size_t GradientReadiness::nextToLaunch() {
  if (launched_ == launch_order_.size() || missing_[launch_order_[launched_]] != 0) return kNone;
  return launch_order_[launched_++];
}

std::vector<std::pair<size_t, size_t>> GradientReadiness::pending() const {
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t g = 0; g + 1 < first_.size(); ++g) {
    for (size_t k = first_[g]; k < first_[g + 1]; ++k) {
      if (ready_[k] == 0) out.emplace_back(g, k - first_[g]);
    }
  }
  return out;
}

void GradientReadiness::reset() {
  std::fill(ready_.begin(), ready_.end(), 0);
  for (size_t g = 0; g + 1 < first_.size(); ++g) missing_[g] = first_[g + 1] - first_[g];
  launched_ = 0;
}

}  // namespace cxxlaunch::runtime
