// The sharded strategies (ZeRO-1/2/3, FSDP FULL_SHARD / SHARD_GRAD_OP / NO_SHARD) against DDP:
// ranks are threads over the Fake backend, each mode trains the same model on the same data, and
// the whole parameters (gathered from the shards) must end where DDP's do. DDP itself is checked
// against one process on the whole batch in ddp_test.cc.

#include "runtime/strategy/sharded.h"

#include <torch/torch.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <tuple>

#include "runtime/accelerator.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/state_load.h"
#include "runtime/precision/policy.h"
#include "runtime/strategy/unit.h"
#include "runtime/strategy/unit_plan.h"
#include "support/ranks.h"
#include "support/subprocess.h"
#include "tower.h"

using namespace cxxlaunch::runtime;
using cxxlaunch::runtime::testing::Block;
using cxxlaunch::runtime::testing::BlockImpl;
using cxxlaunch::runtime::testing::Tower;
using cxxlaunch::testing::onRanks;

namespace {

struct Run {
  std::string strategy = "ddp";
  int world = 2;
  std::string optimizer = "adamw";
  int accumulation = 1;
  double clipping = 0;
  WrapPolicy wrap_policy = WrapPolicy::kTransformerBased;
  std::vector<std::string> unit_types = {"Block"};
  BackwardPrefetch backward_prefetch = BackwardPrefetch::kPre;
  bool forward_prefetch = false;
  int64_t d = 11, layers = 3;
  int64_t steps = 4;
  bool evaluate = false;  // a forward without autograd after every step (an evaluation pass)
  int64_t batch = 4;      // examples per rank per micro-step
  std::string precision = "no";
  bool loss_scaling = false;
  bool checkpointing = false;    // fsdp_activation_checkpointing
  int nodes = 1;                 // simulated: ranks [k * world / nodes, ...) are node k
  bool wrap_blocks = false;      // Accelerator::wrap on every block (sharded from prepare on)
  bool unit_handles = false;     // the same, the blocks then called through wrap's handles
  std::string nvme_optimizer{};  // offload directories
  std::string nvme_params{};
  int64_t overflow_rank = -1, overflow_step = -1;  // that rank's loss is inf at that micro-step
};

struct Result {
  std::map<std::string, torch::Tensor> params;  // rank 0's whole parameters
  std::vector<MemoryReport> memory;             // per rank, after the last step
  std::string description;
  std::vector<bool> skipped;  // rank 0: whether each optimizer step was skipped
  double loss_scale = 1;
};

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

const std::vector<std::string> kShardedStrategies = {
    "zero1", "zero2", "zero3", "fsdp_full_shard", "fsdp_shard_grad_op", "fsdp_no_shard"};

}  // namespace

TEST_CASE("Every sharded strategy ends with DDP's parameters", "[sharded]") {
  torch::set_num_threads(1);
  for (int world : {2, 4}) {
    for (const std::string optimizer : {"adamw", "sgd"}) {
      for (const auto& [accumulation, clipping] :
           std::vector<std::pair<int, double>>{{1, 0.0}, {2, 0.0}, {1, 0.05}, {2, 0.05}}) {
        Run run{.world = world,
                .optimizer = optimizer,
                .accumulation = accumulation,
                .clipping = clipping};
        const Result ddp = train(run);
        for (const auto& strategy : kShardedStrategies) {
          run.strategy = strategy;
          INFO(strategy << " world " << world << " " << optimizer << " accumulation "
                        << accumulation << " clipping " << clipping);
          const Result sharded = train(run);
          CHECK(maxRelativeDifference(sharded, ddp) < 1e-5);
        }
      }
    }
  }
}

TEST_CASE("Adam, prefetch, evaluation passes and wrap policies do not change the result",
          "[sharded]") {
  torch::set_num_threads(1);
  Run base{.world = 2, .optimizer = "adam"};
  const Result ddp = train(base);
  std::vector<Run> variants;
  for (const auto prefetch :
       {BackwardPrefetch::kPre, BackwardPrefetch::kPost, BackwardPrefetch::kNone}) {
    for (bool forward : {false, true}) {
      Run r = base;
      r.strategy = "zero3";
      r.backward_prefetch = prefetch;
      r.forward_prefetch = forward;
      variants.push_back(r);
    }
  }
  Run evaluating = base;
  evaluating.strategy = "zero3";
  evaluating.evaluate = true;
  variants.push_back(evaluating);
  Run wrapped = base;
  wrapped.strategy = "zero3";
  wrapped.unit_types = {};
  wrapped.wrap_blocks = true;
  variants.push_back(wrapped);
  Run by_size = base;
  by_size.strategy = "fsdp_full_shard";
  by_size.wrap_policy = WrapPolicy::kSizeBased;
  by_size.unit_types = {};
  variants.push_back(by_size);
  Run no_wrap = by_size;
  no_wrap.wrap_policy = WrapPolicy::kNoWrap;
  variants.push_back(no_wrap);
  for (const auto& run : variants) {
    INFO(run.strategy << " wrap " << static_cast<int>(run.wrap_policy) << " prefetch "
                      << static_cast<int>(run.backward_prefetch) << " forward "
                      << run.forward_prefetch << (run.evaluate ? " evaluating" : ""));
    CHECK(maxRelativeDifference(train(run), ddp) < 1e-5);
  }
}

TEST_CASE("Units follow the wrap policy", "[sharded]") {
  torch::set_num_threads(1);
  Run run{.strategy = "zero3", .world = 2, .steps = 1};
  CHECK_THAT(train(run).description, Catch::Contains("3 module(s), 1 bucket(s)"));
  run.wrap_policy = WrapPolicy::kNoWrap;
  CHECK_THAT(train(run).description, Catch::Contains("0 module(s), 1 bucket(s)"));
  run.wrap_policy =
      WrapPolicy::kSizeBased;  // fsdp_min_num_params defaults to 1e8: nothing that big
  run.unit_types = {};
  CHECK_THAT(train(run).description, Catch::Contains("0 module(s)"));
}

TEST_CASE("Model state per rank follows the ZeRO formulas", "[sharded]") {
  torch::set_num_threads(1);
  for (int world : {2, 4}) {
    // Blocks hold ~96% of the parameters; the rest stays whole under ZeRO-3, as FSDP's root.
    Run run{.world = world, .d = 64, .layers = 4, .steps = 2};
    const Result ddp = train(run);
    const double psi = static_cast<double>(ddp.memory[0].parameters) / 4;  // float32 elements
    CHECK(ddp.memory[0].total() == static_cast<size_t>(16 * psi));         // 4 + 4 + 8 bytes
    const double n = world;
    const std::map<std::string, double> expected = {{"zero1", (4 + 4 + 8 / n) * psi},
                                                    {"zero2", (4 + 12 / n) * psi},
                                                    {"fsdp_shard_grad_op", (4 + 12 / n) * psi}};
    for (const auto& [strategy, bytes] : expected) {
      run.strategy = strategy;
      const Result r = train(run);
      INFO(strategy << " world " << world << ": " << r.memory[0].str());
      CHECK(std::abs(static_cast<double>(r.memory[0].total()) / bytes - 1) < 0.05);
    }
    for (const std::string strategy : {"zero3", "fsdp_full_shard"}) {
      run.strategy = strategy;
      const Result r = train(run);
      for (const auto& report : r.memory) {
        INFO(strategy << " world " << world << ": " << report.str());
        CHECK(static_cast<double>(report.total()) <=
              (1 / n + 0.05) * static_cast<double>(ddp.memory[0].total()));
      }
    }
  }
}

TEST_CASE("Bad input: unit names, optimizers, models that differ across ranks", "[sharded]") {
  torch::set_num_threads(1);
  Run run{.strategy = "fsdp_full_shard", .world = 2, .steps = 1};
  run.unit_types = {"Blok"};
  CHECK_THROWS_WITH(train(run), Catch::Contains("'Blok', which is no module type of this model") &&
                                    Catch::Contains("BlockImpl") && Catch::Contains("TowerImpl"));
  run.unit_types = {"Block"};
  run.optimizer = "rmsprop";
  CHECK_THROWS_WITH(train(run), Catch::Contains("AdamW, Adam and SGD"));

  auto fake = makeFakeWorld(2);
  CHECK_THROWS_WITH(onRanks(2,
                            [&](int r) {
                              Tower net(11, r == 0 ? 3 : 2);
                              auto optimizer = makeOptimizer(net, "adamw");
                              World world;
                              world.env.rank = r;
                              world.env.world_size = 2;
                              world.env.strategy = "zero2";
                              world.backend = makeFakeBackend(fake, r);
                              Accelerator acc(std::move(world), {});
                              acc.prepare(net.ptr(), *optimizer);
                            }),
                    Catch::Contains("the model differs across ranks: rank 0 has 16 parameter "
                                    "tensors (575 elements), rank 1 has 12") &&
                        Catch::Contains("every rank must build the same model"));
}

// Mixed precision written out with LibTorch alone, on one process and each step's whole batch:
// fp32 master weights stepped by torch::optim::AdamW, a bf16 copy of the model that computes
// under autocast, its bf16 gradients handed to the masters. No code of the strategies runs.
Result bf16Reference(const Run& run) {
  const int64_t batch = run.batch * run.world;
  auto gen = at::detail::createCPUGenerator(7);
  const auto x = torch::randn({run.steps * batch, 6}, gen);
  const auto y = torch::randn({run.steps * batch, 3}, gen);
  torch::manual_seed(42);
  Tower master(run.d, run.layers);
  torch::manual_seed(42);
  Tower compute(run.d, run.layers);
  compute->to(torch::kBFloat16);
  torch::optim::AdamW optimizer(master->parameters(),
                                torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  auto masters = master->parameters(), copies = compute->parameters();
  for (int64_t step = 0; step < run.steps; ++step) {
    {
      AutocastScope autocast(torch::kCPU, torch::kBFloat16, true);
      auto loss = torch::mse_loss(compute->forward(x.narrow(0, step * batch, batch)),
                                  y.narrow(0, step * batch, batch));
      AutocastScope off(torch::kCPU, torch::kBFloat16, false);
      loss.backward();
    }
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < masters.size(); ++i) {
      masters[i].mutable_grad() = copies[i].grad().to(torch::kFloat);
      copies[i].mutable_grad() = torch::Tensor();
    }
    optimizer.step();
    for (size_t i = 0; i < masters.size(); ++i) copies[i].copy_(masters[i]);
  }
  Result result;
  for (const auto& item : master->named_parameters()) {
    result.params[item.key()] = item.value().detach().clone();
  }
  return result;
}

TEST_CASE("bf16: every strategy matches a one-process bf16 reference", "[sharded][bf16]") {
  torch::set_num_threads(1);
  Run reference{.world = 1, .batch = 8, .precision = "bf16"};
  const auto initial = initialParameters(reference);
  const Result bf16 = bf16Reference(reference);
  Run fp32_run = reference;
  fp32_run.precision = "no";
  const Result fp32 = train(fp32_run);  // plain DDP (torch::optim::AdamW), one process
  // bf16 really ran: its updates are off fp32's by far more than fp32's rounding.
  const double bf16_vs_fp32 = maxRelativeUpdateDifference(bf16, fp32, initial);
  CHECK(bf16_vs_fp32 > 1e-3);
  for (int world : {2, 4}) {
    for (const std::string strategy :
         {"ddp", "zero1", "zero2", "zero3", "fsdp_full_shard", "fsdp_hybrid_shard"}) {
      Run run{.strategy = strategy,
              .world = world,
              .batch = 8 / world,
              .precision = "bf16",
              .nodes = strategy == "fsdp_hybrid_shard" ? 2 : 1};
      const Result sharded = train(run);
      const double difference = maxRelativeUpdateDifference(sharded, bf16, initial);
      const double from_fp32 = maxRelativeUpdateDifference(sharded, fp32, initial);
      INFO(strategy << " world " << world << ": updates differ by " << difference
                    << " from bf16's, by " << from_fp32 << " from fp32's");
      // A few bf16 roundings (2^-8 each) apart, and not fp32.
      CHECK(difference < 0.02);
      CHECK(from_fp32 > 1e-3);
    }
  }
}

TEST_CASE("bf16 halves the compute copies and the gathered bytes, masters stay fp32",
          "[sharded][bf16]") {
  torch::set_num_threads(1);
  Run run{.strategy = "zero2", .world = 2, .d = 64, .layers = 4, .steps = 1};
  const Result fp32 = train(run);
  run.precision = "bf16";
  const Result bf16 = train(run);
  const double psi = static_cast<double>(fp32.memory[0].parameters) / 4;
  // 2 bytes of compute copy per parameter, 4 / N of master shard.
  CHECK(std::abs(static_cast<double>(bf16.memory[0].parameters) / ((2 + 4.0 / 2) * psi) - 1) <
        0.05);
  for (const auto& [name, tensor] : bf16.params) CHECK(tensor.scalar_type() == torch::kFloat);
}

TEST_CASE("Loss scaling: an overflow on one rank skips the step on every rank",
          "[sharded][loss_scaling]") {
  torch::set_num_threads(1);
  Run run{.world = 2, .steps = 4, .loss_scaling = true, .overflow_rank = 1, .overflow_step = 1};
  const Result ddp = train(run);
  CHECK(ddp.skipped == std::vector<bool>{false, true, false, false});
  // 65536, overflow (hysteresis 2: kept), then two good steps: growth interval 2 doubles it.
  CHECK(ddp.loss_scale == 131072);
  Run clean = run;
  clean.overflow_rank = -1;
  CHECK(maxRelativeDifference(ddp, train(clean)) > 1e-3);  // the skipped step made a difference
  for (const std::string strategy : {"zero1", "zero2", "zero3"}) {
    run.strategy = strategy;
    INFO(strategy);
    const Result sharded = train(run);
    CHECK(sharded.skipped == ddp.skipped);
    CHECK(maxRelativeDifference(sharded, ddp) < 1e-5);
  }
  // With the gradients swapped out to nvme the overflow is seen on their way out.
  cxxlaunch::testing::TempDir dir;
  for (const std::string strategy : {"zero2", "zero3"}) {
    run.strategy = strategy;
    run.nvme_optimizer = dir.path();
    INFO(strategy << " nvme");
    const Result swapped = train(run);
    CHECK(swapped.skipped == ddp.skipped);
    CHECK(maxRelativeDifference(swapped, ddp) < 1e-5);
  }
}

TEST_CASE("fp16 on a CPU run is refused before training", "[sharded][loss_scaling]") {
  Run run{.world = 1, .steps = 1, .precision = "fp16"};
  CHECK_THROWS_WITH(train(run), Catch::Contains("fp16 needs a GPU") && Catch::Contains("bf16"));
}

TEST_CASE("Activation checkpointing recomputes each unit and changes no result",
          "[sharded][checkpointing]") {
  torch::set_num_threads(1);
  for (int accumulation : {1, 2}) {
    Run run{.world = 2, .accumulation = accumulation, .steps = 3};
    BlockImpl::forward_calls = 0;
    const Result ddp = train(run);
    const int64_t plain_calls = BlockImpl::forward_calls.exchange(0);
    for (const std::string strategy : {"ddp", "zero2", "zero3", "fsdp_full_shard"}) {
      run.strategy = strategy;
      run.checkpointing = true;
      INFO(strategy << " accumulation " << accumulation);
      const Result checkpointed = train(run);
      // Every block ran twice per micro-step: forward, and again in backward.
      CHECK(BlockImpl::forward_calls.exchange(0) == 2 * plain_calls);
      CHECK(maxRelativeDifference(checkpointed, ddp) < 1e-5);
    }
  }
  Run bf16{.strategy = "zero3", .world = 2, .precision = "bf16"};
  const Result plain = train(bf16);
  bf16.checkpointing = true;  // the recomputation runs under the forward's autocast
  CHECK(maxRelativeDifference(train(bf16), plain) < 1e-5);
}

TEST_CASE("fsdp_activation_checkpointing with nothing to checkpoint is refused",
          "[sharded][checkpointing]") {
  Run run{.world = 1, .steps = 1, .checkpointing = true};
  run.unit_types = {};
  CHECK_THROWS_WITH(train(run), Catch::Contains("no module is a unit to checkpoint"));
}

TEST_CASE("HYBRID_SHARD: sharded in each node, replicated across nodes, DDP's parameters",
          "[sharded][hybrid]") {
  torch::set_num_threads(1);
  for (const auto& [world, nodes] : std::vector<std::pair<int, int>>{{4, 2}, {2, 2}, {4, 1}}) {
    for (const std::string optimizer : {"adamw", "sgd"}) {
      for (const auto& [accumulation, clipping] :
           std::vector<std::pair<int, double>>{{1, 0.0}, {2, 0.05}}) {
        Run run{.world = world,
                .optimizer = optimizer,
                .accumulation = accumulation,
                .clipping = clipping,
                .nodes = nodes};
        const Result ddp = train(run);
        for (const std::string strategy : {"fsdp_hybrid_shard", "fsdp_hybrid_shard_zero2"}) {
          run.strategy = strategy;
          INFO(strategy << " world " << world << " nodes " << nodes << " " << optimizer
                        << " accumulation " << accumulation << " clipping " << clipping);
          const Result hybrid = train(run);
          CHECK(maxRelativeDifference(hybrid, ddp) < 1e-5);
          const int per_node = world / nodes;
          CHECK_THAT(hybrid.description,
                     Catch::Contains("on 1/" + std::to_string(per_node) + " shards"));
          if (nodes > 1) {
            CHECK_THAT(hybrid.description,
                       Catch::Contains("x " + std::to_string(nodes) + " node replicas"));
          }
        }
      }
    }
  }
}

TEST_CASE("HYBRID_SHARD holds one node's share of the model state", "[sharded][hybrid]") {
  torch::set_num_threads(1);
  Run run{.world = 4, .d = 64, .layers = 4, .steps = 2, .nodes = 2};
  const Result ddp = train(run);
  run.strategy = "fsdp_hybrid_shard";
  const Result hybrid = train(run);
  for (const auto& report : hybrid.memory) {
    INFO(report.str());
    CHECK(static_cast<double>(report.total()) <=
          (1.0 / 2 + 0.05) * static_cast<double>(ddp.memory[0].total()));
  }
}

TEST_CASE("HYBRID_SHARD refuses nodes of different sizes", "[sharded][hybrid]") {
  auto fake = makeFakeWorld(3);
  CHECK_THROWS_WITH(onRanks(3,
                            [&](int r) {
                              Tower net(11, 2);
                              auto optimizer = makeOptimizer(net, "adamw");
                              World world;
                              world.env.rank = r;
                              world.env.world_size = 3;
                              world.env.node_rank = r == 0 ? 0 : 1;
                              world.env.strategy = "fsdp_hybrid_shard";
                              world.backend = makeFakeBackend(fake, r);
                              Accelerator acc(std::move(world), {});
                              acc.prepare(net.ptr(), *optimizer);
                            }),
                    Catch::Contains("same number of processes on every node"));
}

TEST_CASE("nvme offload: optimizer state and ZeRO-3 masters on disk, DDP's parameters",
          "[sharded][nvme]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  for (const std::string optimizer : {"adamw", "sgd"}) {
    for (const auto& [accumulation, clipping] :
         std::vector<std::pair<int, double>>{{1, 0.0}, {2, 0.05}}) {
      Run run{
          .world = 2, .optimizer = optimizer, .accumulation = accumulation, .clipping = clipping};
      const Result ddp = train(run);
      std::vector<Run> variants;
      for (const std::string strategy : {"zero1", "zero2", "zero3", "fsdp_full_shard"}) {
        Run r = run;
        r.strategy = strategy;
        r.nvme_optimizer = dir.path();
        variants.push_back(r);
      }
      Run params = run;
      params.strategy = "zero3";
      params.nvme_params = dir.path();
      variants.push_back(params);
      params.nvme_optimizer = dir.path();
      variants.push_back(params);
      params.precision = "bf16";  // the masters stay fp32 on disk; compute copies in memory
      variants.push_back(params);
      for (const auto& r : variants) {
        INFO(r.strategy << " " << optimizer << " accumulation " << accumulation << " clipping "
                        << clipping << " nvme optimizer '" << r.nvme_optimizer << "' params '"
                        << r.nvme_params << "' " << r.precision);
        const Result offloaded = train(r);
        if (r.precision == "no") {
          CHECK(maxRelativeDifference(offloaded, ddp) < 1e-5);
        } else {  // bf16 is not DDP's fp32: the same run with its state in memory
          Run in_memory = r;
          in_memory.nvme_optimizer.clear();
          in_memory.nvme_params.clear();
          CHECK(maxRelativeDifference(offloaded, train(in_memory)) < 1e-6);
        }
        CHECK(offloaded.memory[0].offloaded > 0);
      }
    }
  }
  // Nothing left behind: the swap files had no name.
  CHECK(std::filesystem::is_empty(dir.path()));
}

TEST_CASE("nvme offload moves the state out of memory", "[sharded][nvme]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  Run run{.strategy = "zero3", .world = 2, .d = 128, .layers = 16, .steps = 1};
  const Result in_memory = train(run);
  run.nvme_optimizer = dir.path();
  run.nvme_params = dir.path();
  const Result offloaded = train(run);
  const auto& a = in_memory.memory[0];
  const auto& b = offloaded.memory[0];
  INFO(a.str() << " vs " << b.str());
  // The masters and the moments are on disk; memory keeps three units' staging.
  CHECK(b.parameters < a.parameters);
  CHECK(b.optimizer_state < a.optimizer_state / 2);
  CHECK(b.offloaded >= a.optimizer_state);
}

TEST_CASE("nvme offload streams units bigger than one piece and swaps their gradients out",
          "[sharded][nvme]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  // A 2100 x 2100 layer: shards of 2.2M elements at world 2, more than one piece (2^21) each.
  Run run{.world = 2,
          .accumulation = 2,
          .clipping = 0.05,
          .d = 2100,
          .layers = 2,
          .steps = 2,
          .batch = 2};
  const Result ddp = train(run);
  for (const std::string strategy : {"zero2", "zero3"}) {
    Run in_memory = run;
    in_memory.strategy = strategy;
    Run swapped = in_memory;
    swapped.nvme_optimizer = dir.path();
    if (strategy == "zero3") swapped.nvme_params = dir.path();
    INFO(strategy);
    const Result a = train(in_memory), b = train(swapped);
    // Sums of 2100 products in another order: DDP's to 1e-4 at this width; the same run with
    // everything in memory to 1e-6 (the norm adds its pieces' sums in another order).
    CHECK(maxRelativeDifference(a, ddp) < 1e-4);
    CHECK(maxRelativeDifference(b, a) < 1e-6);
    const auto &kept = a.memory[0], &offloaded = b.memory[0];
    INFO(kept.str() << " vs " << offloaded.str());
    // The gradient shards rest on disk beside the two moments; memory keeps two pieces of them.
    CHECK(offloaded.offloaded >= kept.optimizer_state / 2 * 3);
    CHECK(offloaded.gradients < kept.gradients);
  }
  CHECK(std::filesystem::is_empty(dir.path()));
}

TEST_CASE("nvme offload to a missing or wrong directory is refused before training",
          "[sharded][nvme]") {
  cxxlaunch::testing::TempDir dir;
  Run run{.strategy = "zero2", .world = 1, .steps = 1};
  run.nvme_optimizer = dir.path() + "/missing";
  CHECK_THROWS_WITH(train(run), Catch::Contains("offload_optimizer_nvme_path") &&
                                    Catch::Contains("does not exist"));
  std::ofstream(dir.path() + "/file") << "x";
  run.nvme_optimizer = dir.path() + "/file";
  CHECK_THROWS_WITH(train(run), Catch::Contains("is not a directory"));
  run.nvme_optimizer = "";
  run.nvme_params = dir.path();
  CHECK_THROWS_WITH(train(run), Catch::Contains("needs parameters sharded at rest"));
  run.strategy = "ddp";
  CHECK_THROWS_WITH(train(run), Catch::Contains("nvme offload needs a ZeRO stage"));
}

// cpu offload is chosen by the launch only for GPU runs (a CPU run has nothing to offload), so
// these drive the strategy as the Accelerator does, asking for it directly: on a CPU model the
// masters, gradient shards and optimizer state then live in memory of their own and take every
// copy a GPU run takes, and the result must not change by a bit.
namespace {

struct DirectRun {
  std::string optimizer = "adamw";
  int accumulation = 1;
  double clipping = 0;
  int64_t steps = 3;
  ShardingOptions sharding{};
  std::string load_from{};   // a checkpoint loaded before training
  std::string save_to{};     // a checkpoint saved after it
  bool full_layout = false;  // save_to in the full layout, else sharded
};
struct DirectResult {
  std::map<std::string, torch::Tensor> params;  // rank 0's, whole
  MemoryReport memory;                          // rank 0's, after the last step
};

DirectResult trainDirect(const DirectRun& run) {
  constexpr int kWorld = 2;
  constexpr int64_t kBatch = 4;
  auto gen = at::detail::createCPUGenerator(7);
  const int64_t micro_steps = run.steps * run.accumulation;
  const auto x = torch::randn({micro_steps * kWorld * kBatch, 6}, gen);
  const auto y = torch::randn({micro_steps * kWorld * kBatch, 3}, gen);
  auto fake = makeFakeWorld(kWorld);
  DirectResult result;
  std::mutex construction;
  onRanks(kWorld, [&](int r) {
    Tower net = [&] {
      std::lock_guard<std::mutex> lock(construction);
      torch::manual_seed(42);
      return Tower(11, 3);
    }();
    auto optimizer = makeOptimizer(net, run.optimizer);
    ShardingOptions options = run.sharding;
    options.unit_types = {"Block"};
    options.wrap_policy = WrapPolicy::kTransformerBased;
    std::shared_ptr<Backend> backend = makeFakeBackend(fake, r);
    ShardedStrategy strategy(backend, net.ptr(), *optimizer, options);
    if (!run.load_from.empty()) {
      {  // an evaluation first: ZeRO-3's units then rest sharded when the checkpoint comes in
        torch::NoGradGuard no_grad;
        AutocastScope autocast(torch::kCPU, options.compute_dtype,
                               options.compute_dtype != torch::kFloat);
        (void)net->forward(torch::ones({kBatch, 6}));
      }
      const checkpoint::Reader reader(run.load_from);
      checkpoint::StateLoad load(reader, *backend);
      strategy.fillState(load);
      load.finish();
    }
    const bool mixed = options.compute_dtype != torch::kFloat;
    for (int64_t m = 0; m < micro_steps; ++m) {
      const int64_t at = (m * kWorld + r) * kBatch;
      torch::Tensor loss;
      {
        AutocastScope autocast(torch::kCPU, options.compute_dtype, mixed);
        loss = torch::mse_loss(net->forward(x.narrow(0, at, kBatch)), y.narrow(0, at, kBatch));
      }
      const bool sync = (m + 1) % run.accumulation == 0;
      strategy.beforeBackward(sync);
      (loss / run.accumulation).backward();
      strategy.afterBackward(sync);
      if (!sync) continue;
      if (run.clipping > 0) strategy.clipGradNorm(run.clipping);
      strategy.step();
      strategy.zeroGrad();
    }
    if (!run.save_to.empty()) {
      const checkpoint::Counters counters = {{"optimizer_steps", std::to_string(run.steps)}};
      const auto type = run.full_layout ? StateDictType::kFull : StateDictType::kSharded;
      checkpoint::save(*backend, run.save_to, strategy.stateStream(type), {}, counters);
    }
    auto params = strategy.fullParameters();
    if (r != 0) return;
    for (auto& [name, tensor] : params) result.params[name] = tensor;
    result.memory = strategy.memoryReport();
  });
  return result;
}

}  // namespace

TEST_CASE("cpu offload takes the host copies and changes no bit of the result",
          "[sharded][offload]") {
  torch::set_num_threads(1);
  size_t optimizer_only_parameters = 0;  // stage 3, parameters not offloaded: device bytes
  // The independent reference: DDP through the Accelerator, on trainDirect's model and data.
  std::map<std::pair<std::string, int>, Result> ddp;
  const std::vector<std::tuple<std::string, int, double>> cases = {{"adamw", 1, 0.0},
                                                                   {"sgd", 2, 0.05}};
  for (const auto& [optimizer, accumulation, clipping] : cases) {
    ddp[{optimizer, accumulation}] = train(Run{.optimizer = optimizer,
                                               .accumulation = accumulation,
                                               .clipping = clipping,
                                               .steps = DirectRun{}.steps});
  }
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    for (const int stage : {0, 1, 2, 3}) {
      for (const bool params_too : {false, true}) {
        if (params_too && stage != 3) continue;
        for (const auto& [optimizer, accumulation, clipping] : cases) {
          DirectRun run{.optimizer = optimizer, .accumulation = accumulation, .clipping = clipping};
          run.sharding.stage = stage;
          run.sharding.compute_dtype = dtype;
          const DirectResult in_place = trainDirect(run);
          run.sharding.offload_to_host = true;
          run.sharding.offload_params_to_host = params_too;
          const DirectResult offloaded = trainDirect(run);
          INFO("stage " << stage << " " << c10::toString(dtype) << " params offloaded "
                        << params_too << " " << optimizer << " accumulation " << accumulation
                        << " clipping " << clipping << ": " << in_place.memory.str() << " vs "
                        << offloaded.memory.str());
          REQUIRE(offloaded.params.size() == in_place.params.size());
          for (const auto& [name, tensor] : in_place.params) {
            INFO(name);
            CHECK(torch::equal(offloaded.params.at(name), tensor));
          }
          if (dtype == torch::kFloat) {  // and both where plain DDP ends, the same data and steps
            Result direct;
            direct.params = offloaded.params;
            CHECK(maxRelativeDifference(direct, ddp.at({optimizer, accumulation})) < 1e-5);
          }
          // The fp32 shards and the moments are counted apart, as host memory.
          CHECK(offloaded.memory.offloaded_to_cpu > 0);
          CHECK(offloaded.memory.optimizer_state == 0);
          if (stage == 3 && params_too) {
            // What left the device is exactly the master, gradient shard and moments...
            CHECK(offloaded.memory.total() + offloaded.memory.offloaded_to_cpu ==
                  in_place.memory.total());
            // ...and the shard's compute copy, which the device keeps when only the optimizer
            // is offloaded.
            CHECK(offloaded.memory.parameters < optimizer_only_parameters);
          } else if (stage == 3) {
            optimizer_only_parameters = offloaded.memory.parameters;
          }
        }
      }
    }
  }
}

TEST_CASE("Gradient shards freed between steps (a GPU run's default) change no bit", "[sharded]") {
  torch::set_num_threads(1);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    for (const int stage : {2, 3}) {
      // Accumulation: the shards must live across micro-steps and go only at zeroGrad;
      // clipping reads them before the step.
      DirectRun run{.optimizer = "adamw", .accumulation = 2, .clipping = 0.05};
      run.sharding.stage = stage;
      run.sharding.compute_dtype = dtype;
      const DirectResult kept = trainDirect(run);
      run.sharding.free_gradients_between_steps = true;
      const DirectResult freed = trainDirect(run);
      INFO("stage " << stage << " " << c10::toString(dtype) << ": " << kept.memory.str() << " vs "
                    << freed.memory.str());
      REQUIRE(freed.params.size() == kept.params.size());
      for (const auto& [name, tensor] : kept.params) {
        INFO(name);
        CHECK(torch::equal(freed.params.at(name), tensor));
      }
      // After the last zeroGrad: no gradient memory held, where the zeroed shards stay otherwise.
      CHECK(kept.memory.gradients > 0);
      CHECK(freed.memory.gradients == 0);
    }
  }
}

TEST_CASE("cpu offload saves and loads checkpoints in both layouts as in place",
          "[sharded][offload]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  for (const auto& [stage, params_too] :
       std::vector<std::pair<int, bool>>{{1, false}, {3, false}, {3, true}}) {
    for (const bool full : {false, true}) {
      INFO("stage " << stage << (params_too ? " parameters offloaded" : "")
                    << (full ? " full" : " sharded"));
      const std::string saved =
          dir.path() + "/s" + std::to_string(stage) + (params_too ? "p" : "") + (full ? "f" : "s");
      DirectRun run{.steps = 2};
      run.sharding.stage = stage;
      run.sharding.compute_dtype = torch::kBFloat16;
      run.sharding.offload_to_host = true;
      run.sharding.offload_params_to_host = params_too;
      run.save_to = saved;
      run.full_layout = full;
      const DirectResult first = trainDirect(run);
      run.save_to = "";
      run.load_from = saved;
      run.steps = 0;  // loaded, not trained: the saved parameters
      const DirectResult loaded = trainDirect(run);
      for (const auto& [name, tensor] : first.params) {
        INFO(name);
        CHECK(torch::equal(loaded.params.at(name), tensor));
      }
      // Two more steps from the checkpoint, offloaded and in place: the same bits (the moments
      // came back too, or the steps would differ).
      run.steps = 2;
      const DirectResult offloaded = trainDirect(run);
      run.sharding.offload_to_host = run.sharding.offload_params_to_host = false;
      const DirectResult in_place = trainDirect(run);
      for (const auto& [name, tensor] : in_place.params) {
        INFO(name);
        CHECK(torch::equal(offloaded.params.at(name), tensor));
        CHECK_FALSE(torch::equal(tensor, first.params.at(name)));
      }
    }
  }
}

TEST_CASE("Units marked with wrap rest sharded from prepare on", "[sharded]") {
  torch::set_num_threads(1);
  Run run{.strategy = "zero3", .world = 2, .d = 64, .layers = 4, .steps = 0};
  const Result lazy = train(run);  // the blocks are units by TRANSFORMER_BASED_WRAP
  run.unit_types = {};
  run.wrap_blocks = true;
  const Result wrapped = train(run);
  // Before any step: policy-chosen units are whole until their first unitForward, and get their
  // optimizer state when they are first released; wrapped ones hold only their shard, and its
  // state from prepare on.
  INFO(lazy.memory[0].str() << " vs " << wrapped.memory[0].str());
  CHECK(wrapped.memory[0].parameters < 0.75 * static_cast<double>(lazy.memory[0].parameters));
  CHECK(wrapped.memory[0].optimizer_state > 2 * lazy.memory[0].optimizer_state);
}

TEST_CASE("wrap's handle calls its unit as unitForward does, in every strategy", "[sharded]") {
  torch::set_num_threads(1);
  for (const std::string strategy : {"ddp", "zero2", "zero3"}) {
    INFO(strategy);
    Run run{.strategy = strategy, .world = 2, .unit_types = {}, .steps = 3, .evaluate = true};
    run.wrap_blocks = true;
    const Result marked = train(run);  // wrap(*block), the model's forward calls unitForward
    run.wrap_blocks = false;
    run.unit_handles = true;
    const Result handles = train(run);  // wrap(block), the trainer calls the handles
    CHECK(handles.description == marked.description);
    CHECK(handles.memory[0].str() == marked.memory[0].str());
    for (const auto& [name, tensor] : marked.params) {
      INFO(name);
      CHECK(torch::equal(handles.params.at(name), tensor));
    }
  }
  // The handle shares its module with the holder it was made from.
  Block block(4);
  const Unit<Block> unit(block);
  CHECK(unit.module().ptr() == block.ptr());
}

TEST_CASE("prepare allocates the optimizer state a job will hold, but SGD's under DDP",
          "[sharded]") {
  torch::set_num_threads(1);
  for (const std::string optimizer : {"adamw", "sgd"}) {
    for (const std::string strategy : {"ddp", "zero1", "zero2", "zero3"}) {
      Run run{.strategy = strategy, .optimizer = optimizer, .d = 32, .layers = 2, .steps = 2};
      run.wrap_blocks = strategy == "zero3";
      const Result trained = train(run);
      run.steps = 0;
      const Result prepared = train(run);
      INFO(strategy << " " << optimizer << ": " << prepared.memory[0].str() << " prepared, "
                    << trained.memory[0].str() << " trained");
      REQUIRE(trained.memory[0].optimizer_state > 0);
      if (strategy == "ddp" && optimizer == "sgd") {
        // torch's momentum buffer starts as the first gradient, so it cannot exist before it.
        CHECK(prepared.memory[0].optimizer_state == 0);
      } else {
        CHECK(prepared.memory[0].optimizer_state == trained.memory[0].optimizer_state);
      }
    }
  }
}

TEST_CASE("DDP moves large host parameters onto aligned memory and keeps values and optimizer",
          "[sharded]") {
  torch::set_num_threads(1);
  // d 1024: blocks' weights of 4 MiB (huge-page aligned), biases and the input layer's weight
  // of 4 KiB and 24 KiB (too small to move).
  const int64_t d = 1024;
  auto fake = makeFakeWorld(2);
  std::vector<std::string> problems(2);
  std::mutex construction;  // one global generator: seed and build one model at a time
  onRanks(2, [&](int r) {
    std::unique_lock<std::mutex> lock(construction);
    torch::manual_seed(42);
    Tower net(d, 1);
    torch::manual_seed(42);
    Tower reference(d, 1);  // rank 0's values
    lock.unlock();
    if (r != 0) {  // DDP starts every rank from rank 0's values
      torch::NoGradGuard no_grad;
      for (auto& p : net->parameters()) p.add_(0.5);
    }
    std::map<std::string, const void*> was_at;
    for (const auto& item : net->named_parameters()) was_at[item.key()] = item.value().data_ptr();
    torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(0.01));
    World world;
    world.env.rank = r;
    world.env.world_size = 2;
    world.env.strategy = "ddp";
    world.backend = makeFakeBackend(fake, r);
    Accelerator acc(std::move(world), {});
    acc.prepare(net.ptr(), optimizer);
    auto& problem = problems[static_cast<size_t>(r)];
    const auto params = net->named_parameters();
    const auto& in_optimizer = optimizer.param_groups().at(0).params();
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string& name = params[i].key();
      const torch::Tensor& p = params[i].value();
      const auto at = reinterpret_cast<uintptr_t>(p.data_ptr());
      const size_t alignment = p.nbytes() >= (2u << 20) ? (2u << 20) : 4096;
      if (p.nbytes() >= (64u << 10) && at % alignment != 0) problem += name + " not aligned; ";
      if (p.nbytes() < (64u << 10) && p.data_ptr() != was_at[name]) problem += name + " moved; ";
      if (!torch::equal(p, reference->named_parameters()[name])) problem += name + " changed; ";
      if (in_optimizer.at(i).data_ptr() != p.data_ptr()) problem += name + " not the optimizer's; ";
    }
    // A step trains the parameters the model computes with.
    const auto x = torch::randn({2, 6}, at::detail::createCPUGenerator(7));
    acc.backward(torch::mse_loss(net->forward(x), torch::zeros({2, 3})));
    if (!acc.step()) problem += "no optimizer step; ";
    if (torch::equal(net->named_parameters()["block0.fc.weight"],
                     reference->named_parameters()["block0.fc.weight"])) {
      problem += "a step left block0.fc.weight as it was; ";
    }
  });
  CHECK(problems[0] == "");
  CHECK(problems[1] == "");
}

TEST_CASE("Units the policy chose that never ran through unitForward are named in one warning",
          "[sharded]") {
  torch::set_num_threads(1);
  for (const bool routed : {false, true}) {
    INFO((routed ? "through unitForward" : "called directly"));
    auto fake = makeFakeWorld(2);
    std::ostringstream said;
    auto* const cerr = std::cerr.rdbuf(said.rdbuf());
    std::mutex construction;
    onRanks(2, [&](int r) {
      Tower net = [&] {
        std::lock_guard<std::mutex> lock(construction);
        torch::manual_seed(1);
        return Tower(11, 3);
      }();
      torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(0.01));
      World world;
      world.env.rank = r;
      world.env.world_size = 2;
      world.env.strategy = "zero3";
      world.env.fsdp_transformer_layer_cls = {"Block"};
      world.env.fsdp_auto_wrap_policy = WrapPolicy::kTransformerBased;
      world.backend = makeFakeBackend(fake, r);
      Accelerator acc(std::move(world), {});
      acc.prepare(net.ptr(), optimizer);
      for (int step = 0; step < 2; ++step) {
        const auto x = torch::randn({2, 6}, at::detail::createCPUGenerator(step));
        torch::Tensor y;
        if (routed) {
          y = net->forward(x);
        } else {  // as a model that knows nothing of units writes its forward
          auto h = net->in(x);
          for (auto& block : net->blocks) h = block->forward(h);
          y = net->out(h);
        }
        acc.backward(torch::mse_loss(y, torch::zeros({2, 3})));
        RANK_REQUIRE(acc.step());
      }
    });
    std::cerr.rdbuf(cerr);
    const std::string warning =
        "3 module(s) the wrap policy chose as shard units never ran "
        "through unitForward ('block0', 'block1', 'block2')";
    if (routed) {
      CHECK(said.str().find("never ran through unitForward") == std::string::npos);
    } else {
      CHECK_THAT(said.str(), Catch::Contains(warning));
      CHECK(said.str().find(warning) == said.str().rfind(warning));  // once, from rank 0
    }
  }
}

TEST_CASE("planUnits: inner units first, buckets in reverse order, frozen parameters apart",
          "[sharded]") {
  Tower tower(4, 2);
  tower->blocks[1]->ln->weight.set_requires_grad(false);
  WrapOptions options{.policy = WrapPolicy::kTransformerBased, .unit_types = {"Block"}};
  // A unit inside a unit: the inner one keeps its parameters, the outer takes the rest.
  options.wrapped = {tower->blocks[0].get(), tower->blocks[0]->fc.get()};
  const UnitPlan plan = planUnits(*tower, options);
  std::vector<std::string> names;
  for (const auto& u : plan.units) names.push_back(u.name);
  CHECK(names == std::vector<std::string>{"block0", "block0.fc", "block1", "bucket 0"});
  CHECK(plan.units[0].names == std::vector<std::string>{"block0.ln.weight", "block0.ln.bias"});
  CHECK(plan.units[2].names ==
        std::vector<std::string>{"block1.ln.bias", "block1.fc.weight", "block1.fc.bias"});
  CHECK(plan.units[3].names ==
        std::vector<std::string>{"out.bias", "out.weight", "in.bias", "in.weight"});
  CHECK(plan.units[3].module == nullptr);
  REQUIRE(plan.frozen.size() == 1);
  CHECK(plan.frozen[0].is_same(tower->blocks[1]->ln->weight));
  CHECK(plan.reduce_order == std::vector<size_t>{2, 1, 0, 3});

  // Below stage 3: buckets only, closed at bucket_bytes (in.weight alone is 96 bytes).
  const UnitPlan buckets = planUnits(*tower, {.module_units = false, .bucket_bytes = 100});
  CHECK(buckets.units.size() > 2);
  for (const auto& u : buckets.units) CHECK(u.module == nullptr);

  CHECK_THROWS_WITH(
      planUnits(*tower, {.policy = WrapPolicy::kTransformerBased, .unit_types = {"Decoder"}}),
      Catch::Contains("its module types are: BlockImpl, LayerNormImpl"));
}

TEST_CASE("A ShardUnit moves between unsharded, gathering and sharded", "[sharded]") {
  auto fake = makeFakeWorld(2);
  onRanks(2, [&](int r) {
    torch::NoGradGuard no_grad;
    std::shared_ptr<Backend> backend = makeFakeBackend(fake, r);
    const auto a = torch::arange(5, torch::kFloat), b = torch::full({2}, 7.0f);
    ShardUnit unit("u", nullptr);
    unit.flat() = FlatParameter({a.clone(), b.clone()}, {"a", "b"}, 2, r);
    CHECK(unit.state() == ShardUnit::State::kUnsharded);
    const torch::Tensor mine = unit.flat().shard().clone();
    unit.reshard(nullptr);
    CHECK(unit.state() == ShardUnit::State::kSharded);
    CHECK_FALSE(unit.flat().resident());
    unit.unshard(*backend, mine, nullptr);
    CHECK(unit.state() == ShardUnit::State::kGathering);
    unit.waitUnsharded();
    CHECK(unit.state() == ShardUnit::State::kUnsharded);
    CHECK(torch::equal(unit.flat().params()[0], a));
    CHECK(torch::equal(unit.flat().params()[1], b));
    unit.reshard(nullptr);  // twice: nothing more to free
    unit.reshard(nullptr);
    CHECK(unit.state() == ShardUnit::State::kSharded);
  });
}
