// ZeRO-2's full gradients in memory the ranks share (strategy/shared_gradients.h), over real Gloo
// backends (ranks as threads, each with its own mappings): the reduce-scatters read the lent
// buffers in place. Were the buffers no longer lent (a unit's gradient in ordinary memory, its
// reduction copied through the segment's slots again), the count of lends is zero and the test
// fails; with shared memory off the same training runs over TCP, and both end where the Fake
// backend's exact collectives end.

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

struct Trained {
  std::map<std::string, torch::Tensor> params;  // rank 0's, whole
  size_t lends[2] = {0, 0};
  std::string description;
};

// ZeRO-2 on a Tower over `backend_of(rank)`, 3 steps of AdamW, each rank its own batch.
template <typename MakeBackend>
Trained trainZero2(MakeBackend backend_of) {
  constexpr int kWorld = 2;
  constexpr int64_t kBatch = 4, kSteps = 3;
  auto gen = at::detail::createCPUGenerator(7);
  const auto x = torch::randn({kSteps * kWorld * kBatch, 6}, gen);
  const auto y = torch::randn({kSteps * kWorld * kBatch, 3}, gen);
  Trained out;
  std::mutex construction;
  onRanks(kWorld, [&](int r) {
    torch::set_num_threads(1);
    Tower net = [&] {
      std::lock_guard<std::mutex> lock(construction);
      torch::manual_seed(42);
      return Tower(11, 3);
    }();
    torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-2));
    ShardingOptions options;
    options.stage = 2;
    options.name = "zero2";
    options.bucket_bytes = 256;  // several units, two reductions in flight
    ShardedStrategy strategy(backend_of(r), net.ptr(), optimizer, options);
    for (int64_t s = 0; s < kSteps; ++s) {
      const int64_t at = (s * kWorld + r) * kBatch;
      strategy.beforeBackward(true);
      torch::mse_loss(net->forward(x.narrow(0, at, kBatch)), y.narrow(0, at, kBatch)).backward();
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
    "ZeRO-2 over Gloo on one host reduce-scatters from shared buffers, and ends as exact "
    "collectives do",
    "[sharded][shm]") {
  auto fake = makeFakeWorld(2);
  const Trained exact = trainZero2([&](int r) { return makeFakeBackend(fake, r); });
  for (const bool shared_memory : {true, false}) {
    INFO("shared memory " << (shared_memory ? "on" : "off"));
    auto store = std::make_shared<cxxlaunch::rendezvous::MemoryStore>();
    const Trained gloo = trainZero2([&](int r) -> std::shared_ptr<Backend> {
      BackendOptions options;
      options.rank = r;
      options.world_size = 2;
      options.store = store;
      options.timeout = std::chrono::seconds(30);
      options.shared_memory = shared_memory;
      return makeGlooBackend(options);
    });
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r);
      // Every unit's gradient, every step, on both ranks: 3 steps of at least 2 units.
      if (shared_memory) CHECK(gloo.lends[r] >= 6);
      if (!shared_memory) CHECK(gloo.lends[r] == 0);
    }
    CHECK((gloo.description.find("full gradients in shared memory") != std::string::npos) ==
          shared_memory);
    REQUIRE(gloo.params.size() == exact.params.size());
    for (const auto& [name, value] : exact.params) {
      INFO(name);
      CHECK(torch::allclose(gloo.params.at(name), value, 0, 1e-6));
    }
  }
}
