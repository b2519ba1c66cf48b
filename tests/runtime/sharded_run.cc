#include "sharded_run.h"

#include <catch2/catch.hpp>
#include <limits>
#include <mutex>

#include "runtime/world.h"
#include "support/ranks.h"

namespace cxxlaunch::runtime::testing {

using cxxlaunch::testing::onRanks;

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(Tower& net, const std::string& kind) {
  if (kind == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true));
  }
  if (kind == "adam") {
    return std::make_unique<torch::optim::Adam>(net->parameters(),
                                                torch::optim::AdamOptions(0.01).weight_decay(0.01));
  }
  if (kind == "rmsprop") {
    return std::make_unique<torch::optim::RMSprop>(net->parameters(),
                                                   torch::optim::RMSpropOptions(0.01));
  }
  return std::make_unique<torch::optim::AdamW>(net->parameters(),
                                               torch::optim::AdamWOptions(0.01).weight_decay(0.1));
}

Result train(const Run& run) {
  const int64_t kBatch = run.batch;
  auto gen = at::detail::createCPUGenerator(7);
  const int64_t micro_steps = run.steps * run.accumulation;
  const auto x = torch::randn({micro_steps * run.world * kBatch, 6}, gen);
  const auto y = torch::randn({micro_steps * run.world * kBatch, 3}, gen);
  auto fake = makeFakeWorld(run.world);
  Result result;
  result.memory.resize(static_cast<size_t>(run.world));
  std::vector<std::map<std::string, torch::Tensor>> params(static_cast<size_t>(run.world));
  std::mutex construction;  // one global generator: seed and build one model at a time
  onRanks(run.world, [&](int r) {
    Tower net = [&] {
      std::lock_guard<std::mutex> lock(construction);
      torch::manual_seed(42);
      return Tower(run.d, run.layers);
    }();
    if (r != 0) {  // other weights elsewhere: the strategy must start from rank 0's
      torch::NoGradGuard no_grad;
      for (auto& p : net->parameters()) p.add_(0.5);
    }
    auto optimizer = makeOptimizer(net, run.optimizer);
    World world;
    world.env.rank = r;
    world.env.world_size = run.world;
    world.env.strategy = run.strategy;
    world.env.gradient_accumulation_steps = run.accumulation;
    world.env.gradient_clipping = run.clipping;
    world.env.fsdp_auto_wrap_policy = run.wrap_policy;
    world.env.fsdp_transformer_layer_cls = run.unit_types;
    world.env.fsdp_min_num_params = run.min_num_params;
    world.env.fsdp_backward_prefetch = run.backward_prefetch;
    world.env.fsdp_forward_prefetch = run.forward_prefetch;
    world.env.mixed_precision = run.precision;
    world.env.fsdp_activation_checkpointing = run.checkpointing;
    world.env.node_rank = r / (run.world / run.nodes);
    world.env.num_nodes = run.nodes;
    if (!run.nvme_optimizer.empty()) {
      world.env.offload_optimizer = OffloadDevice::kNvme;
      world.env.offload_optimizer_nvme_path = run.nvme_optimizer;
    }
    if (!run.nvme_params.empty()) {
      world.env.offload_params = OffloadDevice::kNvme;
      world.env.offload_param_nvme_path = run.nvme_params;
    }
    world.backend = makeFakeBackend(fake, r);
    AcceleratorOptions options;
    if (run.loss_scaling) options.loss_scaling = LossScalerOptions{.growth_interval = 2};
    Accelerator acc(std::move(world), options);
    if (run.wrap_blocks) {
      for (auto& block : net->blocks) acc.wrap(*block);
    }
    std::vector<Unit<Block>> units;
    if (run.unit_handles) {
      for (auto& block : net->blocks) units.push_back(acc.wrap(block));
    }
    // The tower's forward, or the same with its blocks called through their handles.
    auto forward = [&](const torch::Tensor& input) {
      if (units.empty()) return net->forward(input);
      torch::Tensor h = net->in(input);
      for (auto& unit : units) h = unit(h);
      return net->out(h);
    };
    acc.prepare(net.ptr(), *optimizer);
    for (int64_t m = 0; m < micro_steps; ++m) {
      const int64_t at = (m * run.world + r) * kBatch;
      auto loss = torch::mse_loss(forward(x.narrow(0, at, kBatch)), y.narrow(0, at, kBatch));
      if (r == run.overflow_rank && m == run.overflow_step) {
        loss = loss * std::numeric_limits<float>::infinity();
      }
      acc.backward(loss);
      if (acc.step()) {
        if (r == 0) result.skipped.push_back(acc.stepWasSkipped());
        if (run.evaluate) {
          torch::NoGradGuard no_grad;
          (void)forward(x.narrow(0, 0, kBatch));
        }
      }
    }
    if (r == 0) result.loss_scale = acc.lossScale();
    for (auto& [name, tensor] : acc.fullParameters()) params[static_cast<size_t>(r)][name] = tensor;
    result.memory[static_cast<size_t>(r)] = acc.memoryReport();
    if (r == 0) result.description = acc.describeStrategy();
  });
  for (int r = 1; r < run.world; ++r) {  // every rank holds the same model
    for (auto& [name, tensor] : params[0]) {
      REQUIRE(torch::equal(tensor, params[static_cast<size_t>(r)].at(name)));
    }
  }
  result.params = params[0];
  return result;
}

double maxRelativeDifference(const Result& a, const Result& b) {
  REQUIRE(a.params.size() == b.params.size());
  double worst = 0;
  for (const auto& [name, ta] : a.params) {
    const auto& tb = b.params.at(name);
    const double diff = (ta - tb).abs().max().item<double>();
    worst = std::max(worst, diff / std::max(tb.abs().max().item<double>(), 1e-12));
  }
  return worst;
}

// How far `a`'s parameter updates (from `initial`) are from `b`'s, relative to `b`'s: the measure
// for low precision, where the parameters themselves agree to far more digits than the updates.
double maxRelativeUpdateDifference(const Result& a, const Result& b,
                                   const std::map<std::string, torch::Tensor>& initial) {
  double worst = 0;
  for (const auto& [name, ta] : a.params) {
    const auto update_b = b.params.at(name) - initial.at(name);
    const double diff = (ta - b.params.at(name)).norm().item<double>();
    worst = std::max(worst, diff / std::max(update_b.norm().item<double>(), 1e-12));
  }
  return worst;
}

std::map<std::string, torch::Tensor> initialParameters(const Run& run) {
  torch::manual_seed(42);
  Tower net(run.d, run.layers);
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : net->named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

}  // namespace cxxlaunch::runtime::testing
