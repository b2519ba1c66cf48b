// What the wrap policy decides (runtime/strategy/unit_plan.h): which modules are shard units,
// the buckets that take the rest, and the modules fsdp_activation_checkpointing recomputes, at
// every stage; ranks are threads over the Fake backend (sharded_run.h).

#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <iostream>
#include <mutex>
#include <sstream>

#include "runtime/accelerator.h"
#include "runtime/strategy/unit_plan.h"
#include "runtime/world.h"
#include "sharded_run.h"
#include "support/ranks.h"
#include "tower.h"

using namespace cxxlaunch::runtime;
using namespace cxxlaunch::runtime::testing;
using cxxlaunch::testing::onRanks;

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

TEST_CASE("Activation checkpointing follows the wrap policy at every stage",
          "[sharded][checkpointing]") {
  torch::set_num_threads(1);
  // SIZE_BASED_WRAP at 140 parameters: each block (154) is the policy's, its `fc` (132), `in`
  // (77) and `out` (36) are not; below stage 3 the blocks are no units, and are recomputed all
  // the same.
  Run run{.world = 2,
          .wrap_policy = WrapPolicy::kSizeBased,
          .unit_types = {},
          .min_num_params = 140,
          .steps = 2};
  BlockImpl::forward_calls = 0;
  const Result plain = train(run);
  const int64_t plain_calls = BlockImpl::forward_calls.exchange(0);
  for (const std::string strategy : {"ddp", "zero2", "zero3"}) {
    INFO(strategy);
    run.strategy = strategy;
    run.checkpointing = true;
    const Result checkpointed = train(run);
    CHECK(BlockImpl::forward_calls.exchange(0) == 2 * plain_calls);
    CHECK(maxRelativeDifference(checkpointed, plain) < 1e-5);
  }
}

TEST_CASE("fsdp_activation_checkpointing with nothing to checkpoint is refused",
          "[sharded][checkpointing]") {
  Run run{.world = 1, .steps = 1, .checkpointing = true};
  run.unit_types = {};
  CHECK_THROWS_WITH(train(run), Catch::Contains("no module is a unit to checkpoint"));
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
  const std::vector<const torch::nn::Module*> policy_modules = {
      tower->blocks[0].get(), tower->blocks[0]->fc.get(), tower->blocks[1].get()};
  CHECK(plan.policy_modules == policy_modules);

  // Below stage 3: buckets only, closed at bucket_bytes (in.weight alone is 96 bytes), and the
  // policy's modules the same (what fsdp_activation_checkpointing recomputes at every stage).
  const UnitPlan buckets = planUnits(*tower, {.module_units = false, .bucket_bytes = 100});
  CHECK(buckets.units.size() > 2);
  for (const auto& u : buckets.units) CHECK(u.module == nullptr);
  options.module_units = false;
  const UnitPlan no_units = planUnits(*tower, options);
  for (const auto& u : no_units.units) CHECK(u.module == nullptr);
  CHECK(no_units.policy_modules == policy_modules);
  size_t bucketed = 0;
  for (const auto& u : no_units.units) bucketed += u.params.size();
  CHECK(bucketed == tower->parameters().size() - 1);  // all but the frozen one

  // A module the policy names with nothing to train is no unit, and still the policy's.
  for (auto& p : tower->blocks[1]->parameters()) p.set_requires_grad(false);
  options.module_units = true;
  const UnitPlan frozen_block = planUnits(*tower, options);
  for (const auto& u : frozen_block.units) CHECK(u.module != tower->blocks[1].get());
  CHECK(frozen_block.policy_modules == policy_modules);

  CHECK_THROWS_WITH(
      planUnits(*tower, {.policy = WrapPolicy::kTransformerBased, .unit_types = {"Decoder"}}),
      Catch::Contains("its module types are: BlockImpl, LayerNormImpl"));
}
