// Checkpoints (runtime/checkpoint/): a run saved at step k and resumed in a fresh job ends bit for
// bit where the uninterrupted run ends, in every strategy, fp32 and bf16; a checkpoint loads at
// another world size and in another strategy; incomplete and corrupt checkpoints are never
// loaded. Ranks are threads over the Fake backend; the files are real.

#include "runtime/checkpoint/checkpoint.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <array>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <tuple>

#include "common/error.h"
#include "runtime/accelerator.h"
#include "runtime/checkpoint/files.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/checkpoint/state_load.h"
#include "runtime/optim/param_state_key.h"
#include "runtime/strategy/strategy.h"
#include "support/page_cache.h"
#include "support/ranks.h"
#include "support/subprocess.h"
#include "tower.h"

using namespace cxxlaunch::runtime;
using cxxlaunch::runtime::testing::Tower;
using cxxlaunch::testing::onRanks;
namespace fs = std::filesystem;

namespace {

// A job's layout as the launcher spells it (CXXLAUNCH_STATE_DICT_TYPE).
StateDictType stateDictType(const std::string& layout) {
  return layout == "full" ? StateDictType::kFull : StateDictType::kSharded;
}

struct Job {
  std::string strategy = "ddp";
  int world = 2;
  std::string optimizer = "adamw";
  std::string precision = "no";
  int64_t global_batch = 8;  // examples per optimizer step, over all ranks
  int64_t from_step = 0;     // the optimizer step the job starts at
  int64_t to_step = 4;
  std::string load{};    // a checkpoint (or folder of them) to resume from
  std::string save{};    // where to save at the end
  int64_t save_at = -1;  // and after this step, to save_at_dir
  std::string save_at_dir{};
  int64_t seed = 42;               // the model's initial weights (a resumed job's are overwritten)
  std::string nvme{};              // offload optimizer state and parameters to this directory
  std::string layout = "sharded";  // saveState's: sharded | full
  std::string roll_back{};         // at to_step, load this checkpoint and train to to_step again
  int64_t d = 11;                  // the Tower's width
  bool async = false;              // checkpoint_async: saves written in the background
};

// A trainer's own optimizer (plain SGD with a decaying step per parameter): state of a type
// saveState does not know.
struct OwnState : torch::optim::OptimizerCloneableParamState<OwnState> {
  TORCH_ARG(double, scale) = 1.0;
};
struct OwnOptions : torch::optim::OptimizerCloneableOptions<OwnOptions> {
  TORCH_ARG(double, lr) = 0.05;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};
class OwnOptimizer : public torch::optim::Optimizer {
 public:
  explicit OwnOptimizer(std::vector<torch::Tensor> params)
      : Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                  std::make_unique<OwnOptions>()) {}
  torch::Tensor step(LossClosure) override {
    torch::NoGradGuard no_grad;
    for (auto& group : param_groups()) {
      const double lr = group.options().get_lr();
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        auto& s = state()[paramStateKey(state(), p)];
        if (!s) s = std::make_unique<OwnState>();
        auto& own = static_cast<OwnState&>(*s);
        own.scale(own.scale() * 0.9);
        p.add_(p.grad(), -lr * own.scale());
      }
    }
    return {};
  }
};

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const std::string& kind,
                                                       std::vector<torch::Tensor> params) {
  using namespace torch::optim;
  if (kind == "sgd") return std::make_unique<SGD>(params, SGDOptions(0.05).momentum(0.9));
  if (kind == "adamw_amsgrad") {
    return std::make_unique<AdamW>(params, AdamWOptions(0.01).weight_decay(0.1).amsgrad(true));
  }
  if (kind == "adam_amsgrad") {
    return std::make_unique<Adam>(params, AdamOptions(0.01).weight_decay(0.1).amsgrad(true));
  }
  if (kind == "rmsprop") {  // every array RMSprop has
    return std::make_unique<RMSprop>(params, RMSpropOptions(0.01).momentum(0.9).centered(true));
  }
  if (kind == "adagrad") {  // the step count matters with lr_decay
    return std::make_unique<Adagrad>(
        params, AdagradOptions(0.05).lr_decay(0.1).initial_accumulator_value(0.1));
  }
  if (kind == "own") return std::make_unique<OwnOptimizer>(params);
  if (kind != "adamw") throw std::invalid_argument("no optimizer " + kind);
  return std::make_unique<AdamW>(params, AdamWOptions(0.01).weight_decay(0.1));
}

// The data of optimizer step s: the same whatever the world size.
std::pair<torch::Tensor, torch::Tensor> batchOf(int64_t step, int64_t batch) {
  auto gen = at::detail::createCPUGenerator(1000 + step);
  return {torch::randn({batch, 6}, gen), torch::randn({batch, 3}, gen)};
}

struct Ended {
  std::map<std::string, torch::Tensor> params;  // rank 0's, gathered whole
  std::string loaded;
  int64_t optimizer_steps = 0;
  double lr = 0;
  int64_t state_kept = 0, state_moved = 0;  // torch::optim state arrays loads kept, or not
};

// The memory of each array of the torch::optim state (AdamW's and SGD's), by parameter.
std::vector<const void*> stateMemory(torch::optim::Optimizer& optimizer) {
  std::vector<const void*> out;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      auto it = optimizer.state().find(paramStateKey(optimizer.state(), p));
      if (it == optimizer.state().end()) continue;
      if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
        out.push_back(s->exp_avg().data_ptr());
        out.push_back(s->exp_avg_sq().data_ptr());
      } else if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
        out.push_back(s->momentum_buffer().data_ptr());
      }
    }
  }
  return out;
}

Ended run(const Job& job) {
  auto fake = makeFakeWorld(job.world);
  Ended ended;
  std::mutex construction;
  onRanks(job.world, [&](int r) {
    Tower net = [&] {
      std::lock_guard<std::mutex> lock(construction);
      torch::manual_seed(job.seed);
      return Tower(job.d, 3);
    }();
    auto optimizer = makeOptimizer(job.optimizer, net->parameters());
    LrScheduler schedule(*optimizer, LrScheduler::Kind::kLinear, 1, 20);
    World world;
    world.env.rank = r;
    world.env.world_size = job.world;
    world.env.strategy = job.strategy;
    world.env.mixed_precision = job.precision;
    world.env.fsdp_transformer_layer_cls = {"Block"};
    world.env.fsdp_auto_wrap_policy = WrapPolicy::kTransformerBased;
    world.env.state_dict_type = stateDictType(job.layout);
    world.env.checkpoint_async = job.async;
    if (!job.nvme.empty()) {
      world.env.offload_optimizer = world.env.offload_params = OffloadDevice::kNvme;
      world.env.offload_optimizer_nvme_path = world.env.offload_param_nvme_path = job.nvme;
    }
    world.backend = makeFakeBackend(fake, r);
    Accelerator acc(std::move(world), {});
    acc.prepare(net.ptr(), *optimizer, &schedule);
    // Counts the torch::optim state arrays a load kept in their memory, and those it moved.
    auto load = [&](const std::string& from) {
      const auto before = stateMemory(*optimizer);
      const std::string loaded = acc.loadState(from);
      const auto after = stateMemory(*optimizer);
      RANK_REQUIRE((before.empty() || after.size() == before.size()));
      if (r == 0) {
        for (size_t i = 0; i < before.size(); ++i) {
          ++(before[i] == after[i] ? ended.state_kept : ended.state_moved);
        }
      }
      return loaded;
    };
    if (!job.load.empty()) {
      const std::string loaded = load(job.load);
      if (r == 0) ended.loaded = loaded;
    }
    RANK_REQUIRE(acc.optimizerSteps() == job.from_step);
    const int64_t per_rank = job.global_batch / job.world;
    auto train = [&](int64_t from) {
      for (int64_t s = from; s < job.to_step; ++s) {
        auto [x, y] = batchOf(s, job.global_batch);
        acc.backward(torch::mse_loss(net->forward(x.narrow(0, r * per_rank, per_rank)),
                                     y.narrow(0, r * per_rank, per_rank)));
        RANK_REQUIRE(acc.step());
        if (s + 1 == job.save_at) acc.saveState(job.save_at_dir);
      }
    };
    train(job.from_step);
    if (!job.roll_back.empty()) {
      load(job.roll_back);
      train(acc.optimizerSteps());
    }
    if (!job.save.empty()) acc.saveState(job.save);
    auto params = acc.fullParameters();
    if (r == 0) {
      for (auto& [name, tensor] : params) ended.params[name] = tensor;
      ended.optimizer_steps = acc.optimizerSteps();
      ended.lr = optimizer->param_groups()[0].options().get_lr();
    }
  });
  return ended;
}

double maxRelativeDifference(const Ended& a, const Ended& b) {
  REQUIRE(a.params.size() == b.params.size());
  double worst = 0;
  for (const auto& [name, ta] : a.params) {
    const auto& tb = b.params.at(name);
    worst = std::max(worst, (ta - tb).abs().max().item<double>() /
                                std::max(tb.abs().max().item<double>(), 1e-12));
  }
  return worst;
}

bool sameBytes(const std::string& a, const std::string& b) {
  return cxxlaunch::testing::readFile(a) == cxxlaunch::testing::readFile(b);
}

}  // namespace

TEST_CASE("A resumed job ends bit for bit where the uninterrupted one ends", "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  int case_id = 0;
  for (const std::string precision : {"no", "bf16"}) {
    for (const std::string optimizer : {"adamw", "sgd"}) {
      for (const std::string strategy : {"ddp", "zero1", "zero2", "zero3", "fsdp_full_shard",
                                         "fsdp_shard_grad_op", "fsdp_no_shard"}) {
        INFO(strategy << " " << optimizer << " " << precision);
        const std::string base = dir.path() + "/" + std::to_string(case_id++);
        Job whole{.strategy = strategy, .optimizer = optimizer, .precision = precision};
        whole.save_at = 2;
        whole.save_at_dir = base + "/step2";
        whole.save = base + "/uninterrupted";
        const Ended uninterrupted = run(whole);  // steps 0-3, saved after step 2 and at the end
        Job resumed = whole;
        resumed.from_step = 2;
        resumed.load = base + "/step2";
        resumed.save_at = -1;
        resumed.seed = 7;  // other initial weights: all of them must come from the checkpoint
        resumed.save = base + "/resumed";
        const Ended again = run(resumed);
        CHECK(again.loaded == base + "/step2");
        CHECK(again.optimizer_steps == 4);
        CHECK(again.lr == uninterrupted.lr);
        CHECK(maxRelativeDifference(again, uninterrupted) == 0);
        // Parameters, optimizer state, counters, generators: the files agree byte for byte.
        for (const std::string file : {"manifest", "rank0.bin", "rank1.bin"}) {
          CHECK(sameBytes(base + "/resumed/" + file, base + "/uninterrupted/" + file));
        }
      }
    }
  }
}

TEST_CASE("DDP resumes the state of every torch::optim optimizer bit for bit", "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  int case_id = 0;
  for (const std::string optimizer : {"adamw_amsgrad", "adam_amsgrad", "rmsprop", "adagrad"}) {
    for (const std::string strategy : {"ddp", "fsdp_no_shard"}) {
      for (const std::string layout : {"sharded", "full"}) {
        INFO(optimizer << " " << strategy << " " << layout);
        const std::string base = dir.path() + "/" + std::to_string(case_id++);
        Job whole{.strategy = strategy, .optimizer = optimizer, .layout = layout};
        whole.save_at = 2;
        whole.save_at_dir = base + "/step2";
        whole.save = base + "/uninterrupted";
        const Ended uninterrupted = run(whole);
        Job resumed = whole;
        resumed.from_step = 2;
        resumed.load = base + "/step2";
        resumed.save_at = -1;
        resumed.seed = 7;
        resumed.save = base + "/resumed";
        CHECK(maxRelativeDifference(run(resumed), uninterrupted) == 0);
        for (const std::string file : {"rank0.bin", "rank1.bin"}) {
          CHECK(sameBytes(base + "/resumed/" + file, base + "/uninterrupted/" + file));
        }
        // One process: DDP's state is whole on every rank.
        resumed.world = 1;
        resumed.save = "";
        CHECK(maxRelativeDifference(run(resumed), uninterrupted) < 1e-6);
      }
    }
  }
}

TEST_CASE("A roll-back in a job that has stepped reads into the memory it has and goes on exactly",
          "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  int case_id = 0;
  for (const std::string optimizer : {"adamw", "sgd"}) {
    for (const std::string strategy : {"ddp", "fsdp_no_shard", "zero1", "zero3"}) {
      INFO(strategy << " " << optimizer);
      const std::string base = dir.path() + "/" + std::to_string(case_id++);
      Job whole{.strategy = strategy, .optimizer = optimizer};
      whole.save_at = 2;
      whole.save_at_dir = base + "/step2";
      const Ended uninterrupted = run(whole);
      Job rolled = whole;
      rolled.save_at = -1;
      rolled.roll_back = base + "/step2";  // steps 0-3, back to 2, steps 2-3 again
      const Ended again = run(rolled);
      CHECK(again.optimizer_steps == 4);
      CHECK(maxRelativeDifference(again, uninterrupted) == 0);
      // DDP's state is torch::optim's (ZeRO's and FSDP's sharded state lives in the strategy).
      CHECK(again.state_moved == 0);
      if (strategy == "ddp" || strategy == "fsdp_no_shard") CHECK(again.state_kept > 0);
    }
  }
}

// A head that joins the model only from optimizer step 2 on: until then it has no gradient, and
// torch's AdamW does not step it.
struct LateHeadImpl : torch::nn::Module {
  LateHeadImpl()
      : base(register_module("base", torch::nn::Linear(6, 3))),
        late(register_module("late", torch::nn::Linear(6, 3))) {}
  torch::Tensor forward(const torch::Tensor& x, int64_t step) {
    return step >= 2 ? base(x) + late(x) : base(x);
  }
  torch::nn::Linear base, late;
};
TORCH_MODULE(LateHead);

TEST_CASE("A parameter torch stepped less often than the job resumes with its own step count",
          "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  // Steps [from, 6) at world 2 under DDP; saves after step 4 to `save`; rank 0's parameters.
  auto job = [&](const std::string& layout, int64_t from, const std::string& load,
                 const std::string& save, int64_t seed) {
    auto fake = makeFakeWorld(2);
    std::mutex construction;
    std::map<std::string, torch::Tensor> params;
    onRanks(2, [&](int r) {
      LateHead net = [&] {
        std::lock_guard<std::mutex> lock(construction);
        torch::manual_seed(seed);
        return LateHead();
      }();
      torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(0.01));
      World world;
      world.env.rank = r;
      world.env.world_size = 2;
      world.env.state_dict_type = stateDictType(layout);
      world.backend = makeFakeBackend(fake, r);
      AcceleratorOptions options;
      options.find_unused_parameters = true;
      Accelerator acc(std::move(world), options);
      acc.prepare(net.ptr(), optimizer);
      if (!load.empty()) acc.loadState(load);
      RANK_REQUIRE(acc.optimizerSteps() == from);
      for (int64_t s = from; s < 6; ++s) {
        auto [x, y] = batchOf(s, 4);
        acc.backward(
            torch::mse_loss(net->forward(x.narrow(0, 2 * r, 2), s), y.narrow(0, 2 * r, 2)));
        RANK_REQUIRE(acc.step());
        if (s + 1 == 4 && !save.empty()) acc.saveState(save);
      }
      if (r == 0) {
        for (const auto& item : net->named_parameters()) {
          params[item.key()] = item.value().detach().clone();
        }
      }
    });
    return params;
  };
  for (const std::string layout : {"sharded", "full"}) {
    INFO(layout);
    const std::string saved = dir.path() + "/" + layout;
    const auto uninterrupted = job(layout, 0, "", saved, 42);
    const checkpoint::Reader reader(saved);
    CHECK(reader.counter("step:late.weight") == "2");  // steps 2 and 3 of the job's 4
    CHECK_FALSE(reader.counter("step:base.weight"));   // as many as the job's: not written
    const auto resumed = job(layout, 4, saved, "", 7);
    REQUIRE(resumed.size() == uninterrupted.size());
    for (const auto& [name, value] : uninterrupted) {
      INFO(name);
      CHECK(torch::equal(resumed.at(name), value));
    }
  }
}

TEST_CASE("Learning rates set by hand resume with the checkpoint", "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  for (const std::string strategy : {"ddp", "zero2", "zero3"}) {
    INFO(strategy);
    const std::string saved = dir.path() + "/" + strategy;
    // Two parameter groups, no LrScheduler: the trainer decays the rates itself.
    auto job = [&](bool save, std::vector<double>& lrs) {
      auto fake = makeFakeWorld(2);
      std::mutex construction;
      onRanks(2, [&](int r) {
        Tower net = [&] {
          std::lock_guard<std::mutex> lock(construction);
          torch::manual_seed(42);
          return Tower(11, 2);
        }();
        std::vector<torch::Tensor> first, rest;
        for (auto& item : net->named_parameters()) {
          (item.key().rfind("in.", 0) == 0 ? first : rest).push_back(item.value());
        }
        torch::optim::AdamW optimizer(
            {torch::optim::OptimizerParamGroup(first,
                                               std::make_unique<torch::optim::AdamWOptions>(0.01)),
             torch::optim::OptimizerParamGroup(rest)},
            torch::optim::AdamWOptions(0.02));
        World world;
        world.env.rank = r;
        world.env.world_size = 2;
        world.env.strategy = strategy;
        world.env.fsdp_transformer_layer_cls = {"Block"};
        world.env.fsdp_auto_wrap_policy = WrapPolicy::kTransformerBased;
        world.backend = makeFakeBackend(fake, r);
        Accelerator acc(std::move(world), {});
        acc.prepare(net.ptr(), optimizer);
        if (save) {
          auto [x, y] = batchOf(0, 4);
          acc.backward(torch::mse_loss(net->forward(x.narrow(0, 2 * r, 2)), y.narrow(0, 2 * r, 2)));
          RANK_REQUIRE(acc.step());
          for (auto& group : optimizer.param_groups()) {
            group.options().set_lr(group.options().get_lr() / 3);
          }
          acc.saveState(saved);
        } else {
          acc.loadState(saved);
        }
        if (r == 1) {
          for (auto& group : optimizer.param_groups()) lrs.push_back(group.options().get_lr());
        }
      });
    };
    std::vector<double> at_save, loaded;
    job(true, at_save);
    job(false, loaded);
    REQUIRE(at_save.size() == 2);
    CHECK(at_save[0] == 0.01 / 3);
    CHECK(at_save[1] == 0.02 / 3);
    CHECK(loaded == at_save);  // bit for bit
  }
}

TEST_CASE("saveState refuses an optimizer whose state it cannot keep and writes nothing",
          "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  for (const std::string layout : {"sharded", "full"}) {
    INFO(layout);
    const std::string target = dir.path() + "/" + layout;
    Job job{.optimizer = "own", .to_step = 2, .save = target, .layout = layout};
    std::string message;
    try {
      run(job);
    } catch (const cxxlaunch::InvalidArgument& e) {
      message = e.what();
    }
    CHECK_THAT(message, Catch::Contains("not this optimizer's") && Catch::Contains("acc.save"));
    CHECK_FALSE(fs::exists(target));
    CHECK(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()) == 0);
  }
}

TEST_CASE("The full layout has every parameter whole in rank 0's file and resumes exactly",
          "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  int case_id = 0;
  for (const std::string precision : {"no", "bf16"}) {
    for (const std::string strategy : {"ddp", "zero1", "zero2", "zero3", "fsdp_full_shard"}) {
      INFO(strategy << " " << precision);
      const std::string base = dir.path() + "/" + std::to_string(case_id++);
      Job whole{.strategy = strategy, .precision = precision, .layout = "full"};
      whole.save_at = 2;
      whole.save_at_dir = base + "/step2";
      const Ended uninterrupted = run(whole);
      const checkpoint::ShardFileReader first(base + "/step2/rank0.bin"),
          second(base + "/step2/rank1.bin");
      CHECK(second.slices().empty());  // rank 1 keeps only its generator state
      CHECK(second.hasBlob("rng_cpu"));
      std::set<std::string> whole_params;
      for (const auto& slice : first.slices()) {
        CHECK(slice.begin == 0);
        int64_t numel = 1;
        for (int64_t d : slice.shape) numel *= d;
        CHECK(slice.end == numel);
        whole_params.insert(slice.param);
      }
      CHECK(whole_params.size() == uninterrupted.params.size());
      Job resumed = whole;
      resumed.from_step = 2;
      resumed.load = base + "/step2";
      resumed.save_at = -1;
      resumed.seed = 7;
      CHECK(maxRelativeDifference(run(resumed), uninterrupted) == 0);
      // A full checkpoint loads into another strategy at another world size.
      Job elsewhere = resumed;
      elsewhere.strategy = strategy == "zero3" ? "zero2" : "zero3";
      elsewhere.world = 4;
      elsewhere.layout = "sharded";
      CHECK(maxRelativeDifference(run(elsewhere), uninterrupted) <
            (precision == "no" ? 1e-5 : 2e-2));
    }
  }
}

TEST_CASE("nvme offload's state is in its checkpoints, and loads back to disk or memory",
          "[checkpoint]") {
  torch::set_num_threads(1);
  for (const std::string layout : {"sharded", "full"}) {  // full: gathered from nvme's buffers
    INFO(layout);
    cxxlaunch::testing::TempDir dir;
    const std::string swap = dir.path() + "/swap";
    fs::create_directory(swap);
    Job whole{.strategy = "zero3",
              .save_at = 2,
              .save_at_dir = dir.path() + "/step2",
              .nvme = swap,
              .layout = layout};
    whole.save = dir.path() + "/uninterrupted";
    const Ended uninterrupted = run(whole);
    Job resumed = whole;
    resumed.from_step = 2;
    resumed.load = dir.path() + "/step2";
    resumed.save_at = -1;
    resumed.save = dir.path() + "/resumed";
    resumed.seed = 7;
    CHECK(maxRelativeDifference(run(resumed), uninterrupted) == 0);
    CHECK(sameBytes(dir.path() + "/resumed/rank0.bin", dir.path() + "/uninterrupted/rank0.bin"));
    CHECK(sameBytes(dir.path() + "/resumed/rank1.bin", dir.path() + "/uninterrupted/rank1.bin"));
    resumed.nvme = "";  // the same checkpoint, in memory this time
    resumed.save = "";
    CHECK(maxRelativeDifference(run(resumed), uninterrupted) < 1e-6);
  }
}

TEST_CASE("A checkpoint resumes at another world size and in another strategy", "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  for (const std::string optimizer : {"adamw", "sgd"}) {
    INFO(optimizer);
    // Never resharded: ZeRO-3 at world 4 for 8 steps.
    const Ended reference =
        run(Job{.strategy = "zero3", .world = 4, .optimizer = optimizer, .to_step = 8});
    // 4 -> 2 -> 1 -> 4, changing strategy on the way, two steps each.
    const std::string at = dir.path() + "/" + optimizer;
    run(Job{
        .strategy = "zero3", .world = 4, .optimizer = optimizer, .to_step = 2, .save = at + "/a"});
    run(Job{.strategy = "zero2",
            .world = 2,
            .optimizer = optimizer,
            .from_step = 2,
            .to_step = 4,
            .load = at + "/a",
            .save = at + "/b"});
    run(Job{.strategy = "ddp",
            .world = 1,
            .optimizer = optimizer,
            .from_step = 4,
            .to_step = 6,
            .load = at + "/b",
            .save = at + "/c"});
    const Ended resharded = run(Job{.strategy = "fsdp_full_shard",
                                    .world = 4,
                                    .optimizer = optimizer,
                                    .from_step = 6,
                                    .to_step = 8,
                                    .load = at + "/c"});
    CHECK(maxRelativeDifference(resharded, reference) < 1e-5);
  }
}

namespace {

// Writes manifest `m` for checkpoint `dir` as a save writes it (with its checksum).
void writeManifest(const std::string& dir, const checkpoint::Manifest& m) {
  std::vector<std::pair<uint64_t, uint32_t>> files;
  for (const auto& f : m.files) files.push_back(f.second);
  std::ofstream(dir + "/manifest", std::ios::trunc)
      << checkpoint::manifestText(m.world, m.counters, files);
}

// A manifest's text as format 1 has it: the first line's number 1, no checksum line.
std::string asFormat1(std::string text) {
  REQUIRE(text.rfind("cxxlaunch-checkpoint-manifest 2\n", 0) == 0);
  text[text.find('\n') - 1] = '1';
  text.resize(text.rfind('\n', text.size() - 2) + 1);
  REQUIRE(text.substr(text.size() - 4) == "end\n");
  return text;
}

// What `body` printed on std::cerr (the runtime's notes).
std::string stderrOf(const std::function<void()>& body) {
  std::ostringstream captured;
  std::streambuf* previous = std::cerr.rdbuf(captured.rdbuf());
  try {
    body();
  } catch (...) {
    std::cerr.rdbuf(previous);
    throw;
  }
  std::cerr.rdbuf(previous);
  return captured.str();
}

}  // namespace

TEST_CASE("A folder of checkpoints loads its newest complete one", "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string root = dir.path() + "/checkpoints";
  run(Job{.strategy = "zero2", .to_step = 1, .save = root + "/checkpoint_1"});
  run(Job{.strategy = "zero2",
          .from_step = 1,
          .to_step = 2,
          .load = root + "/checkpoint_1",
          .save = root + "/checkpoint_2"});
  // Re-saving the same step: neither fails nor hangs, and leaves one complete checkpoint.
  run(Job{.strategy = "zero2",
          .from_step = 1,
          .to_step = 2,
          .load = root + "/checkpoint_1",
          .save = root + "/checkpoint_2"});
  CHECK(checkpoint::find(root) == root + "/checkpoint_2");

  // A save that died before its manifest: only a staging directory is left.
  run(Job{.strategy = "zero2",
          .from_step = 2,
          .to_step = 3,
          .load = root,
          .save = root + "/checkpoint_3"});
  fs::rename(root + "/checkpoint_3", root + "/checkpoint_3.tmp");
  fs::remove(root + "/checkpoint_3.tmp/manifest");
  CHECK(checkpoint::find(root) == root + "/checkpoint_2");

  // A newer one whose file was cut short, or has a flipped bit: skipped.
  fs::copy(root + "/checkpoint_2", root + "/checkpoint_9");
  auto nine = checkpoint::readManifest(root + "/checkpoint_9");
  REQUIRE(nine);
  nine->counters["optimizer_steps"] = "9";
  writeManifest(root + "/checkpoint_9", *nine);
  // (a manifest written anew, checksum and all, for step 9 with step 2's files: find() goes by
  // the sizes, so it is the newest; a load refuses its counters)
  CHECK(checkpoint::find(root) == root + "/checkpoint_9");
  const std::string victim = root + "/checkpoint_9/rank1.bin";
  const std::string intact = cxxlaunch::testing::readFile(victim);
  fs::resize_file(victim, intact.size() - 1);
  CHECK(checkpoint::find(root) == root + "/checkpoint_2");
  std::string flipped = intact;
  flipped[flipped.size() / 2] = static_cast<char>(flipped[flipped.size() / 2] ^ 0x10);
  std::ofstream(victim, std::ios::binary | std::ios::trunc) << flipped;
  CHECK(checkpoint::find(root) == root + "/checkpoint_2");  // same size, another CRC
  std::ofstream(victim, std::ios::binary | std::ios::trunc) << intact;
  CHECK(checkpoint::find(root) == root + "/checkpoint_9");

  // Between the two renames of a save: the old directory is complete, the new one is staged.
  fs::rename(root + "/checkpoint_2", root + "/checkpoint_2.old");
  CHECK(checkpoint::find(root + "/checkpoint_2") == root + "/checkpoint_2.old");

  CHECK_THROWS_WITH(checkpoint::find(dir.path() + "/nothing"),
                    Catch::Contains("no complete checkpoint at"));
}

TEST_CASE("A manifest whose counters are not numbers is refused before anything loads",
          "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string good = dir.path() + "/good";
  run(Job{.to_step = 2, .save = good});
  const std::string manifest = cxxlaunch::testing::readFile(good + "/manifest");
  // A copy of the checkpoint whose counter `key` says `value`.
  auto crafted = [&](const std::string& key, const std::string& value) {
    const std::string copy = dir.path() + "/" + key.substr(0, key.find(':')) + "-" + value;
    fs::copy(good, copy);
    std::string text = manifest;
    const auto at = text.find("counter " + key + " ");
    REQUIRE(at != std::string::npos);
    const auto from = at + key.size() + 9;
    text.replace(from, text.find('\n', from) - from, value);
    // As earlier builds wrote it (format 1: no checksum, no counters in the rank files): its
    // numbers are all that can be checked.
    std::ofstream(copy + "/manifest", std::ios::trunc) << asFormat1(text);
    return copy;
  };
  // The step orders checkpoints: a manifest without a whole one is malformed, never loaded.
  const std::string bad_step = crafted("optimizer_steps", "2x");
  CHECK_THROWS_WITH(checkpoint::find(bad_step), Catch::Contains("no complete checkpoint"));
  for (const auto& [key, value, says] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"micro_step", "lots", "not a whole number"},
           {"lr:0", "nan", "not a number"},
           {"lr_groups", "1e3", "not a whole number"}}) {
    INFO(key << " " << value);
    Job job{.from_step = 2, .to_step = 3, .load = crafted(key, value)};
    std::string message;
    try {
      run(job);
    } catch (const cxxlaunch::InvalidArgument& e) {
      message = e.what();
    }
    CHECK_THAT(message, Catch::Contains("'" + key + "' is '" + value + "', " + says));
  }
}

TEST_CASE("A damaged or edited newest manifest is skipped with a note naming it and why",
          "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string root = dir.path() + "/checkpoints", newest = root + "/checkpoint_2";
  const Ended one = run(Job{.to_step = 1, .save = root + "/checkpoint_1"});
  run(Job{.from_step = 1, .to_step = 2, .load = root, .save = newest});
  const std::string pristine = cxxlaunch::testing::readFile(newest + "/manifest");
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string text = pristine;
    const auto at = text.find(from);
    REQUIRE(at != std::string::npos);
    return text.replace(at, from.size(), to);
  };
  const std::string micro = pristine.substr(pristine.find("counter micro_step "));
  const std::string micro_line = micro.substr(0, micro.find('\n'));
  for (const auto& [what, text, why] : std::vector<std::array<std::string, 3>>{
           {"its first word", replaced("checkpoint-manifest", "checkpoint-manifesto"),
            "does not begin with 'cxxlaunch-checkpoint-manifest'"},
           {"world 3", replaced("world 2", "world 3"), "does not match its CRC-32C"},
           {"cut short", pristine.substr(0, pristine.size() / 2), "has no checksum line"},
           {"empty", "", "is empty"},
           {"optimizer_steps 2 -> 9",
            replaced("counter optimizer_steps 2", "counter optimizer_steps 9"),
            "does not match its CRC-32C"},
           {"micro_step + 1", replaced(micro_line, micro_line + "1"), "does not match its CRC-32C"},
           {"a counter renamed", replaced("counter optimizer_steps", "counter optimizer_stepz"),
            "does not match its CRC-32C"}}) {
    INFO(what);
    std::ofstream(newest + "/manifest", std::ios::trunc) << text;
    Ended resumed;
    const std::string notes =
        stderrOf([&] { resumed = run(Job{.from_step = 1, .to_step = 1, .load = root}); });
    CHECK(resumed.loaded == root + "/checkpoint_1");
    CHECK(maxRelativeDifference(resumed, one) == 0);
    CHECK_THAT(notes, Catch::Contains("cxxlaunch: note: checkpoint '" + newest + "' skipped: '" +
                                      newest + "/manifest' " + why));
  }
  // Format 1 (earlier builds: no checksum line) still loads.
  std::ofstream(newest + "/manifest", std::ios::trunc) << asFormat1(pristine);
  CHECK(run(Job{.from_step = 2, .to_step = 2, .load = root}).loaded == newest);
}

TEST_CASE("Counters that disagree with what the rank files recorded are refused", "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string root = dir.path() + "/checkpoints", newest = root + "/checkpoint_2";
  const Ended one = run(Job{.to_step = 1, .save = root + "/checkpoint_1"});
  run(Job{.from_step = 1, .to_step = 2, .load = root, .save = newest});
  const std::string pristine = cxxlaunch::testing::readFile(newest + "/manifest");
  // A manifest written anew, checksum and all, for step 9: rank 0's file recorded step 2.
  auto m = checkpoint::readManifest(newest);
  REQUIRE(m);
  m->counters["optimizer_steps"] = "9";
  writeManifest(newest, *m);
  CHECK_THROWS_WITH(checkpoint::Reader(newest),
                    Catch::Contains("its manifest's counter 'optimizer_steps' is '9' where '" +
                                    newest + "/rank0.bin' recorded '2'"));
  Ended resumed;
  std::string notes =
      stderrOf([&] { resumed = run(Job{.from_step = 1, .to_step = 1, .load = root}); });
  CHECK(resumed.loaded == root + "/checkpoint_1");
  CHECK(maxRelativeDifference(resumed, one) == 0);
  CHECK_THAT(notes, Catch::Contains("'optimizer_steps' is '9'"));

  // Rank 1's file from the step-1 save, listed with its own size and CRC-32C: rank 1 (which
  // checks its share of the files) refuses it, and every rank goes on to the previous checkpoint.
  std::ofstream(newest + "/manifest", std::ios::trunc) << pristine;
  fs::copy_file(root + "/checkpoint_1/rank1.bin", newest + "/rank1.bin",
                fs::copy_options::overwrite_existing);
  m = checkpoint::readManifest(newest);
  REQUIRE(m);
  m->files[1].second = checkpoint::fileSizeAndCrc(newest + "/rank1.bin");
  writeManifest(newest, *m);
  const checkpoint::Reader reader(newest);
  CHECK_NOTHROW(reader.checkCounters(0, 2));
  CHECK_THROWS_WITH(
      reader.checkCounters(1, 2),
      Catch::Contains("'optimizer_steps' is '2' where '" + newest + "/rank1.bin' recorded '1'"));
  notes = stderrOf([&] { resumed = run(Job{.from_step = 1, .to_step = 1, .load = root}); });
  CHECK(resumed.loaded == root + "/checkpoint_1");
  CHECK_THAT(notes, Catch::Contains("rank1.bin' recorded '1'"));
}

TEST_CASE("A load that reads a flipped bit goes on from the newest intact checkpoint",
          "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string root = dir.path() + "/checkpoints";
  // DDP's ranks share the reading (each reads its own file and broadcasts it): only rank 1 reads
  // the flipped bit, and rank 0 must go on from the older checkpoint with it.
  const std::array<std::array<std::string, 3>, 3> cases = {{{"zero3", "sharded", "rank0.bin"},
                                                            {"zero3", "full", "rank0.bin"},
                                                            {"ddp", "sharded", "rank1.bin"}}};
  for (const auto& [strategy, layout, file] : cases) {
    INFO(strategy << " " << layout << " " << file);
    fs::remove_all(root);
    const Ended one = run(
        Job{.strategy = strategy, .to_step = 1, .save = root + "/checkpoint_1", .layout = layout});
    run(Job{.strategy = strategy,
            .from_step = 1,
            .to_step = 2,
            .load = root,
            .save = root + "/checkpoint_2",
            .layout = layout});
    // The sizes still match: only the chunk checksums read during the load can tell.
    const std::string victim = root + "/checkpoint_2/" + file;
    std::string bytes = cxxlaunch::testing::readFile(victim);
    bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x01);
    std::ofstream(victim, std::ios::binary | std::ios::trunc) << bytes;
    const Ended resumed =
        run(Job{.strategy = strategy, .from_step = 1, .to_step = 1, .load = root});
    CHECK(resumed.loaded == root + "/checkpoint_1");
    CHECK(maxRelativeDifference(resumed, one) == 0);
  }
}

namespace {

// `path`'s bytes with `change` applied, written back in place (same size unless it changes it).
void edit(const std::string& path, const std::function<void(std::string&)>& change) {
  std::string bytes = cxxlaunch::testing::readFile(path);
  change(bytes);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// The token at `index` (0: "slice") of the first slice line of a rank file's header.
size_t firstSliceToken(const std::string& bytes, int index) {
  size_t at = bytes.find("\nslice ");
  REQUIRE(at != std::string::npos);
  ++at;
  for (int i = 0; i < index; ++i) at = bytes.find(' ', at) + 1;
  return at;
}

// Damage a checkpoint's rank file in ways its sizes do not show: each must be refused as a whole
// checkpoint, not stop the load.
const std::vector<std::pair<std::string, std::function<void(const std::string&)>>> kDamages = {
    {"its format", [](const std::string& file) { edit(file, [](auto& b) { b[21] = '4'; }); }},
    {"a parameter's name",
     [](const std::string& file) { edit(file, [](auto& b) { b[firstSliceToken(b, 1)] = 'Q'; }); }},
    {"a shape digit",
     [](const std::string& file) {
       edit(file, [](auto& b) {
         char& digit = b[firstSliceToken(b, 5)];
         digit = digit == '9' ? '1' : static_cast<char>(digit + 1);
       });
     }},
    {"its checksums' footer",
     [](const std::string& file) { edit(file, [](auto& b) { b[b.size() - 3] = 'x'; }); }},
    {"a symbolic link in its place",
     [](const std::string& file) {
       const std::string moved = file + ".real";
       fs::rename(file, moved);
       fs::create_symlink(moved, file);
     }},
};

}  // namespace

TEST_CASE(
    "A checkpoint no rank can read, whatever is wrong with it, sends every rank to the "
    "previous one",
    "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string root = dir.path() + "/checkpoints", pristine = dir.path() + "/pristine";
  // DDP's ranks share the reading (rank 1 reads rank1.bin); ZeRO-2's loads all-gather each unit
  // (a rank that fails must keep its place in them); ZeRO-3 reads its shards alone.
  for (const auto& [strategy, file] : std::vector<std::pair<std::string, std::string>>{
           {"ddp", "rank1.bin"}, {"zero2", "rank0.bin"}, {"zero3", "rank0.bin"}}) {
    fs::remove_all(root);
    fs::remove_all(pristine);
    const Ended one = run(Job{.strategy = strategy, .to_step = 1, .save = root + "/checkpoint_1"});
    run(Job{.strategy = strategy,
            .from_step = 1,
            .to_step = 2,
            .load = root,
            .save = root + "/checkpoint_2"});
    fs::copy(root + "/checkpoint_2", pristine);
    for (const auto& [what, damage] : kDamages) {
      INFO(strategy << ": " << file << ", " << what);
      fs::remove_all(root + "/checkpoint_2");
      fs::copy(pristine, root + "/checkpoint_2");
      damage(root + "/checkpoint_2/" + file);
      const Ended resumed =
          run(Job{.strategy = strategy, .from_step = 1, .to_step = 1, .load = root});
      CHECK(resumed.loaded == root + "/checkpoint_1");
      CHECK(maxRelativeDifference(resumed, one) == 0);
    }
  }
}

TEST_CASE("No loadable checkpoint where there were checkpoints is an error, never step 0",
          "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string root = dir.path() + "/checkpoints";
  CHECK_FALSE(checkpoint::holdsCheckpoints(root));  // no folder: a fresh start
  fs::create_directories(root + "/checkpoint_5.tmp");
  CHECK_FALSE(checkpoint::holdsCheckpoints(root));  // the first save died: a fresh start
  run(Job{.to_step = 1, .save = root + "/checkpoint_1"});
  run(Job{.from_step = 1, .to_step = 2, .load = root, .save = root + "/checkpoint_2"});
  CHECK(checkpoint::holdsCheckpoints(root));
  kDamages[0].second(root + "/checkpoint_1/rank0.bin");
  kDamages[1].second(root + "/checkpoint_2/rank1.bin");
  CHECK(checkpoint::holdsCheckpoints(root));
  CHECK_THROWS_WITH(run(Job{.from_step = 2, .to_step = 2, .load = root}),
                    Catch::Contains("no checkpoint at '" + root + "' can be loaded") &&
                        Catch::Contains("checkpoint_2: ") && Catch::Contains("checkpoint_1: ") &&
                        Catch::Contains("to start from step 0"));
  // Even without a manifest, a directory named as saveCheckpoint names them was a checkpoint.
  fs::remove(root + "/checkpoint_1/manifest");
  fs::remove_all(root + "/checkpoint_2");
  CHECK(checkpoint::holdsCheckpoints(root));
}

TEST_CASE("A checkpoint reached through a symbolic link is never loaded", "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string root = dir.path() + "/checkpoints", outside = dir.path() + "/outside";
  run(Job{.to_step = 1, .save = root + "/checkpoint_1"});
  run(Job{.from_step = 1, .to_step = 2, .load = root, .save = outside + "/checkpoint_2"});
  fs::create_directory_symlink(outside + "/checkpoint_2", root + "/checkpoint_99");
  CHECK(checkpoint::complete(root) == std::vector<std::string>{root + "/checkpoint_1"});
  CHECK(run(Job{.from_step = 1, .to_step = 1, .load = root}).loaded == root + "/checkpoint_1");
  checkpoint::removeOldest(root, 1);  // nor counted, nor removed
  CHECK(fs::is_symlink(root + "/checkpoint_99"));
  CHECK(fs::exists(outside + "/checkpoint_2/manifest"));
}

TEST_CASE("Rank files whose slices overlap are refused as corrupt", "[checkpoint]") {
  cxxlaunch::testing::TempDir dir;
  const std::string ckpt = dir.path() + "/checkpoint_1";
  fs::create_directories(ckpt);
  // Two files whose checksums are right, each claiming half of `w` (8 elements) twice over, so
  // that together they "cover" 8 elements while elements 4 to 7 are never read.
  auto writeRank = [&](int rank, int64_t begin) {
    const torch::Tensor values = torch::full({4}, static_cast<float>(rank + 1));
    const std::string path = ckpt + "/rank" + std::to_string(rank) + ".bin";
    checkpoint::writeShardFile(path, {{"w", {8}, begin, begin + 4, {{"param", values}}}}, {});
    return checkpoint::fileSizeAndCrc(path);
  };
  auto manifest = [&](int64_t second_begin) {
    const auto a = writeRank(0, 0), b = writeRank(1, second_begin);
    std::ofstream(ckpt + "/manifest", std::ios::trunc)
        << "cxxlaunch-checkpoint-manifest 1\nworld 2\ncounter optimizer_steps 1\n"
        << "file rank0.bin " << a.first << ' ' << a.second << "\nfile rank1.bin " << b.first << ' '
        << b.second << "\nend\n";
  };
  manifest(4);
  CHECK_NOTHROW(checkpoint::Reader(ckpt));
  manifest(0);
  CHECK_THROWS_WITH(checkpoint::Reader(ckpt),
                    Catch::Contains("is corrupt: its slices of 'w' (param) overlap"));
  manifest(2);
  CHECK_THROWS_WITH(checkpoint::Reader(ckpt), Catch::Contains("elements 0-4 and 2-6"));
}

TEST_CASE("Crafted rank files are refused, never read out of bounds", "[checkpoint]") {
  cxxlaunch::testing::TempDir dir;
  auto write = [&](const std::string& header, const std::string& data) {
    char first[64];
    std::snprintf(first, sizeof(first), "cxxlaunch-checkpoint 1 %020zu\n", header.size());
    const std::string path = dir.path() + "/rank0.bin";
    std::ofstream(path, std::ios::binary | std::ios::trunc) << first << header << data;
    return path;
  };
  using checkpoint::ShardFileReader;
  using cxxlaunch::InvalidArgument;
  CHECK_NOTHROW(ShardFileReader(write("slice w 0 2 1 2 1 param 0\n", std::string(8, '\0'))));
  CHECK_THROWS_AS(ShardFileReader(write("slice w 0 2 1 2 1 param 4\n", std::string(8, '\0'))),
                  InvalidArgument);  // array past the end
  CHECK_THROWS_AS(ShardFileReader(write("slice w 0 3 1 2 1 param 0\n", std::string(12, '\0'))),
                  InvalidArgument);  // range past the parameter
  CHECK_THROWS_AS(ShardFileReader(write("slice w 0 1 1 -2 1 param 0\n", std::string(4, '\0'))),
                  InvalidArgument);  // negative size
  CHECK_THROWS_AS(ShardFileReader(write("blob b 0 99\n", "x")), InvalidArgument);
  CHECK_THROWS_AS(ShardFileReader(write("slice w 0 2 1 2 1 param 18446744073709551612\n",
                                        std::string(8, '\0'))),
                  InvalidArgument);  // an offset that wraps around
  CHECK_THROWS_AS(ShardFileReader(write("delete everything\n", "")), InvalidArgument);
  { std::ofstream(dir.path() + "/rank0.bin", std::ios::trunc) << "cxxlaunch-checkpoint 1 99999"; }
  CHECK_THROWS_AS(ShardFileReader(dir.path() + "/rank0.bin"), InvalidArgument);
}

TEST_CASE(
    "Checksum chunks are the file's own: format 2's of 2^20 elements still read, bad ones refused",
    "[checkpoint]") {
  cxxlaunch::testing::TempDir dir;
  const std::string path = dir.path() + "/rank0.bin";
  // One slice "w" of `n` elements 0.5 * i, by hand as a writer of `format` would write it, with
  // `checksums` as its checksums' first line and the CRC-32C of each `chunk` elements.
  auto write = [&](int format, const std::string& checksums, int64_t chunk, int64_t n) {
    std::vector<float> values(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = 0.5f * static_cast<float>(i);
    const std::string header =
        "slice w 0 " + std::to_string(n) + " 1 " + std::to_string(n) + " 1 param 0\n";
    std::string sums = checksums + "\narray " + std::to_string((n + chunk - 1) / chunk);
    for (int64_t c = 0; c * chunk < n; ++c) {
      char crc[16];
      std::snprintf(crc, sizeof(crc), " %08x",
                    checkpoint::crc32c(0, values.data() + c * chunk,
                                       static_cast<size_t>(std::min(chunk, n - c * chunk)) * 4));
      sums += crc;
    }
    sums += "\n";
    char first[64], footer[64];
    std::snprintf(first, sizeof(first), "cxxlaunch-checkpoint %d %020zu\n", format, header.size());
    std::snprintf(footer, sizeof(footer), "cxxlaunch-checksums %020zu\n", values.size() * 4);
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        << first << header
        << std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4) << sums
        << footer;
    return values;
  };
  auto flip = [&](int64_t element) {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    const checkpoint::ShardFileReader reader(path);
    file.seekp(
        static_cast<std::streamoff>(reader.slices().at(0).arrays.at(0).second + element * 4));
    file.put('\x7f');
  };
  struct Case {
    int format;
    std::string checksums;
    int64_t chunk, n, flipped, chunk_begin, chunk_end;  // the chunk the flipped element is in
  };
  const int64_t M = int64_t{1} << 20;
  for (const Case& c : {Case{2, "checksums", M, M + 100, M + 5, M, M + 100},
                        Case{3, "checksums 1024", 1024, 3000, 2100, 2048, 3000},
                        Case{3, "checksums 262144", 262144, M + 7, 300000, 262144, 524288}}) {
    INFO(c.format << " " << c.checksums);
    const std::vector<float> values = write(c.format, c.checksums, c.chunk, c.n);
    std::vector<float> out(static_cast<size_t>(c.n));
    {
      const checkpoint::ShardFileReader reader(path);
      REQUIRE(reader.checksReads());
      reader.read(reader.slices().at(0).arrays.at(0).second, 0, 0, c.n, out.data());
      CHECK_FALSE(reader.corruption());
      CHECK(out == values);
    }
    flip(c.flipped);
    const checkpoint::ShardFileReader damaged(path);
    damaged.read(damaged.slices().at(0).arrays.at(0).second, 0, 0, c.n, out.data());
    CHECK(damaged.corruption().value_or("") ==
          "checkpoint file '" + path + "': 'w' param, elements " + std::to_string(c.chunk_begin) +
              " to " + std::to_string(c.chunk_end) + ", does not match its checksum");
  }
  using cxxlaunch::InvalidArgument;
  for (const auto& [format, line] :
       std::vector<std::pair<int, std::string>>{{3, "checksums"},
                                                {3, "checksums 0"},
                                                {3, "checksums 512"},
                                                {3, "checksums 33554432"},
                                                {3, "checksums x"},
                                                {3, "checksums 1024 7"},
                                                {2, "checksums 1024"},
                                                {4, "checksums 1024"}}) {
    INFO(format << " " << line);
    write(format, line, 1024, 3000);
    CHECK_THROWS_AS(checkpoint::ShardFileReader(path), InvalidArgument);
  }
}

TEST_CASE("Large arrays lie aligned in their file and read past the page cache into any memory",
          "[checkpoint]") {
  // More whole checksum chunks than one read takes and a tail that is no whole 4 KiB block,
  // after a small array (which leaves the big one's offset unaligned unless the writer pads).
  const int64_t n =
      (checkpoint::chunksPerRead(checkpoint::kChunkElements) + 1) * checkpoint::kChunkElements +
      1234;
  const torch::Tensor values = torch::arange(n, torch::kFloat) * 0.5;
  const std::vector<StateView> slices = {
      {"small", {3}, 0, 3, {{"param", torch::arange(3, torch::kFloat)}}},
      {"big", {n + 10}, 10, n + 10, {{"param", values}, {"exp_avg", -values}}}};
  float* memory = nullptr;
  REQUIRE(::posix_memalign(reinterpret_cast<void**>(&memory), 4096, (n + 4096) * 4) == 0);
  std::unique_ptr<float, decltype(&std::free)> owner(memory, &std::free);
  cxxlaunch::testing::TempDir disk;
  std::vector<std::string> folders = {disk.path()};  // O_DIRECT; tmpfs may refuse it
  if (fs::is_directory("/dev/shm")) folders.push_back("/dev/shm");
  for (const std::string& folder : folders) {
    INFO(folder);
    const std::string path = folder + "/cxxlaunch-rank0-" + std::to_string(::getpid()) + ".bin";
    checkpoint::writeShardFile(path, slices, {{"rng", "abc"}});
    const checkpoint::ShardFileReader reader(path);
    const auto& big = reader.slices().at(1);
    for (const auto& [array, offset] : big.arrays) CHECK(offset % 4096 == 0);
    // Element ranges and where they land: memory aligned as the file is, misaligned, and a range
    // from inside a chunk into memory aligned as that element is in the file.
    struct Case {
      int64_t from, to, at;  // elements of the parameter; the float in `memory` it starts at
    };
    const int64_t inside = 10 + 5000;
    for (const Case c :
         {Case{10, n + 10, 0}, Case{10, n + 10, 1}, Case{inside, n + 3, 5000 % 1024}}) {
      INFO("elements " << c.from << " to " << c.to << " at float " << c.at);
      std::fill(memory, memory + n + 4096, std::nanf(""));
      reader.read(big.arrays[0].second, 10, c.from, c.to, memory + c.at);
      const float* expected = values.data_ptr<float>() + (c.from - 10);
      CHECK(std::memcmp(memory + c.at, expected, static_cast<size_t>(c.to - c.from) * 4) == 0);
      CHECK(std::isnan(memory[c.at + (c.to - c.from)]));  // nothing written past the range
      if (c.at > 0) CHECK(std::isnan(memory[c.at - 1]));
    }
    CHECK_FALSE(reader.corruption());
    CHECK(reader.blob("rng") == "abc");
    if (cxxlaunch::testing::takesDirectIo(folder)) {
      // Written and read past the page cache: only the header, the checksums and the ends of
      // reads (less than a block each) went through it, of about 18000 pages.
      CHECK(cxxlaunch::testing::residentPages(path) < 16);
    }
    // A flipped bit in a chunk inside one read is found, and named by that chunk's elements.
    const int64_t chunk = 5, K = checkpoint::kChunkElements;
    {
      std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
      file.seekp(static_cast<std::streamoff>(big.arrays[0].second + (chunk * K + 7) * 4));
      file.put('\x7f');
    }
    const checkpoint::ShardFileReader damaged(path);
    damaged.read(big.arrays[0].second, 10, 10, n + 10, memory);
    CHECK(damaged.corruption().value_or("") ==
          "checkpoint file '" + path + "': 'big' param, elements " +
              std::to_string(10 + chunk * K) + " to " + std::to_string(10 + (chunk + 1) * K) +
              ", does not match its checksum");
    fs::remove(path);
  }
}

TEST_CASE("Loading a checkpoint of another model names the parameter", "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  run(Job{.strategy = "zero2", .to_step = 1, .save = dir.path() + "/c"});
  auto fake = makeFakeWorld(1);
  CHECK_THROWS_WITH(onRanks(1,
                            [&](int r) {
                              Tower other(12, 3);  // d 12 instead of 11
                              torch::optim::AdamW optimizer(other->parameters(),
                                                            torch::optim::AdamWOptions(0.01));
                              World world;
                              world.env.strategy = "zero2";
                              world.backend = makeFakeBackend(fake, r);
                              Accelerator acc(std::move(world), {});
                              acc.prepare(other.ptr(), optimizer);
                              acc.loadState(dir.path() + "/c");
                            }),
                    Catch::Contains("has another shape there than in this model"));
}

// The bytes this process has read so far through read(2) and its kin (/proc/self/io's rchar).
uint64_t bytesReadByThisProcess() {
  std::ifstream io("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (io >> key >> value) {
    if (key == "rchar:") return value;
  }
  return 0;
}

TEST_CASE("A fresh DDP job's load reads each byte once, into the state that prepare made",
          "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  for (const std::string strategy : {"ddp", "fsdp_no_shard"}) {
    INFO(strategy);
    const std::string saved = dir.path() + "/" + strategy;
    const Ended uninterrupted = run(Job{.strategy = strategy, .d = 256});
    run(Job{.strategy = strategy, .to_step = 2, .save = saved, .d = 256});
    uint64_t bytes = 0;
    for (const auto& f : fs::recursive_directory_iterator(saved)) {
      if (f.is_regular_file()) bytes += f.file_size();
    }
    // Both ranks are threads of this process: reading everything each, they would read 2x.
    const uint64_t before = bytesReadByThisProcess();
    const Ended resumed = run(Job{
        .strategy = strategy, .from_step = 2, .to_step = 4, .load = saved, .seed = 7, .d = 256});
    const uint64_t read = bytesReadByThisProcess() - before;
    INFO(read << " bytes read from a checkpoint of " << bytes);
    CHECK(read > bytes / 2);  // the counter counts
    CHECK(read < bytes + bytes / 4);
    // AdamW's moments, made in prepare (zeros), filled in place: no new memory for the load.
    CHECK(resumed.state_moved == 0);
    CHECK(resumed.state_kept > 0);
    // And every rank got all of it: the run ends where the uninterrupted one ends.
    CHECK(maxRelativeDifference(resumed, uninterrupted) == 0);
  }
}

TEST_CASE("Loading another model's checkpoint fails on every rank of a DDP job", "[checkpoint]") {
  // Every rank of a DDP job reads the whole checkpoint, so each finds the differing parameter and
  // says so; none waits for the others.
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  run(Job{.strategy = "ddp", .world = 2, .to_step = 1, .save = dir.path() + "/c"});
  auto fake = makeFakeWorld(2);
  std::array<std::string, 2> errors;
  onRanks(2, [&](int r) {
    Tower other(12, 3);  // d 12 instead of 11: every parameter differs
    torch::optim::AdamW optimizer(other->parameters(), torch::optim::AdamWOptions(0.01));
    World world;
    world.env.rank = r;
    world.env.world_size = 2;
    world.env.strategy = "ddp";
    world.backend = makeFakeBackend(fake, r);
    Accelerator acc(std::move(world), {});
    acc.prepare(other.ptr(), optimizer);
    try {
      acc.loadState(dir.path() + "/c");
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(r)] = e.what();
    }
  });
  for (const std::string& error : errors) {
    CHECK_THAT(error, Catch::Contains("has another shape there than in this model"));
  }
}

namespace {

// The model `job` ends with, exported by saveModel into `dir` (files of at most `max_bytes`).
Ended export_(Job job, const std::string& dir, uint64_t max_bytes) {
  auto fake = makeFakeWorld(job.world);
  Ended ended;
  onRanks(job.world, [&](int r) {
    torch::manual_seed(job.seed);
    Tower net(11, 3);
    torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(0.01));
    World world;
    world.env.rank = r;
    world.env.world_size = job.world;
    world.env.strategy = job.strategy;
    world.env.fsdp_transformer_layer_cls = {"Block"};
    world.backend = makeFakeBackend(fake, r);
    Accelerator acc(std::move(world), {});
    acc.prepare(net.ptr(), optimizer);
    if (!job.load.empty()) {
      acc.loadModel(job.load);
    } else {
      auto [x, y] = batchOf(0, 2 * job.world);
      acc.backward(torch::mse_loss(net->forward(x.narrow(0, 2 * r, 2)), y.narrow(0, 2 * r, 2)));
      acc.step();
      acc.saveModel(dir, max_bytes);
    }
    auto params = acc.fullParameters();
    if (r == 0) {
      for (auto& [name, tensor] : params) ended.params[name] = tensor;
    }
  });
  return ended;
}

}  // namespace

TEST_CASE("saveModel writes safetensors another reader reads, loadModel reads them back",
          "[checkpoint][safetensors]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string exported = dir.path() + "/model";
  // Files of at most 700 bytes: the model (616 bytes a block, 2.3 KB in all) spans several.
  const Ended saved = export_(Job{.strategy = "zero3", .world = 2}, exported, 700);
  REQUIRE(fs::exists(exported + "/model.safetensors.index.json"));
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(exported)) {
    files += entry.path().extension() == ".safetensors";
  }
  CHECK(files > 2);
  CHECK(fs::exists(exported + "/model-00001-of-" +
                   std::string(5 - std::to_string(files).size(), '0') + std::to_string(files) +
                   ".safetensors"));

  // Python's json and struct, not our code, read the files.
  const std::string raw = dir.path() + "/values.bin";
  const auto python =
      cxxlaunch::testing::run({"/usr/bin/python3", READ_SAFETENSORS_PY, exported, raw});
  INFO(python.out << python.err);
  REQUIRE(python.exit_code == 0);
  CHECK_THAT(python.out, Catch::Contains("block0.fc.weight F32 11x11"));
  std::string expected;
  for (const auto& [name, tensor] : saved.params) {  // std::map: name order, as the script
    expected.append(static_cast<const char*>(tensor.data_ptr()), tensor.nbytes());
  }
  CHECK(cxxlaunch::testing::readFile(raw) == expected);

  // Back into a fresh model (other weights), in another strategy and world size.
  const Ended loaded =
      export_(Job{.strategy = "ddp", .world = 1, .load = exported, .seed = 7}, "", 0);
  CHECK(maxRelativeDifference(loaded, saved) == 0);
  // One file when it fits.
  export_(Job{.strategy = "zero2", .world = 2}, dir.path() + "/one", 1u << 30);
  CHECK(fs::exists(dir.path() + "/one/model.safetensors"));
  CHECK(!fs::exists(dir.path() + "/one/model.safetensors.index.json"));
}

TEST_CASE("Corrupt and crafted safetensors files get one clear error",
          "[checkpoint][safetensors]") {
  using checkpoint::parseSafetensorsHeader;
  using cxxlaunch::InvalidArgument;
  const std::string ok = R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}})";
  CHECK(parseSafetensorsHeader(ok, 16).size() == 1);
  auto refused = [](const std::string& header, uint64_t data, const std::string& why) {
    INFO(header);
    CHECK_THROWS_WITH(parseSafetensorsHeader(header, data), Catch::Contains(why));
  };
  refused(ok, 15, "tensor 'w': its data ends at byte 16 but the file holds 15 bytes of data");
  refused("[1, 2]", 0, "not a JSON object");
  refused("{\"w\": ", 0, "not JSON");
  refused(R"({"w": {"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}})", 8, "unknown dtype");
  refused(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8,
          "do not match its dtype and shape");
  refused(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 8]}})", 8,
          "other than a size");
  refused(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 4294967296],
              "data_offsets": [0, 8]}})",
          8, "overflows");
  refused(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", 8,
          "tensor 'w': data_offsets end before they begin");
  refused(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
          16, "overlap");

  // Whole files: a header length beyond the file, a truncated file.
  cxxlaunch::testing::TempDir dir;
  const std::string path = dir.path() + "/bad.safetensors";
  std::ofstream(path, std::ios::binary)
      << std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) << "{}";
  CHECK_THROWS_WITH(checkpoint::readSafetensors(path, [](auto&&...) {}),
                    Catch::Contains("beyond the file"));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "abc";
  CHECK_THROWS_WITH(checkpoint::readSafetensors(path, [](auto&&...) {}),
                    Catch::Contains("shorter than its header length"));
}

namespace {

// The peak resident memory (KiB) `work` adds, run in a child process (so that nothing this test
// allocated before counts), or -1 if it threw there.
long peakGrowthKiB(const std::function<void()>& work) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(fds[0]);
    struct rusage before {
    }, after{};
    ::getrusage(RUSAGE_SELF, &before);
    long grown = -1;
    try {
      work();
      ::getrusage(RUSAGE_SELF, &after);
      grown = after.ru_maxrss - before.ru_maxrss;
    } catch (const std::exception&) {
    }
    [[maybe_unused]] const auto written = ::write(fds[1], &grown, sizeof(grown));
    ::_exit(0);
  }
  ::close(fds[1]);
  long grown = -2;
  [[maybe_unused]] const auto got = ::read(fds[0], &grown, sizeof(grown));
  ::close(fds[0]);
  ::waitpid(child, nullptr, 0);
  return grown;
}

}  // namespace

TEST_CASE("Hostile safetensors headers cost memory for what is kept, not for their size",
          "[checkpoint][safetensors]") {
  using checkpoint::parseSafetensorsHeader;
  using checkpoint::parseSafetensorsIndex;
  const size_t big = 95u << 20;
  // 95 MB of `[{},{},...]`: a DOM took 3.3 GB for it. Refused where the array opens.
  std::string array = "[";
  array.reserve(big + 8);
  while (array.size() < big) array += "{},";
  array.back() = ']';
  CHECK_THROWS_WITH(parseSafetensorsHeader(array, 0), Catch::Contains("not a JSON object"));
  // A valid header with 95 MB of __metadata__ (a DOM took 2.5 GB): loads, keeping one entry.
  std::string metadata = R"({"__metadata__": {)";
  metadata.reserve(big + 200);
  for (int i = 0; metadata.size() < big; ++i) metadata += "\"k" + std::to_string(i) + "\": \"v\",";
  metadata.back() = '}';
  metadata += R"(, "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}})";
  const long metadata_kib = peakGrowthKiB([&] {
    if (parseSafetensorsHeader(metadata, 16).size() != 1) throw std::runtime_error("lost w");
  });
  // Bounded by the text's size (nlohmann's lexer keeps the characters of a run of brackets), not
  // a multiple of it.
  CHECK(metadata_kib >= 0);
  CHECK(metadata_kib < static_cast<long>(metadata.size() / 1024));
  // A 60 MB index (a DOM took 1.7 GB): its weight_map kept, the rest skipped.
  std::string index = R"({"metadata": {"junk": [)";
  index.reserve((60u << 20) + 200);
  while (index.size() < (60u << 20)) index += "[[[{}]]],";
  index.back() = ']';
  index += R"(}, "weight_map": {"a": "one.safetensors", "b": "two.safetensors"}})";
  const long index_kib = peakGrowthKiB([&] {
    if (parseSafetensorsIndex(index).size() != 2) throw std::runtime_error("lost a file");
  });
  CHECK(index_kib >= 0);
  CHECK(index_kib < static_cast<long>(2 * index.size() / 1024));
  // What a header cannot hold stops the parse.
  auto refused = [](const std::string& header, const std::string& why) {
    INFO(header);
    CHECK_THROWS_WITH(parseSafetensorsHeader(header, 64), Catch::Contains(why));
  };
  refused(R"({"__metadata__": )" + std::string(40, '[') + std::string(40, ']') + "}",
          "nested deeper");
  std::string dims = R"({"w": {"dtype": "F32", "shape": [1)";
  for (int i = 0; i < 70; ++i) dims += ",1";
  refused(dims + R"(], "data_offsets": [0, 4]}})", "more than 64 dimensions");
  refused(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}})",
          "data_offsets is not [begin, end]");
  refused(R"({"w": {"dtype": "F32", "shape": [[1]], "data_offsets": [0, 4]}})",
          "other than a size");
  refused(R"({"w": {"dtype": 7, "shape": [1], "data_offsets": [0, 4]}})", "no dtype");
  refused(R"({"w": [1]})", "not an object");
  refused(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
              "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
          "appears twice");
  CHECK(parseSafetensorsHeader(R"({"__metadata__": {"format": "pt"}, "w": {"dtype": "F32",
            "shape": [1], "data_offsets": [0, 4], "extra": {"x": [1, {"y": null}]}}})",
                               4)
            .size() == 1);
  // A tensor of no elements at another's offset: accepted, before it or after it.
  const std::string full = R"("m": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
  const std::string empty = R"("e": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]})";
  CHECK(parseSafetensorsHeader("{" + full + ", " + empty + "}", 8).size() == 2);
  CHECK(parseSafetensorsHeader("{" + empty + ", " + full + "}", 8).size() == 2);
  CHECK_THROWS_WITH(parseSafetensorsIndex(R"({"weight_map": {"a": 3}})"),
                    Catch::Contains("tensor 'a' maps to no file name"));
  CHECK_THROWS_WITH(parseSafetensorsIndex(R"({"weight_map": {"a": "../x"}})"),
                    Catch::Contains("maps to no file name"));
  CHECK_THROWS_WITH(parseSafetensorsIndex(R"({"metadata": {}})"), Catch::Contains("no weight_map"));
  CHECK_THROWS_WITH(parseSafetensorsIndex("[1]"), Catch::Contains("not a JSON object"));
}

TEST_CASE("A FIFO in a model file's place is refused, never waited on",
          "[checkpoint][safetensors]") {
  cxxlaunch::testing::TempDir dir;
  for (const std::string name : {"model.safetensors", "model.safetensors.index.json"}) {
    INFO(name);
    const std::string folder = dir.path() + "/" + name + ".d";
    fs::create_directories(folder);
    REQUIRE(::mkfifo((folder + "/" + name).c_str(), 0600) == 0);
    CHECK_THROWS_WITH(checkpoint::readSafetensors(folder, [](auto&&...) {}),
                      Catch::Contains("not a regular file"));
  }
}

TEST_CASE("CRC-32C gives the standard check value, in one piece or many", "[checkpoint]") {
  const std::string text = "123456789";
  CHECK(checkpoint::crc32c(0, text.data(), text.size()) == 0xE3069283u);
  uint32_t crc = 0;
  for (char c : text) crc = checkpoint::crc32c(crc, &c, 1);
  CHECK(crc == 0xE3069283u);
}

TEST_CASE("CRC-32C over long buffers (three chains joined) equals the bit-by-bit definition",
          "[checkpoint]") {
  auto bitwise = [](const unsigned char* p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; ++i) {
      c ^= p[i];
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
  };
  std::mt19937 random(7);
  std::vector<unsigned char> data(1 << 20);
  for (auto& b : data) b = static_cast<unsigned char>(random());
  // Around one block of three 16 KiB stretches, several blocks, odd tails and offsets.
  for (size_t n : {size_t{0}, size_t{49151}, size_t{49152}, size_t{49153}, size_t{3 * 49152 + 13},
                   data.size() - 5}) {
    for (size_t offset : {size_t{0}, size_t{3}}) {
      if (offset + n > data.size()) continue;
      INFO("bytes " << n << " from " << offset);
      CHECK(checkpoint::crc32c(0, data.data() + offset, n) == bitwise(data.data() + offset, n));
    }
  }
  // Continuing from a CRC across a split inside a block.
  const uint32_t first = checkpoint::crc32c(0, data.data(), 100001);
  CHECK(checkpoint::crc32c(first, data.data() + 100001, 400000) == bitwise(data.data(), 500001));
}

TEST_CASE("CRC-32Cs of two pieces combine into the CRC-32C of both, and a file checks once",
          "[checkpoint]") {
  std::mt19937 random(11);
  std::vector<unsigned char> data(3 << 20);
  for (auto& b : data) b = static_cast<unsigned char>(random());
  for (size_t split : {size_t{0}, size_t{1}, size_t{4096}, size_t{1} << 20, data.size() - 7}) {
    for (size_t tail : {size_t{0}, size_t{1}, size_t{5}, size_t{196608}, data.size() - split}) {
      if (split + tail > data.size()) continue;
      INFO("first " << split << " bytes, then " << tail);
      const uint32_t a = checkpoint::crc32c(0, data.data(), split);
      const uint32_t b = checkpoint::crc32c(0, data.data() + split, tail);
      CHECK(checkpoint::crc32cCombine(a, b, tail) ==
            checkpoint::crc32c(0, data.data(), split + tail));
    }
  }
  // appendChecked: the bytes' own CRC, and the file's size and CRC as append() gives them (its
  // pieces: around 192 KiB and several of them), past the page cache or through it.
  cxxlaunch::testing::TempDir dir;
  checkpoint::DurableFile plain(dir.path() + "/plain"), checked(dir.path() + "/checked");
  plain.append(data.data(), 13);
  checked.append(data.data(), 13);
  size_t at = 13;
  for (size_t n : {size_t{0}, size_t{1} << 20, size_t{196608}, size_t{196609}, size_t{1000003}}) {
    plain.append(data.data() + at, n);
    CHECK(checked.appendChecked(data.data() + at, n) == checkpoint::crc32c(0, data.data() + at, n));
    at += n;
  }
  CHECK(checked.size() == plain.size());
  CHECK(checked.crc() == plain.crc());
  CHECK(checked.crc() == checkpoint::crc32c(0, data.data(), at));
  plain.commit();
  checked.commit();
  CHECK(checkpoint::fileSizeAndCrc(dir.path() + "/checked") ==
        std::make_pair(static_cast<uint64_t>(at), plain.crc()));
}

TEST_CASE("HostStaging: reads land straight in float32 host tensors, through a copy elsewhere",
          "[checkpoint]") {
  // The copy path is the one a GPU worker's loads take; here it runs for a tensor that is not
  // plain float32 host memory: a transposed view and a bf16 tensor. What no read touches keeps
  // its value (a shard's padding).
  checkpoint::HostStaging staging;
  torch::Tensor plain = torch::zeros({3});
  torch::Tensor base = torch::full({2, 3}, 7.0f);
  torch::Tensor transposed = base.t();  // 3 x 2, not contiguous
  torch::Tensor half = torch::full({4}, 5.0, torch::kBFloat16);
  float* p = staging.hostOf(plain);
  CHECK(p == plain.data_ptr<float>());
  float* t = staging.hostOf(transposed);
  float* h = staging.hostOf(half);
  CHECK(t != transposed.data_ptr<float>());
  for (int i = 0; i < 3; ++i) p[i] = static_cast<float>(i);
  t[0] = 1.5f;  // element (0, 0) of the transposed view; the others stay 7
  h[3] = 2.0f;
  CHECK(transposed[0][0].item<float>() == 7.0f);  // not before copyBack
  staging.copyBack();
  CHECK(plain[2].item<float>() == 2.0f);
  CHECK(base[0][0].item<float>() == 1.5f);
  CHECK(base[1][2].item<float>() == 7.0f);
  CHECK(half[3].item<float>() == 2.0f);
  CHECK(half[0].item<float>() == 5.0f);
}

TEST_CASE("acc.save writes on the main process only, atomically", "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  auto fake = makeFakeWorld(2);
  onRanks(2, [&](int r) {
    World world;
    world.env.rank = r;
    world.env.world_size = 2;
    world.backend = makeFakeBackend(fake, r);
    Accelerator acc(std::move(world), {});
    acc.save(dir.path() + "/metrics.json", "{\"rank\": " + std::to_string(r) + "}\n");
    acc.save(dir.path() + "/sample.safetensors", {{"x", torch::arange(6).reshape({2, 3})}});
  });
  CHECK(cxxlaunch::testing::readFile(dir.path() + "/metrics.json") == "{\"rank\": 0}\n");
  std::map<std::string, torch::Tensor> read;
  checkpoint::readSafetensors(
      dir.path() + "/sample.safetensors",
      [&](const std::string& name, const torch::Tensor& t) { read[name] = t; });
  REQUIRE(read.count("x") == 1);
  CHECK(torch::equal(read["x"], torch::arange(6).reshape({2, 3})));
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) files += entry.is_regular_file();
  CHECK(files == 2);  // no temporary left behind
}

namespace {

// Example i holds the number i.
struct Numbers : torch::data::datasets::Dataset<Numbers> {
  torch::data::Example<> get(size_t i) override {
    return {torch::full({1}, static_cast<float>(i)), torch::zeros({1})};
  }
  torch::optional<size_t> size() const override { return 21; }
};

// The numbers of each batch a rank draws, over `micro_steps` micro-steps (backward and step each)
// from `load` (a checkpoint, or none), saving at micro-step `save_at` into `save`.
std::vector<std::vector<std::vector<int>>> drawBatches(int micro_steps, const std::string& load,
                                                       int save_at, const std::string& save) {
  auto fake = makeFakeWorld(2);
  std::vector<std::vector<std::vector<int>>> drawn(2);
  onRanks(2, [&](int r) {
    torch::manual_seed(0);
    auto model = torch::nn::Linear(1, 1);
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
    World world;
    world.env.rank = r;
    world.env.world_size = 2;
    world.backend = makeFakeBackend(fake, r);
    Accelerator acc(std::move(world), {});
    acc.prepare(model.ptr(), optimizer);
    if (!load.empty()) acc.loadState(load);
    auto loader = acc.prepareDataLoader(Numbers().map(torch::data::transforms::Stack<>()), 4);
    RANK_REQUIRE(loader->batchesPerEpoch() == 3);  // 11 of the 21 (one twice) per rank
    RANK_REQUIRE(loader->paddingExamples() == 1);
    while (static_cast<int>(drawn[r].size()) < micro_steps) {
      for (auto& batch : *loader) {
        std::vector<int> numbers;
        for (int64_t i = 0; i < batch.data.size(0); ++i) {
          numbers.push_back(batch.data[i].item<int>());
        }
        drawn[r].push_back(numbers);
        acc.backward(model->forward(batch.data).sum());
        acc.step();
        if (static_cast<int>(drawn[r].size()) == save_at) acc.saveState(save);
        if (static_cast<int>(drawn[r].size()) == micro_steps) break;
      }
    }
  });
  return drawn;
}

}  // namespace

TEST_CASE("A prepared loader has another order each epoch, the same on every rank, and resumes",
          "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const auto whole = drawBatches(9, "", 4, dir.path() + "/at4");  // epochs 0, 1, 2
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::multiset<int> seen;  // both ranks' numbers: all 21, one of them twice
    std::vector<int> order;
    for (int r = 0; r < 2; ++r) {
      for (int b = 3 * epoch; b < 3 * epoch + 3; ++b) {
        for (int n : whole[r][b]) {
          seen.insert(n);
          if (r == 0) order.push_back(n);
        }
      }
    }
    CHECK(seen.size() == 22);
    CHECK(std::set<int>(seen.begin(), seen.end()).size() == 21);
    if (epoch > 0) {
      std::vector<int> before;
      for (int b = 3 * epoch - 3; b < 3 * epoch; ++b) {
        before.insert(before.end(), whole[0][b].begin(), whole[0][b].end());
      }
      CHECK(order != before);  // reshuffled
    }
  }
  // Saved after micro-step 4 (the second batch of epoch 1): a resumed run draws batches 5 to 9.
  const auto resumed = drawBatches(5, dir.path() + "/at4", -1, "");
  for (int r = 0; r < 2; ++r) {
    CHECK(resumed[r] == std::vector<std::vector<int>>(whole[r].begin() + 4, whole[r].end()));
  }
}

// ---- asynchronous saves (checkpoint/async_save.h) ----------------------------------------------

namespace {

// Every file of a checkpoint directory, by name.
std::map<std::string, std::string> filesOf(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    out[entry.path().filename().string()] = cxxlaunch::testing::readFile(entry.path().string());
  }
  return out;
}

// A rank of a world of two over `fake`, training the Tower with AdamW; `options` as given.
struct AsyncRank {
  Tower net;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<Accelerator> acc;
  int rank;

  AsyncRank(const std::shared_ptr<FakeWorld>& fake, int r, std::mutex& construction,
            AcceleratorOptions options)
      : net([&] {
          std::lock_guard<std::mutex> lock(construction);
          torch::manual_seed(42);
          return Tower(11, 3);
        }()),
        optimizer(makeOptimizer("adamw", net->parameters())),
        rank(r) {
    World world;
    world.env.rank = r;
    world.env.world_size = 2;
    world.env.strategy = "zero3";
    world.env.fsdp_transformer_layer_cls = {"Block"};
    world.env.fsdp_auto_wrap_policy = WrapPolicy::kTransformerBased;
    world.env.checkpoint_async = true;
    world.backend = makeFakeBackend(fake, r);
    acc = std::make_unique<Accelerator>(std::move(world), options);
    acc->prepare(net.ptr(), *optimizer);
  }
  void step() {
    auto [x, y] = batchOf(acc->optimizerSteps(), 8);
    acc->backward(
        torch::mse_loss(net->forward(x.narrow(0, rank * 4, 4)), y.narrow(0, rank * 4, 4)));
    acc->step();
  }
};

}  // namespace

TEST_CASE("Asynchronous saves write the synchronous saves' checkpoints byte for byte",
          "[checkpoint][async]") {
  // Saved at step 2 while training goes on to step 5 (the snapshot must not follow the training),
  // and at the end (committed by the Accelerator's end), in each layout: the files equal a
  // synchronous save's, and the training is not disturbed.
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  for (const std::string layout : {"sharded", "full"}) {
    for (const std::string strategy : {"ddp", "zero1", "zero3"}) {
      INFO(strategy << " " << layout);
      const std::string base = dir.path() + "/" + strategy + "-" + layout;
      auto job = [&](const std::string& mode) {
        Job j{.strategy = strategy, .layout = layout, .async = mode == "async"};
        j.to_step = 5;
        j.save_at = 2;
        j.save_at_dir = base + "/" + mode + "/step2";
        j.save = base + "/" + mode + "/step5";
        return run(j);
      };
      const Ended sync = job("sync"), async = job("async");
      CHECK(maxRelativeDifference(sync, async) == 0);
      for (const std::string step : {"step2", "step5"}) {
        const auto written = filesOf(base + "/async/" + step);
        CHECK(written.size() == 3);  // manifest, rank0.bin, rank1.bin
        CHECK(written == filesOf(base + "/sync/" + step));
        CHECK(!fs::exists(base + "/async/" + step + ".tmp"));
      }
    }
  }
}

TEST_CASE("An asynchronous save is committed by a later step, the next save, a load or the end",
          "[checkpoint][async]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string root = dir.path() + "/checkpoints";
  auto fake = makeFakeWorld(2);
  std::mutex construction;
  std::vector<std::vector<checkpoint::SaveReport>> reports(2);
  onRanks(2, [&](int r) {
    AcceleratorOptions options;
    options.checkpoint_dir = root;
    options.checkpoint_total_limit = 2;
    AsyncRank job(fake, r, construction, options);
    Accelerator& acc = *job.acc;
    for (int s = 1; s <= 6; ++s) {
      job.step();
      acc.saveCheckpoint();
      RANK_REQUIRE(acc.checkpointInFlight());
      // Pruning counts complete checkpoints: never more than the limit, never the newest.
      if (r == 0) {
        const auto complete = checkpoint::complete(root);
        RANK_REQUIRE(complete.size() <= 2);
        if (s > 1) RANK_REQUIRE(complete.front() == root + "/checkpoint_" + std::to_string(s - 1));
      }
      auto mine = acc.takeSaveReports();
      reports[static_cast<size_t>(r)].insert(reports[static_cast<size_t>(r)].end(), mine.begin(),
                                             mine.end());
    }
    // Steps commit the save in flight once every rank's write is over.
    for (int s = 0; s < 2000 && acc.checkpointInFlight(); ++s) {
      job.step();
      if (acc.checkpointInFlight()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    RANK_REQUIRE(!acc.checkpointInFlight());
    auto mine = acc.takeSaveReports();
    reports[static_cast<size_t>(r)].insert(reports[static_cast<size_t>(r)].end(), mine.begin(),
                                           mine.end());
    acc.waitForEveryone();
    if (r == 0) {
      const std::vector<std::string> newest = {root + "/checkpoint_6", root + "/checkpoint_5"};
      RANK_REQUIRE(checkpoint::complete(root) == newest);
    }
    acc.waitForEveryone();
    // A load waits for the save in flight: it is the newest.
    const int64_t steps = acc.optimizerSteps();
    acc.saveCheckpoint();
    RANK_REQUIRE(acc.loadState(root) == root + "/checkpoint_" + std::to_string(steps));
    // The end of the Accelerator commits the last one.
    job.step();
    acc.saveState(dir.path() + "/last");
  });
  CHECK(checkpoint::find(dir.path() + "/last") == dir.path() + "/last");
  for (const auto& mine : reports) {
    REQUIRE(mine.size() == 6);
    for (size_t i = 0; i < mine.size(); ++i) {
      CHECK(mine[i].dir == root + "/checkpoint_" + std::to_string(i + 1));
      CHECK(mine[i].bytes > 0);
      CHECK(mine[i].bytes == mine[0].bytes);  // every rank's files, the same checkpoint each time
      CHECK(mine[i].blocked_seconds <= mine[i].seconds);
    }
  }
}

// HF Trainer names its checkpoints checkpoint-<step> (finetune saves them so); accelerate names
// them checkpoint_<step>. Saving, pruning, finding and resuming treat both alike, mixed too.
TEST_CASE("Trainer's checkpoint-<step> names are saved, pruned and resumed as accelerate's",
          "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string root = dir.path() + "/out";
  // A folder whose only checkpoint is a directory of that name (its manifest never written by a
  // save that died between its renames) still holds one: resuming must not start at step 0.
  const std::string bare = dir.path() + "/bare";
  fs::create_directories(bare + "/checkpoint-7");
  CHECK(checkpoint::holdsCheckpoints(bare));
  std::vector<std::string> skipped;
  CHECK(checkpoint::complete(bare, true, &skipped).empty());
  REQUIRE(skipped.size() == 1);
  CHECK_THAT(skipped[0], Catch::Contains("checkpoint '" + bare + "/checkpoint-7' skipped"));

  auto fake = makeFakeWorld(2);
  std::mutex construction;
  onRanks(2, [&](int r) {
    AcceleratorOptions options;
    options.checkpoint_dir = root;
    options.checkpoint_total_limit = 2;
    options.checkpoint_async = false;
    options.checkpoint_prefix = "checkpoint-";
    AsyncRank job(fake, r, construction, options);
    Accelerator& acc = *job.acc;
    for (int s = 1; s <= 3; ++s) {
      job.step();
      RANK_REQUIRE(acc.saveCheckpoint() == root + "/checkpoint-" + std::to_string(s));
    }
    acc.waitForEveryone();
    if (r == 0) {
      const std::vector<std::string> newest = {root + "/checkpoint-3", root + "/checkpoint-2"};
      RANK_REQUIRE(checkpoint::complete(root) == newest);  // checkpoint-1 pruned
    }
    acc.waitForEveryone();
    job.step();
    RANK_REQUIRE(acc.resume() == root + "/checkpoint-3");
    RANK_REQUIRE(acc.optimizerSteps() == 3);
  });
  // accelerate's spelling in the same folder: the newest step wins whatever its name, and the
  // limit counts both.
  auto again = makeFakeWorld(2);
  onRanks(2, [&](int r) {
    AcceleratorOptions options;
    options.checkpoint_dir = root;
    options.checkpoint_total_limit = 2;
    options.checkpoint_async = false;
    AsyncRank job(again, r, construction, options);
    Accelerator& acc = *job.acc;
    RANK_REQUIRE(acc.resume() == root + "/checkpoint-3");
    job.step();
    RANK_REQUIRE(acc.saveCheckpoint() == root + "/checkpoint_4");
  });
  const std::vector<std::string> mixed = {root + "/checkpoint_4", root + "/checkpoint-3"};
  CHECK(checkpoint::complete(root) == mixed);
  CHECK_FALSE(fs::exists(root + "/checkpoint-2"));

  AcceleratorOptions wrong;
  wrong.checkpoint_prefix = "ckpt-";
  World world;
  world.backend = makeFakeBackend(makeFakeWorld(1), 0);
  CHECK_THROWS_WITH(Accelerator(std::move(world), wrong),
                    Catch::Contains("checkpoint_prefix 'ckpt-' is neither"));
}

TEST_CASE("A background write that fails is an error on every rank, naming the checkpoint",
          "[checkpoint][async]") {
  // The files may not grow past 1 KiB (RLIMIT_FSIZE, SIGXFSZ ignored: the write fails with
  // EFBIG) during the second save, whose snapshot writes no file: its rank files fail in the
  // background.
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string root = dir.path() + "/checkpoints";
  auto fake = makeFakeWorld(2);
  std::mutex construction;
  std::vector<std::string> errors(2);
  const auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit unlimited{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &unlimited) == 0);
  onRanks(2, [&](int r) {
    AsyncRank job(fake, r, construction, {});
    Accelerator& acc = *job.acc;
    job.step();
    acc.saveState(root + "/checkpoint_1");
    acc.waitForCheckpoint();
    job.step();
    acc.waitForEveryone();
    if (r == 0) {
      rlimit small = unlimited;
      small.rlim_cur = 1024;
      RANK_REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    }
    acc.waitForEveryone();
    acc.saveState(root + "/checkpoint_2");  // returns: the snapshot succeeded
    RANK_REQUIRE(acc.checkpointInFlight());
    try {
      for (int s = 0; s < 2000; ++s) {
        job.step();
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      acc.waitForCheckpoint();
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(r)] = e.what();
    }
    acc.waitForEveryone();
    if (r == 0) RANK_REQUIRE(::setrlimit(RLIMIT_FSIZE, &unlimited) == 0);
    acc.waitForEveryone();
    RANK_REQUIRE(!acc.checkpointInFlight());
    // Training goes on, and the next save succeeds.
    job.step();
    acc.saveState(root + "/checkpoint_3");
    acc.waitForCheckpoint();
  });
  std::signal(SIGXFSZ, previous_handler);
  for (const auto& error : errors) {
    CHECK_THAT(error, Catch::Contains("'" + root + "/checkpoint_2' in the background failed") &&
                          Catch::Contains("the previous checkpoint is untouched"));
  }
  // Each rank's own error names its file.
  CHECK_THAT(errors[0] + errors[1], Catch::Contains("rank0.bin") || Catch::Contains("rank1.bin"));
  CHECK(!fs::exists(root + "/checkpoint_2"));
  CHECK(checkpoint::complete(root) ==
        std::vector<std::string>{root + "/checkpoint_3", root + "/checkpoint_1"});
}
