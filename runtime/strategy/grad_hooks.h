#pragma once
// The autograd post-hook the strategies put on each parameter's gradient accumulator: it runs
// once this backward's gradient has been added into param.grad(), which is where a strategy
// must read it (and where DDP's bucket view already holds it). Internal to runtime/strategy/.

#include <torch/csrc/autograd/function_hook.h>

#include <functional>
#include <utility>

namespace cxxlaunch::runtime {

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

}  // namespace cxxlaunch::runtime
