#include "runtime/fused_adamw.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#include "runtime/kernels/cpu/optimizers.h"
#include "runtime/optim/param_state_key.h"

namespace cxxlaunch::runtime {

bool FusedAdamW::fusable() const {
  for (const auto& group : param_groups()) {
    if (static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad()) return false;
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      std::vector<const torch::Tensor*> tensors = {&p, &p.grad()};
      if (auto it = state_.find(paramStateKey(state_, p)); it != state_.end()) {
        // Moments loaded from a checkpoint may come in another layout.
        const auto& moments = static_cast<const torch::optim::AdamWParamState&>(*it->second);
        tensors.push_back(&moments.exp_avg());
        tensors.push_back(&moments.exp_avg_sq());
      }
      for (const auto* t : tensors) {
        if (t->device().type() != at::kCPU || t->scalar_type() != at::kFloat ||
            !t->is_contiguous() || t->is_sparse()) {
          return false;
        }
      }
    }
  }
  return true;
}

torch::optim::AdamWParamState& FusedAdamW::stateFor(const torch::Tensor& param) {
  auto& slot = state_[paramStateKey(state_, param)];
  if (!slot) {
    auto fresh = std::make_unique<torch::optim::AdamWParamState>();
    fresh->step(0);
    fresh->exp_avg(torch::zeros_like(param, at::MemoryFormat::Contiguous));
    fresh->exp_avg_sq(torch::zeros_like(param, at::MemoryFormat::Contiguous));
    slot = std::move(fresh);
  }
  return static_cast<torch::optim::AdamWParamState&>(*slot);
}

torch::Tensor FusedAdamW::step(LossClosure closure) {
  if (!fusable()) return torch::optim::AdamW::step(std::move(closure));
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    const double beta1 = std::get<0>(options.betas()), beta2 = std::get<1>(options.betas());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& state = stateFor(p);
      state.step(state.step() + 1);
      const auto t = static_cast<double>(state.step());
      const double bias_correction1 = 1 - std::pow(beta1, t);
      const double bias_correction2 = 1 - std::pow(beta2, t);
      const kernels::AdamScalars s{
          .decay = static_cast<float>(1 - options.lr() * options.weight_decay()),
          .l2 = 0,
          .beta1 = static_cast<float>(beta1),
          .beta2 = static_cast<float>(beta2),
          .one_minus_beta1 = static_cast<float>(1 - beta1),
          .one_minus_beta2 = static_cast<float>(1 - beta2),
          .bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2)),
          .eps = static_cast<float>(options.eps()),
          .step_size = static_cast<float>(options.lr() / bias_correction1)};
      float* param = p.data_ptr<float>();
      const float* grad = p.grad().data_ptr<float>();
      float* exp_avg = state.exp_avg().data_ptr<float>();
      float* exp_avg_sq = state.exp_avg_sq().data_ptr<float>();
      // Chunks of 32K elements: big enough to amortise a task, small enough to share out.
      at::parallel_for(0, p.numel(), 32768, [&](int64_t begin, int64_t end) {
        kernels::adamStep(param + begin, grad + begin, exp_avg + begin, exp_avg_sq + begin,
                          end - begin, s);
      });
    }
  }
  return loss;
}

}  // namespace cxxlaunch::runtime
