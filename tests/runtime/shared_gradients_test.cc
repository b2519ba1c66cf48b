// ZeRO-2's full gradients in memory the ranks share (strategy/shared_gradients.h), over real Gloo
// backends (ranks as threads, each with its own mappings): the reduce-scatters read the lent
// buffers in place. Were the buffers no longer lent (a unit's gradient in ordinary memory, its
// reduction copied through the segment's slots again), the count of lends is zero and the test
// fails; with shared memory off the same training runs over TCP. Both end where one plain
// LibTorch process ends, training on both ranks' batches with torch::optim::AdamW.

#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <map>
#include <mutex>
#include <string>

#include "rendezvous/memory_store.h"
#include "runtime/comm/backend.h"
#include "runtime/strategy/sharded.h"
#include "support/ranks.h"
#include "tower.h"

using namespace cxxlaunch::runtime;
using cxxlaunch::runtime::testing::Tower;
using cxxlaunch::testing::onRanks;

namespace {

constexpr int kWorld = 2;
constexpr int64_t kBatch = 4, kSteps = 3;
constexpr double kLr = 1e-2;

struct Data {
  torch::Tensor x, y;  // step s, rank r: the kBatch examples at (s * kWorld + r) * kBatch
};

Data makeData() {
  auto gen = at::detail::createCPUGenerator(7);
  return {torch::randn({kSteps * kWorld * kBatch, 6}, gen),
          torch::randn({kSteps * kWorld * kBatch, 3}, gen)};
}

Tower makeTower() {
  torch::manual_seed(42);
  return Tower(11, 3);
}

std::map<std::string, torch::Tensor> parametersOf(const Tower& net) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : net->named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

// The reference: one process, each step on every rank's examples at once (the mean over them is
// the ranks' average of their means: equal batches).
std::map<std::string, torch::Tensor> trainOneProcess(const Data& data) {
  Tower net = makeTower();
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(kLr));
  for (int64_t s = 0; s < kSteps; ++s) {
    const int64_t at = s * kWorld * kBatch;
    optimizer.zero_grad();
    torch::mse_loss(net->forward(data.x.narrow(0, at, kWorld * kBatch)),
                    data.y.narrow(0, at, kWorld * kBatch))
        .backward();
    optimizer.step();
  }
  return parametersOf(net);
}

struct Trained {
  std::map<std::string, torch::Tensor> params;  // rank 0's, whole
  size_t lends[kWorld] = {0, 0};
  std::string description;
};

// ZeRO-2 on the same Tower over Gloo, each rank its own batch.
Trained trainZero2(const Data& data, bool shared_memory) {
  auto store = std::make_shared<cxxlaunch::rendezvous::MemoryStore>();
  Trained out;
  std::mutex construction;
  onRanks(kWorld, [&](int r) {
    torch::set_num_threads(1);
    Tower net = [&] {
      std::lock_guard<std::mutex> lock(construction);
      return makeTower();
    }();
    torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(kLr));
    BackendOptions backend;
    backend.rank = r;
    backend.world_size = kWorld;
    backend.store = store;
    backend.timeout = std::chrono::seconds(30);
    backend.shared_memory = shared_memory;
    ShardingOptions options;
    options.stage = 2;
    options.name = "zero2";
    options.bucket_bytes = 256;  // several units, two reductions in flight
    ShardedStrategy strategy(makeGlooBackend(backend), net.ptr(), optimizer, options);
    for (int64_t s = 0; s < kSteps; ++s) {
      const int64_t at = (s * kWorld + r) * kBatch;
      strategy.beforeBackward(true);
      torch::mse_loss(net->forward(data.x.narrow(0, at, kBatch)), data.y.narrow(0, at, kBatch))
          .backward();
      strategy.afterBackward(true);
      strategy.step();
      strategy.zeroGrad();
    }
    out.lends[r] = strategy.sharedGradientLends();
    auto params = strategy.fullParameters();
    if (r != 0) return;
    for (auto& [name, tensor] : params) out.params[name] = tensor;
    out.description = strategy.describe();
  });
  return out;
}

}  // namespace

TEST_CASE(
    "ZeRO-2 over Gloo on one host reduce-scatters from shared buffers, and ends as one "
    "process does",
    "[sharded][shm]") {
  torch::set_num_threads(1);
  const Data data = makeData();
  const std::map<std::string, torch::Tensor> reference = trainOneProcess(data);
  for (const bool shared_memory : {true, false}) {
    INFO("shared memory " << (shared_memory ? "on" : "off"));
    const Trained gloo = trainZero2(data, shared_memory);
    for (int r = 0; r < kWorld; ++r) {
      INFO("rank " << r);
      // Every unit's gradient, every step, on both ranks: kSteps steps of at least 2 units.
      if (shared_memory) CHECK(gloo.lends[r] >= 2 * kSteps);
      if (!shared_memory) CHECK(gloo.lends[r] == 0);
    }
    CHECK((gloo.description.find("full gradients in shared memory") != std::string::npos) ==
          shared_memory);
    REQUIRE(gloo.params.size() == reference.size());
    for (const auto& [name, value] : reference) {
      INFO(name);
      CHECK(torch::allclose(gloo.params.at(name), value, 0, 1e-5));
    }
  }
}
