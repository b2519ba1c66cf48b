// checkpointActivations against the plain forward: the same outputs and gradients (inputs and
// parameters), random ops replayed identically in the recomputation, no graph kept.

#include <torch/torch.h>

#include <catch2/catch.hpp>

#include "runtime/strategy/unit.h"

using namespace cxxlaunch::runtime;

namespace {

struct Grads {
  torch::Tensor output, input_grad, weight_grad;
};

Grads run(bool checkpointed) {
  torch::manual_seed(3);
  torch::nn::Linear fc(8, 8);
  torch::nn::Dropout dropout(0.5);
  auto x = torch::randn({4, 8}).requires_grad_();
  auto block = [&](const torch::Tensor& h) { return dropout(torch::gelu(fc(h))) * h; };
  torch::manual_seed(11);  // the dropout mask's draws
  auto y = checkpointed ? checkpointActivations(block, x) : block(x);
  (void)torch::randn({100});  // the generator moves on before backward
  y.pow(2).sum().backward();
  return {y.detach(), x.grad(), fc->weight.grad()};
}

}  // namespace

TEST_CASE("A checkpointed forward gives the plain forward's output and gradients",
          "[checkpointing]") {
  const Grads plain = run(false), checkpointed = run(true);
  CHECK(torch::equal(checkpointed.output, plain.output));
  CHECK(torch::equal(checkpointed.input_grad, plain.input_grad));
  CHECK(torch::equal(checkpointed.weight_grad, plain.weight_grad));
}

TEST_CASE("A checkpointed forward keeps no graph of its own", "[checkpointing]") {
  torch::nn::Linear fc(4, 4);
  auto x = torch::randn({2, 4}).requires_grad_();
  auto y = checkpointActivations([&](const torch::Tensor& h) { return torch::tanh(fc(h)); }, x);
  REQUIRE(y.grad_fn() != nullptr);
  CHECK(y.grad_fn()->name() == "cxxlaunch::CheckpointBackward");
  // Its only edge leads to the input: tanh's and linear's nodes (and what they save) do not exist.
  REQUIRE(y.grad_fn()->num_outputs() == 1);
  CHECK(y.grad_fn()->next_edge(0).function == torch::autograd::impl::gradient_edge(x).function);
  // Without autograd it is the plain forward.
  torch::NoGradGuard no_grad;
  auto z = checkpointActivations([&](const torch::Tensor& h) { return fc(h); }, x);
  CHECK(z.grad_fn() == nullptr);
}
