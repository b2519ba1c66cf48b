#pragma once
// The checkpoint tests' shared job (checkpoint_*_test.cc): a small model trained by ranks that
// are threads over the Fake backend, saved and resumed as a Job says, and what it Ended with.

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
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/checkpoint/state_load.h"
#include "runtime/optim/param_state_key.h"
#include "runtime/strategy/strategy.h"
#include "runtime/world.h"
#include "support/page_cache.h"
#include "support/ranks.h"
#include "support/subprocess.h"
#include "tensorfile/files.h"
#include "tower.h"

namespace cxxlaunch::runtime::checkpoint_test {

using cxxlaunch::runtime::testing::Tower;
using cxxlaunch::testing::onRanks;
namespace fs = std::filesystem;

// A job's layout as the launcher spells it (CXXLAUNCH_STATE_DICT_TYPE).
inline StateDictType stateDictType(const std::string& layout) {
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

inline std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const std::string& kind,
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
inline std::pair<torch::Tensor, torch::Tensor> batchOf(int64_t step, int64_t batch) {
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
inline std::vector<const void*> stateMemory(torch::optim::Optimizer& optimizer) {
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

inline Ended run(const Job& job) {
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

inline double maxRelativeDifference(const Ended& a, const Ended& b) {
  REQUIRE(a.params.size() == b.params.size());
  double worst = 0;
  for (const auto& [name, ta] : a.params) {
    const auto& tb = b.params.at(name);
    worst = std::max(worst, (ta - tb).abs().max().item<double>() /
                                std::max(tb.abs().max().item<double>(), 1e-12));
  }
  return worst;
}

inline bool sameBytes(const std::string& a, const std::string& b) {
  return cxxlaunch::testing::readFile(a) == cxxlaunch::testing::readFile(b);
}

}  // namespace cxxlaunch::runtime::checkpoint_test
