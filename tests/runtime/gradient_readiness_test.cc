// GradientReadiness, the hooks and bookkeeping DDP and the sharded strategies share: which
// gradients a backward produced, complete groups in launch order, a second gradient refused.

#include "runtime/strategy/gradient_readiness.h"

#include <torch/torch.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <utility>
#include <vector>

#include "common/error.h"

using cxxlaunch::runtime::GradientReadiness;

TEST_CASE("GradientReadiness hooks each gradient once it is in param.grad()", "[readiness]") {
  torch::Tensor a = torch::ones({2}, torch::requires_grad()),
                b = torch::ones({3}, torch::requires_grad()),
                c = torch::ones({1}, torch::requires_grad());
  std::vector<std::pair<size_t, size_t>> seen;
  std::vector<double> grads_seen;
  {
    GradientReadiness readiness({{a, b}, {c}}, {1, 0}, [&](size_t g, size_t m) {
      seen.emplace_back(g, m);
      const torch::Tensor& param = g == 1 ? c : (m == 0 ? a : b);
      grads_seen.push_back(param.grad().defined() ? param.grad().sum().item<double>() : -1);
    });
    (a.sum() * 2 + b.sum() * 3 + c.sum() * 4).backward();
    std::sort(seen.begin(), seen.end());
    CHECK(seen == std::vector<std::pair<size_t, size_t>>{{0, 0}, {0, 1}, {1, 0}});
    std::sort(grads_seen.begin(), grads_seen.end());
    CHECK(grads_seen == std::vector<double>{4, 4, 9});  // 2 * 2 elements, 4 * 1, 3 * 3
  }
  seen.clear();
  (a.sum() + b.sum() + c.sum()).backward();  // the hooks went with the component
  CHECK(seen.empty());
}

TEST_CASE("GradientReadiness launches complete groups in launch order, once each", "[readiness]") {
  torch::Tensor a = torch::ones({2}, torch::requires_grad()),
                b = torch::ones({3}, torch::requires_grad()),
                c = torch::ones({1}, torch::requires_grad());
  GradientReadiness readiness({{a, b}, {c}}, {1, 0}, [](size_t, size_t) {});
  constexpr size_t kNone = GradientReadiness::kNone;
  for (int backward = 0; backward < 2; ++backward) {
    CHECK(readiness.pending() == std::vector<std::pair<size_t, size_t>>{{0, 0}, {0, 1}, {1, 0}});
    CHECK_FALSE(readiness.markReady(0, 1));
    CHECK(readiness.nextToLaunch() == kNone);  // group 1 launches first, and is not complete
    CHECK(readiness.markReady(1, 0));
    CHECK(readiness.nextToLaunch() == 1);
    CHECK(readiness.nextToLaunch() == kNone);  // group 0 still waits for a
    CHECK(readiness.pending() == std::vector<std::pair<size_t, size_t>>{{0, 0}});
    CHECK_THROWS_AS(readiness.markReady(0, 1), cxxlaunch::InvalidArgument);
    CHECK(readiness.markReady(0, 0));
    CHECK(readiness.nextToLaunch() == 0);
    CHECK(readiness.nextToLaunch() == kNone);
    CHECK(readiness.pending().empty());
    readiness.reset();
  }
}
