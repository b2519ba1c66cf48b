// The sharded strategies with their state offloaded: to NVMe files (through the Accelerator, as
// a launch configures it) and to host memory (cpu offload, driven directly: a CPU run has nothing
// to offload). Either way the parameters must end where DDP's, or the run without offload, do.

#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "runtime/accelerator.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/strategy_state.h"
#include "runtime/precision/policy.h"
#include "runtime/strategy/sharded.h"
#include "runtime/world.h"
#include "sharded_run.h"
#include "support/ranks.h"
#include "support/subprocess.h"
#include "tower.h"

using namespace cxxlaunch::runtime;
namespace tensorfile = cxxlaunch::tensorfile;
using namespace cxxlaunch::runtime::testing;
using cxxlaunch::testing::onRanks;

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
      const tensorfile::Reader reader(run.load_from);
      checkpoint::loadStrategyState(strategy, reader, *backend);
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
      const tensorfile::Counters counters = {{"optimizer_steps", std::to_string(run.steps)}};
      const auto type = run.full_layout ? StateDictType::kFull : StateDictType::kSharded;
      checkpoint::save(*backend, run.save_to, strategy.stateStream(type, true), {}, counters);
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
