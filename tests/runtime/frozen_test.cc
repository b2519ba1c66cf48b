// Frozen parameters (requires_grad false: a LoRA run's base weights) in every strategy: they end
// bit for bit as they started, held in the compute dtype under mixed precision, with no gradient
// and no optimizer state, while the trainable ones follow DDP's loss curve; a checkpoint of a
// run whose frozen parameters came from loadModel holds the trainable ones only and names its
// base, resumes bit for bit over the same base and refuses another. Ranks are threads over the
// Fake backend; the files are real.

#include <torch/torch.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "runtime/accelerator.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/deferred_init.h"
#include "runtime/precision/policy.h"
#include "runtime/strategy/sharded.h"
#include "runtime/world.h"
#include "support/ranks.h"
#include "support/subprocess.h"
#include "tower.h"

using namespace cxxlaunch::runtime;
namespace tensorfile = cxxlaunch::tensorfile;
using cxxlaunch::runtime::testing::Tower;
using cxxlaunch::testing::onRanks;
using cxxlaunch::testing::TempDir;

namespace {

constexpr int64_t kGlobalBatch = 8;

// The base of a LoRA-like split of the tower: the input layer and every block's weight matrix.
bool isFrozen(const std::string& name) {
  return name.rfind("in.", 0) == 0 || name.find(".fc.weight") != std::string::npos;
}

struct Job {
  std::string strategy = "ddp";
  int world = 2;
  std::string precision = "no";
  bool deferred = false;  // zero3_init_flag: the tower built under a DeferredInit
  bool checkpointing = false;
  std::string nvme{};        // the optimizer state offloaded to nvme there
  bool nvme_params = false;  // ZeRO-3's masters there too
  int nodes = 1;
  bool freeze = true;
  std::string base{};  // loadModel(base) after prepare
  std::string load{};  // then loadState(load)
  std::string save{};  // saveState(save) at the end
  std::string layout = "sharded";
  int64_t from_step = 0, to_step = 4;
};

struct Ended {
  std::vector<double> losses;                      // rank 0's, one a step
  std::map<std::string, torch::Tensor> frozen;     // rank 0's, as held
  std::map<std::string, torch::Tensor> trainable;  // whole, float32
  MemoryReport memory;                             // rank 0's
  std::vector<int> frozen_gradients;               // per rank: frozen parameters with a .grad
};

std::map<std::string, torch::Tensor> initialTower() {
  torch::manual_seed(42);
  Tower net(11, 3);
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : net->named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

Ended run(const Job& job) {
  auto fake = makeFakeWorld(job.world);
  Ended ended;
  ended.frozen_gradients.resize(static_cast<size_t>(job.world));
  std::mutex construction;
  onRanks(job.world, [&](int r) {
    World world;
    world.env.rank = r;
    world.env.world_size = job.world;
    world.env.strategy = job.strategy;
    world.env.mixed_precision = job.precision;
    world.env.fsdp_transformer_layer_cls = {"Block"};
    world.env.fsdp_auto_wrap_policy = WrapPolicy::kTransformerBased;
    world.env.fsdp_activation_checkpointing = job.checkpointing;
    world.env.zero3_init_flag = job.deferred;
    world.env.node_rank = r / (job.world / job.nodes);
    world.env.num_nodes = job.nodes;
    world.env.state_dict_type =
        job.layout == "full" ? StateDictType::kFull : StateDictType::kSharded;
    if (!job.nvme.empty()) {
      world.env.offload_optimizer = OffloadDevice::kNvme;
      world.env.offload_optimizer_nvme_path = job.nvme;
      if (job.nvme_params) {
        world.env.offload_params = OffloadDevice::kNvme;
        world.env.offload_param_nvme_path = job.nvme;
      }
    }
    world.backend = makeFakeBackend(fake, r);
    Accelerator acc(std::move(world), {});
    Tower net = [&] {
      std::lock_guard<std::mutex> lock(construction);
      torch::manual_seed(42);
      Tower tower(11, 3);
      // LibTorch's layers make their values at once: under the scope, each parameter is given
      // its initializer anew (its own values), so that prepare makes it.
      auto deferred = acc.deferredInit();
      for (auto& p : tower->parameters()) {
        const torch::Tensor values = p.detach().clone();
        initParameter(p, [values](torch::Tensor& t) { t.copy_(values); });
      }
      return tower;
    }();
    if (job.freeze) {
      for (auto& item : net->named_parameters()) {
        if (isFrozen(item.key())) item.value().requires_grad_(false);
      }
    }
    torch::optim::AdamW optimizer(net->parameters(),
                                  torch::optim::AdamWOptions(0.01).weight_decay(0.1));
    acc.prepare(net.ptr(), optimizer);
    if (!job.base.empty()) acc.loadModel(job.base);
    if (!job.load.empty()) acc.loadState(job.load);
    RANK_REQUIRE(acc.optimizerSteps() == job.from_step);
    const int64_t per_rank = kGlobalBatch / job.world;
    for (int64_t s = job.from_step; s < job.to_step; ++s) {
      auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(100 + s));
      const auto x = torch::randn({kGlobalBatch, 6}, gen).narrow(0, r * per_rank, per_rank);
      const auto y = torch::randn({kGlobalBatch, 3}, gen).narrow(0, r * per_rank, per_rank);
      const torch::Tensor loss = torch::mse_loss(net->forward(x), y);
      acc.backward(loss);
      RANK_REQUIRE(acc.step());
      if (r == 0) ended.losses.push_back(loss.item<double>());
    }
    if (!job.save.empty()) acc.saveState(job.save);
    auto params = acc.fullParameters();
    // With a filter only the names it keeps are copied: here the trainable ones, as an adapter
    // export asks, and the same values.
    const auto kept = acc.fullParameters([](const std::string& name) { return !isFrozen(name); });
    for (const auto& [name, tensor] : kept) RANK_REQUIRE(!isFrozen(name));
    size_t trainable_count = 0;
    for (const auto& item : params) trainable_count += isFrozen(item.first) ? 0 : 1;
    RANK_REQUIRE(kept.size() == trainable_count);
    int with_gradient = 0;
    for (const auto& item : net->named_parameters()) {
      if (!item.value().requires_grad() && item.value().grad().defined()) ++with_gradient;
    }
    ended.frozen_gradients[static_cast<size_t>(r)] = with_gradient;
    if (r != 0) return;
    for (auto& [name, tensor] : params) {
      if (!isFrozen(name) || !job.freeze) ended.trainable[name] = tensor;
    }
    for (const auto& item : net->named_parameters()) {
      if (!item.value().requires_grad()) ended.frozen[item.key()] = item.value().detach().clone();
    }
    ended.memory = acc.memoryReport();
  });
  return ended;
}

double maxRelativeDifference(const std::map<std::string, torch::Tensor>& a,
                             const std::map<std::string, torch::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (const auto& [name, ta] : a) {
    const auto& tb = b.at(name);
    worst = std::max(worst, (ta - tb).abs().max().item<double>() /
                                std::max(tb.abs().max().item<double>(), 1e-12));
  }
  return worst;
}

double maxRelativeDifference(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
  }
  return worst;
}

// The InvalidArgument `job` ends with.
std::string refusal(const Job& job) {
  try {
    run(job);
  } catch (const cxxlaunch::InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument)";
}

int64_t numelOf(bool frozen) {
  int64_t n = 0;
  for (const auto& [name, t] : initialTower()) n += isFrozen(name) == frozen ? t.numel() : 0;
  return n;
}

// What every run must show of its frozen parameters: the values they started with, in the
// compute dtype, no gradient on any rank, no optimizer state (AdamW's 8 bytes a trainable
// element on this rank, some padding aside) and their bytes under "parameters".
void checkFrozen(const Ended& ended, const Job& job) {
  const auto dtype = job.precision == "bf16" ? torch::kBFloat16 : torch::kFloat;
  const auto initial = initialTower();
  REQUIRE(ended.frozen.size() == 5);  // in.weight, in.bias, three fc.weight
  int64_t frozen_bytes = 0;
  for (const auto& [name, held] : ended.frozen) {
    INFO(name);
    CHECK(held.scalar_type() == dtype);
    CHECK(torch::equal(held, initial.at(name).to(dtype)));
    frozen_bytes += held.numel() * static_cast<int64_t>(held.element_size());
  }
  for (int g : ended.frozen_gradients) CHECK(g == 0);
  CHECK(ended.memory.parameters >= static_cast<size_t>(frozen_bytes));
  const auto trainable = static_cast<size_t>(numelOf(false) + 16);
  // (nvme's staging and swap files come in fixed pieces whatever the state's size)
  if (job.nvme.empty()) CHECK(ended.memory.optimizer_state <= 8 * trainable);
}

}  // namespace

TEST_CASE(
    "frozen parameters: unchanged, in the compute dtype, no gradient or optimizer state, "
    "in every strategy, the rest on DDP's loss curve",
    "[frozen]") {
  torch::set_num_threads(1);
  for (const std::string precision : {"no", "bf16"}) {
    Job reference{.precision = precision};
    const Ended ddp = run(reference);
    checkFrozen(ddp, reference);
    for (const std::string strategy : {"zero1", "zero2", "zero3", "fsdp_full_shard",
                                       "fsdp_shard_grad_op", "fsdp_hybrid_shard"}) {
      const bool hybrid = strategy == "fsdp_hybrid_shard";
      Job job{.strategy = strategy,
              .world = hybrid ? 4 : 2,
              .precision = precision,
              .nodes = hybrid ? 2 : 1};
      const Ended ended = run(job);
      INFO(strategy << " " << precision);
      checkFrozen(ended, job);
      const double tolerance = precision == "bf16" ? 1e-2 : 1e-5;
      // Rank 0's losses: of its share of the batch, which the world decides.
      const Ended same_world = hybrid ? run({.world = 4, .precision = precision}) : ddp;
      CHECK(maxRelativeDifference(ended.losses, same_world.losses) < tolerance);
      CHECK(maxRelativeDifference(ended.trainable, ddp.trainable) < tolerance);
    }
  }
}

TEST_CASE("frozen parameters under zero3_init, activation checkpointing and nvme offload",
          "[frozen]") {
  torch::set_num_threads(1);
  TempDir dir;
  for (const std::string precision : {"no", "bf16"}) {
    const Ended ddp = run({.precision = precision});
    const double tolerance = precision == "bf16" ? 1e-2 : 1e-5;
    const std::vector<Job> jobs = {
        {.strategy = "zero3", .precision = precision, .deferred = true},
        {.strategy = "fsdp_full_shard", .precision = precision, .deferred = true},
        {.strategy = "zero2", .precision = precision, .deferred = true},
        {.strategy = "ddp", .precision = precision, .deferred = true},
        {.strategy = "fsdp_full_shard", .precision = precision, .checkpointing = true},
        {.strategy = "zero3", .precision = precision, .nvme = dir.path() + "/nvme3"},
        {.strategy = "zero2", .precision = precision, .nvme = dir.path() + "/nvme2"},
    };
    for (const Job& job : jobs) {
      if (!job.nvme.empty()) std::filesystem::create_directories(job.nvme);
      INFO(job.strategy << " " << precision << (job.deferred ? " zero3_init" : "")
                        << (job.checkpointing ? " activation checkpointing" : "")
                        << (job.nvme.empty() ? "" : " nvme"));
      const Ended ended = run(job);
      checkFrozen(ended, job);
      CHECK(maxRelativeDifference(ended.losses, ddp.losses) < tolerance);
      CHECK(maxRelativeDifference(ended.trainable, ddp.trainable) < tolerance);
    }
  }
}

TEST_CASE("frozen parameters with the optimizer state offloaded to host memory", "[frozen]") {
  torch::set_num_threads(1);
  // Driven directly: a CPU run through the Accelerator has nothing to offload.
  auto train = [](bool offload) {
    constexpr int kWorld = 2;
    auto fake = makeFakeWorld(kWorld);
    std::map<std::string, torch::Tensor> frozen, trainable;
    MemoryReport memory;
    std::mutex construction;
    onRanks(kWorld, [&](int r) {
      Tower net = [&] {
        std::lock_guard<std::mutex> lock(construction);
        torch::manual_seed(42);
        return Tower(11, 3);
      }();
      for (auto& item : net->named_parameters()) {
        if (isFrozen(item.key())) item.value().requires_grad_(false);
      }
      torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(0.01));
      ShardingOptions options;
      options.stage = 3;
      options.unit_types = {"Block"};
      options.wrap_policy = WrapPolicy::kTransformerBased;
      options.compute_dtype = torch::kBFloat16;
      options.offload_to_host = offload;
      ShardedStrategy strategy(makeFakeBackend(fake, r), net.ptr(), optimizer, options);
      for (int64_t s = 0; s < 3; ++s) {
        auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(100 + s));
        const auto x = torch::randn({kGlobalBatch, 6}, gen).narrow(0, r * 4, 4);
        const auto y = torch::randn({kGlobalBatch, 3}, gen).narrow(0, r * 4, 4);
        torch::Tensor loss;
        {
          AutocastScope autocast(torch::kCPU, torch::kBFloat16, true);
          loss = torch::mse_loss(net->forward(x), y);
        }
        strategy.beforeBackward(true);
        loss.backward();
        strategy.afterBackward(true);
        strategy.step();
        strategy.zeroGrad();
      }
      auto params = strategy.fullParameters();
      if (r != 0) return;
      for (auto& [name, t] : params) {
        if (!isFrozen(name)) trainable[name] = t;
      }
      for (const auto& item : net->named_parameters()) {
        if (!item.value().requires_grad()) frozen[item.key()] = item.value().detach().clone();
      }
      memory = strategy.memoryReport();
    });
    return std::make_tuple(frozen, trainable, memory);
  };
  const auto [frozen, trainable, memory] = train(true);
  const auto [frozen_here, trainable_here, memory_here] = train(false);
  const auto initial = initialTower();
  REQUIRE(frozen.size() == 5);
  for (const auto& [name, held] : frozen) {
    CHECK(held.scalar_type() == torch::kBFloat16);
    CHECK(torch::equal(held, initial.at(name).to(torch::kBFloat16)));
  }
  for (const auto& [name, t] : trainable) CHECK(torch::equal(t, trainable_here.at(name)));
  // Offloaded: the trainable shards' masters, gradients and optimizer state; nothing frozen.
  CHECK(memory.offloaded_to_cpu > 0);
  CHECK(memory.offloaded_to_cpu <= static_cast<size_t>(16 * (numelOf(false) + 16)));
  CHECK(memory.optimizer_state == 0);
}

TEST_CASE("a LoRA run's checkpoint: the trainable parameters and a reference to the base",
          "[frozen][checkpoint]") {
  torch::set_num_threads(1);
  TempDir dir;
  // The base: the tower's values moved, so that a run that did not load it would differ. The
  // output layer plays the adapters: trainable and not in the base, it keeps its own values.
  auto writeBase = [&](const std::string& folder, double shift) {
    std::filesystem::create_directories(folder);
    std::vector<std::pair<std::string, torch::Tensor>> tensors;
    for (const auto& [name, t] : initialTower()) {
      if (name.rfind("out.", 0) != 0) tensors.emplace_back(name, t + shift);
    }
    checkpoint::writeSafetensorsFile(folder + "/model.safetensors", tensors);
  };
  const std::string base = dir.path() + "/base", other = dir.path() + "/other";
  writeBase(base, 0.25);
  writeBase(other, 0.5);  // another fine-tune of the same model: same names, shapes and sizes
  // loadModel: the base's values into the frozen parameters (cast to their dtype) and the
  // trainable ones it holds; the "adapters" keep theirs, wherever the masters rest.
  const auto initial = initialTower();
  std::filesystem::create_directories(dir.path() + "/nvme");
  for (const Job& job :
       std::vector<Job>{{.strategy = "ddp", .base = base, .to_step = 0},
                        {.strategy = "ddp", .precision = "bf16", .base = base, .to_step = 0},
                        {.strategy = "zero3", .precision = "bf16", .base = base, .to_step = 0},
                        {.strategy = "zero3",
                        .nvme = dir.path() + "/nvme",
                        .nvme_params = true,
                        .base = base,
                        .to_step = 0},
                        {.strategy = "zero2", .deferred = true, .base = base, .to_step = 0}}) {
    INFO(job.strategy << " " << job.precision << (job.nvme.empty() ? "" : " nvme"));
    const Ended loaded = run(job);
    const auto dtype = job.precision == "bf16" ? torch::kBFloat16 : torch::kFloat;
    for (const auto& [name, t] : loaded.frozen) {
      CHECK(torch::equal(t, (initial.at(name) + 0.25).to(dtype)));
    }
    for (const auto& [name, t] : loaded.trainable) {
      INFO(name);
      const bool adapter = name.rfind("out.", 0) == 0;
      CHECK(torch::equal(t, adapter ? initial.at(name) : initial.at(name) + 0.25));
    }
  }
  for (const auto& [strategy, precision, layout] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"ddp", "no", "sharded"},
           {"zero3", "bf16", "sharded"},
           {"zero3", "no", "full"},
           {"fsdp_shard_grad_op", "bf16", "sharded"}}) {
    INFO(strategy << " " << precision << " " << layout);
    const std::string saved = dir.path() + "/" + strategy + precision + layout;
    const Job whole{.strategy = strategy, .precision = precision, .base = base, .layout = layout};
    const Ended uninterrupted = run(whole);
    Job first = whole;
    first.to_step = 2;
    first.save = saved;
    run(first);
    Job second = whole;
    second.load = saved;
    second.from_step = 2;
    const Ended resumed = run(second);
    for (const auto& [name, t] : uninterrupted.trainable) {
      INFO(name);
      CHECK(torch::equal(t, resumed.trainable.at(name)));
    }
    for (const auto& [name, t] : uninterrupted.frozen)
      CHECK(torch::equal(t, resumed.frozen.at(name)));
    CHECK(uninterrupted.losses[2] == resumed.losses[0]);
    CHECK(uninterrupted.losses[3] == resumed.losses[1]);

    const tensorfile::Reader reader(saved);
    for (const auto& [name, t] : initialTower()) {
      INFO(name);
      CHECK(reader.has(name, "param") == !isFrozen(name));
    }
    const auto fingerprint = reader.counter(tensorfile::kBaseFingerprintCounter);
    REQUIRE(fingerprint);
    CHECK(*fingerprint == checkpoint::SafetensorsReader(base).fingerprint());
    CHECK(fingerprint->rfind("sha256:", 0) == 0);

    Job changed = second;
    changed.base = other;
    const std::string now = checkpoint::SafetensorsReader(other).fingerprint();
    CHECK(now != *fingerprint);
    CHECK_THAT(refusal(changed), Catch::Contains("the base changed since") &&
                                     Catch::Contains(*fingerprint) && Catch::Contains(now) &&
                                     Catch::Contains(std::filesystem::absolute(other).string()));
    Job unloaded = second;
    unloaded.base.clear();
    CHECK_THAT(refusal(unloaded),
               Catch::Contains("load that with acc.loadModel") && Catch::Contains(*fingerprint));
  }
}

TEST_CASE("a checkpoint without frozen parameters names no base", "[frozen][checkpoint]") {
  torch::set_num_threads(1);
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/base");
  const auto initial = initialTower();
  std::vector<std::pair<std::string, torch::Tensor>> tensors(initial.begin(), initial.end());
  checkpoint::writeSafetensorsFile(dir.path() + "/base/model.safetensors", tensors);
  for (const bool freeze : {false, true}) {
    // Frozen without loadModel: their values are the run's own, saved with it.
    Job job{.freeze = freeze,
            .base = freeze ? "" : dir.path() + "/base",
            .save = dir.path() + "/saved" + std::to_string(freeze)};
    run(job);
    const tensorfile::Reader reader(job.save);
    CHECK_FALSE(reader.counter(tensorfile::kBaseFingerprintCounter));
    for (const auto& [name, t] : initialTower()) CHECK(reader.has(name, "param"));
  }
  // Without frozen parameters an export is the whole model: one without the output layer is
  // refused, naming it.
  tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                               [](const auto& t) { return t.first.rfind("out.", 0) == 0; }),
                tensors.end());
  checkpoint::writeSafetensorsFile(dir.path() + "/base/model.safetensors", tensors);
  CHECK_THAT(refusal({.freeze = false, .base = dir.path() + "/base"}),
             Catch::Contains("missing in the export") && Catch::Contains("out.weight"));
}
