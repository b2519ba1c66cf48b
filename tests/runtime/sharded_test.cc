// The sharded strategies (ZeRO-1/2/3, FSDP FULL_SHARD / SHARD_GRAD_OP / NO_SHARD) against DDP:
// ranks are threads over the Fake backend, each mode trains the same model on the same data, and
// the whole parameters (gathered from the shards) must end where DDP's do (sharded_run.h). DDP
// itself is checked against one process on the whole batch in ddp_test.cc; the offloads in
// sharded_offload_test.cc.

#include "runtime/strategy/sharded.h"

#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <map>
#include <mutex>

#include "runtime/accelerator.h"
#include "runtime/checkpoint/state_load.h"
#include "runtime/precision/policy.h"
#include "runtime/strategy/unit.h"
#include "runtime/world.h"
#include "sharded_run.h"
#include "support/ranks.h"
#include "support/subprocess.h"
#include "tower.h"

using namespace cxxlaunch::runtime;
using namespace cxxlaunch::runtime::testing;
using cxxlaunch::testing::onRanks;

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
