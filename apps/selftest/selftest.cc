// cxxlaunch_selftest: the worker `cxxlaunch test` runs through the launcher to tell a user
// whether their setup is ready. Every rank:
//   1. connects to the others (the backend the configuration chose),
//   2. checks each collective against its closed form (rank-derived data, exact in fp32),
//   3. trains a tiny model with the configured strategy, precision and clipping for a few steps
//      and compares the parameters with one process training on the whole batch with the same
//      precision (autocast) and clipping: a relative difference below 1e-6 in fp32, below 2e-2
//      (a few of bf16's or fp16's steps) with mixed precision. The config's wrap class names
//      (fsdp_transformer_layer_cls_to_wrap) are its model's, not the test model's: the test
//      model's Linear layers are the units instead, and a line says so.
// Prints one line per check (rank 0) and exits 0 when all pass, 1 when one fails, 2 for bad
// settings, 3 when the ranks cannot connect.

#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>

#include "common/command_line.h"
#include "common/env_names.h"
#include "common/error.h"
#include "runtime/accelerator.h"
#include "runtime/comm/backend.h"
#include "runtime/precision/policy.h"
#include "runtime/world.h"

using namespace cxxlaunch;
using namespace cxxlaunch::runtime;

namespace {

bool checkCollectives(Accelerator& acc) {
  Backend& b = acc.backend();
  const int n = b.worldSize(), r = b.rank();
  constexpr size_t kCount = 4096;
  std::vector<float> sum(kCount, static_cast<float>(r + 1)), gathered(kCount * n),
      mine(kCount, static_cast<float>(r)), chunks(kCount * n, static_cast<float>(r + 1)),
      scattered(kCount), root(kCount, static_cast<float>(r == 0 ? 42 : -1));
  b.allreduce(sum.data(), kCount, DType::kFloat32, ReduceOp::kSum)->wait();
  b.allGather(mine.data(), gathered.data(), kCount, DType::kFloat32)->wait();
  b.reduceScatter(chunks.data(), scattered.data(), kCount, DType::kFloat32, ReduceOp::kSum)->wait();
  b.broadcast(root.data(), kCount, DType::kFloat32, 0)->wait();
  bool ok = true;
  const float total = static_cast<float>(n * (n + 1) / 2);
  for (size_t i = 0; i < kCount; ++i) {
    ok = ok && sum[i] == total && scattered[i] == total && root[i] == 42.f;
  }
  for (size_t i = 0; i < gathered.size(); ++i)
    ok = ok && gathered[i] == static_cast<float>(i / kCount);
  // Every rank must agree that every rank passed.
  int32_t passed = ok ? 1 : 0;
  b.allreduce(&passed, 1, DType::kInt32, ReduceOp::kMin)->wait();
  acc.print(passed ? "ok" : "FAILED", "  collectives (", b.name(), ", ", n,
            " ranks): allreduce, all_gather, reduce_scatter, broadcast");
  return passed == 1;
}

// Two layers that run through unitForward: the units of a sharded strategy's test.
struct TestNetImpl : torch::nn::Module {
  TestNetImpl()
      : first(register_module("first", torch::nn::Linear(5, 8))),
        second(register_module("second", torch::nn::Linear(8, 2))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return unitForward(second, torch::tanh(unitForward(first, x)));
  }
  torch::nn::Linear first, second;
};
TORCH_MODULE(TestNet);

bool checkParity(Accelerator& acc) {
  constexpr int64_t kPerRank = 4, kSteps = 3;
  const int n = acc.worldSize();
  auto gen = at::detail::createCPUGenerator(11);
  auto x = torch::randn({kPerRank * n, 5}, gen), y = torch::randn({kPerRank * n, 2}, gen);
  auto make = [] {
    torch::manual_seed(3);
    return TestNet();
  };
  const PrecisionPolicy& precision = acc.precision();
  const double clipping = acc.env().gradient_clipping;
  auto reference = make();
  torch::optim::AdamW ref_opt(reference->parameters(), torch::optim::AdamWOptions(0.01));
  for (int64_t s = 0; s < kSteps; ++s) {
    ref_opt.zero_grad();
    torch::Tensor loss;
    {
      const AutocastScope autocast(torch::kCPU, precision.compute, precision.mixed());
      loss = torch::mse_loss(reference->forward(x), y);
    }
    loss.backward();
    if (clipping > 0) torch::nn::utils::clip_grad_norm_(reference->parameters(), clipping);
    ref_opt.step();
  }
  auto model = make();
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(0.01));
  acc.prepare(model.ptr(), opt);
  auto mx = x.narrow(0, acc.rank() * kPerRank, kPerRank);
  auto my = y.narrow(0, acc.rank() * kPerRank, kPerRank);
  while (acc.optimizerSteps() < kSteps) {
    acc.backward(torch::mse_loss(model->forward(mx), my));
    acc.step();
  }
  double worst = 0;
  const auto got = acc.fullParameters();
  const auto want = reference->named_parameters();
  for (const auto& [name, value] : got) {
    const torch::Tensor& w = want[name];
    worst =
        std::max(worst, ((value - w).abs().max() / w.abs().max().clamp_min(1e-12)).item<double>());
  }
  const double tolerance = precision.mixed() ? 2e-2 : 1e-6;
  std::ostringstream clipping_text;
  if (clipping > 0) clipping_text << ", clipping " << clipping;
  int32_t passed = worst < tolerance ? 1 : 0;
  acc.backend().allreduce(&passed, 1, DType::kInt32, ReduceOp::kMin)->wait();
  acc.print(passed ? "ok" : "FAILED", "  parity with one process (", acc.describeStrategy(),
            "): ", n, " ranks x ", kPerRank, " examples vs one process on ", kPerRank * n, " (",
            precision.name, clipping_text.str(), "; max relative difference ", worst,
            " on rank 0, at most ", tolerance, ")");
  return passed == 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "The worker `cxxlaunch test` starts: checks the collectives and DDP against one process "
      "under the launcher's environment. Takes no flags.",
      "cxxlaunch_selftest");
  cli::useConventions(app);
  cli::parseOrExit(app, argc, argv);
  try {
    torch::set_num_threads(1);
    // The config's wrap classes name the user's model; the test model's units are its layers.
    if (const char* wrap = std::getenv(env::kFsdpTransformerLayerClsToWrap); wrap && *wrap) {
      if (std::getenv("RANK") == nullptr || std::string(std::getenv("RANK")) == "0") {
        std::cout << "note: fsdp_transformer_layer_cls_to_wrap (" << wrap
                  << ") names your model's blocks; the test model's Linear layers are its "
                     "units instead"
                  << std::endl;
      }
      ::setenv(env::kFsdpTransformerLayerClsToWrap, "Linear", 1);
    }
    AcceleratorOptions options;
    options.gradient_accumulation_steps = 1;  // the parity check is per step
    // Tiny buckets (one per parameter here): several all-reduces in flight during the backward,
    // as a large model has.
    options.bucket_bytes = 64;
    Accelerator acc(options);
    const bool ok = checkCollectives(acc) && checkParity(acc);
    acc.print(ok ? "all checks passed" : "a check failed");
    return ok ? 0 : 1;
  } catch (const InvalidArgument& e) {
    std::cerr << "cxxlaunch_selftest: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "cxxlaunch_selftest: " << e.what() << "\n";
    return 3;
  }
}
