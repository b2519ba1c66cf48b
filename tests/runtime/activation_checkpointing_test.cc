// checkpointActivations against the plain forward: the same outputs and gradients (inputs and
// parameters), random ops replayed identically in the recomputation, no graph kept; and
// unitForward on a block marked for recomputation.

#include <torch/torch.h>

#include <catch2/catch.hpp>

#include "runtime/strategy/unit.h"
#include "runtime/strategy/unit_registry.h"

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

namespace {

// forward(x, scale, k): x's path through a parameter, `scale` and `k` constants.
struct ScaledImpl : torch::nn::Module {
  ScaledImpl() : fc(register_module("fc", torch::nn::Linear(4, 4))) {}
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& scale, int64_t k) {
    ++calls;
    return torch::tanh(fc(x)) * scale * k;
  }
  torch::nn::Linear fc;
  int calls = 0;
};
TORCH_MODULE(Scaled);

// forward(n, x): its first argument is no tensor.
struct CountFirstImpl : torch::nn::Module {
  torch::Tensor forward(int64_t n, const torch::Tensor& x) { return x * n; }
};
TORCH_MODULE(CountFirst);

}  // namespace

TEST_CASE("unitForward recomputes a checkpointed block with copies of its constants",
          "[checkpointing]") {
  torch::manual_seed(5);
  Scaled block;
  auto x = torch::randn({2, 4}).requires_grad_();
  auto plain = unitForward(block, x, torch::full({}, 3.0), 2);
  plain.sum().backward();
  const torch::Tensor input_grad = x.grad().clone(), weight_grad = block->fc->weight.grad().clone();
  CHECK(block->calls == 1);  // not checkpointed: one forward, nothing recomputed

  x.mutable_grad().zero_();
  block->fc->weight.mutable_grad().zero_();
  cxxlaunch::runtime::detail::setCheckpointActivations(block.ptr().get(), true);
  // The constant is a temporary: backward's recomputation must use a copy of its own.
  auto checkpointed = unitForward(block, x, torch::full({}, 3.0), 2);
  CHECK(block->calls == 2);
  checkpointed.sum().backward();
  CHECK(block->calls == 3);  // recomputed in backward
  CHECK(torch::equal(checkpointed.detach(), plain.detach()));
  CHECK(torch::equal(x.grad(), input_grad));
  CHECK(torch::equal(block->fc->weight.grad(), weight_grad));

  // What it cannot recompute is one clear error, and only where the block is checkpointed.
  auto trained_scale = torch::full({}, 3.0).requires_grad_();
  CHECK_THROWS_WITH(
      unitForward(block, x, trained_scale, 2),
      Catch::Contains("activation checkpointing of ScaledImpl") &&
          Catch::Contains("only its forward's first argument may require a gradient"));
  CountFirst first;
  cxxlaunch::runtime::detail::setCheckpointActivations(first.ptr().get(), true);
  CHECK_THROWS_WITH(unitForward(first, 2, x),
                    Catch::Contains("its forward's first argument must be the tensor"));
  cxxlaunch::runtime::detail::setCheckpointActivations(block.ptr().get(), false);
  cxxlaunch::runtime::detail::setCheckpointActivations(first.ptr().get(), false);
  CHECK_NOTHROW(unitForward(block, x, trained_scale, 2));
  CHECK_NOTHROW(unitForward(first, 2, x));
}
