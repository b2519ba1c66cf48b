// FusedAdamW against LibTorch's AdamW: the same parameters after several steps, the same state
// (a checkpoint of one loads into the other), and AdamW's own step where it cannot fuse.

#include "runtime/fused_adamw.h"

#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <sstream>

using namespace cxxlaunch::runtime;

namespace {

std::vector<torch::Tensor> makeParams(torch::Dtype dtype = torch::kFloat) {
  torch::manual_seed(7);
  std::vector<torch::Tensor> params;
  for (int64_t n : {1, 7, 1000, 40000}) {  // around the kernel's vector widths and chunks
    params.push_back(torch::randn({n}, dtype).requires_grad_(true));
  }
  params.push_back(torch::randn({33, 17}, dtype).requires_grad_(true));
  return params;
}

// The same pseudo-random gradients for step `step` on both sides.
void setGrads(std::vector<torch::Tensor>& params, int step) {
  torch::manual_seed(100 + step);
  for (auto& p : params) p.mutable_grad() = torch::randn_like(p);
}

double relativeDifference(const std::vector<torch::Tensor>& a,
                          const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double scale = b[i].abs().max().item<double>();
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

// Steps [from, to) of both optimizers, with the same gradients.
void stepBoth(torch::optim::Optimizer& a, std::vector<torch::Tensor>& a_params,
              torch::optim::Optimizer& b, std::vector<torch::Tensor>& b_params, int from, int to) {
  for (int s = from; s < to; ++s) {
    setGrads(a_params, s);
    setGrads(b_params, s);
    a.step();
    b.step();
  }
}

template <typename Optimizer>
std::vector<torch::Tensor> train(torch::optim::AdamWOptions options, int steps,
                                 torch::Dtype dtype = torch::kFloat) {
  auto params = makeParams(dtype);
  Optimizer optimizer(params, options);
  for (int s = 0; s < steps; ++s) {
    setGrads(params, s);
    optimizer.step();
  }
  return params;
}

}  // namespace

TEST_CASE("FusedAdamW matches AdamW to float precision", "[fused_adamw]") {
  const auto options = torch::optim::AdamWOptions(1e-2).weight_decay(0.1).betas({0.8, 0.95});
  const auto fused = train<FusedAdamW>(options, 20);
  const auto reference = train<torch::optim::AdamW>(options, 20);
  CHECK(relativeDifference(fused, reference) < 1e-6);
  // And the parameters did move: the comparison is not between two untouched copies.
  CHECK(relativeDifference(reference, makeParams()) > 1e-3);
}

TEST_CASE("A FusedAdamW checkpoint loads into AdamW and training goes on alike", "[fused_adamw]") {
  const auto options = torch::optim::AdamWOptions(1e-2);
  auto params = makeParams();
  FusedAdamW fused(params, options);
  for (int s = 0; s < 3; ++s) {
    setGrads(params, s);
    fused.step();
  }
  std::stringstream checkpoint;
  torch::save(fused, checkpoint);
  std::vector<torch::Tensor> copy;
  for (const auto& p : params) copy.push_back(p.detach().clone().requires_grad_(true));
  torch::optim::AdamW plain(copy, options);
  torch::load(plain, checkpoint);
  REQUIRE(plain.state().size() == params.size());
  stepBoth(fused, params, plain, copy, 3, 6);
  CHECK(relativeDifference(params, copy) < 1e-6);
}

TEST_CASE("Where it cannot fuse, FusedAdamW is AdamW exactly", "[fused_adamw]") {
  SECTION("amsgrad") {
    const auto options = torch::optim::AdamWOptions(1e-2).amsgrad(true);
    const auto fused = train<FusedAdamW>(options, 5);
    const auto reference = train<torch::optim::AdamW>(options, 5);
    CHECK(relativeDifference(fused, reference) == 0);
  }
  SECTION("moments in another layout, as a checkpoint may bring them") {
    const auto options = torch::optim::AdamWOptions(1e-2);
    auto params = makeParams();
    auto copy = makeParams();
    FusedAdamW fused(params, options);
    torch::optim::AdamW plain(copy, options);
    stepBoth(fused, params, plain, copy, 0, 1);
    for (auto& [key, state] : fused.state()) {
      auto& moments = static_cast<torch::optim::AdamWParamState&>(*state);
      if (moments.exp_avg().dim() == 2) {  // the same values, column-major
        moments.exp_avg(moments.exp_avg().t().contiguous().t());
        REQUIRE_FALSE(moments.exp_avg().is_contiguous());
      }
    }
    stepBoth(fused, params, plain, copy, 1, 4);
    CHECK(relativeDifference(params, copy) < 1e-6);
  }
  SECTION("float64 parameters") {
    const auto options = torch::optim::AdamWOptions(1e-2);
    const auto fused = train<FusedAdamW>(options, 5, torch::kDouble);
    const auto reference = train<torch::optim::AdamW>(options, 5, torch::kDouble);
    CHECK(relativeDifference(fused, reference) == 0);
  }
}
