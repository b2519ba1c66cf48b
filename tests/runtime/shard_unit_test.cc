// ShardUnit's lifecycle on its own: gathered around its forward and its backward over real
// collectives (the Fake backend, ranks as threads), at rest as the ShardingPolicy says. The
// strategies that drive it are checked end to end in sharded_test.cc.

#include "runtime/strategy/shard_unit.h"

#include <torch/torch.h>

#include <catch2/catch.hpp>

#include "runtime/strategy/shard_store.h"
#include "support/ranks.h"

using namespace cxxlaunch::runtime;
using cxxlaunch::testing::onRanks;

TEST_CASE("A ShardUnit is gathered around its forward and backward and rests as its policy says",
          "[sharded]") {
  auto fake = makeFakeWorld(2);
  onRanks(2, [&](int r) {
    torch::NoGradGuard no_grad;
    std::shared_ptr<Backend> backend = makeFakeBackend(fake, r);
    const auto a = torch::arange(5, torch::kFloat), b = torch::full({2}, 7.0f);
    torch::Tensor weights = torch::zeros({1});
    torch::optim::SGD sgd({weights}, torch::optim::SGDOptions(0.1));
    ShardOptimizer optimizer(sgd);
    MemoryStore store(optimizer, torch::kFloat, /*free_gradients_between_steps=*/false);
    for (const bool reshard : {true, false}) {  // ZeRO-3, then ZeRO-2's parameters
      INFO((reshard ? "reshard after forward" : "whole at rest"));
      const UnitContext c{.every = backend.get(),
                          .shards = backend.get(),
                          .store = &store,
                          .policy = {.shard_optimizer = true,
                                     .shard_gradients = true,
                                     .reshard_after_forward = reshard,
                                     .own_master = true}};
      ShardUnit unit("u", nullptr);
      unit.flat() = FlatParameter({a.clone(), b.clone()}, {"a", "b"}, 2, r);
      unit.setMaster(unit.flat().shard().clone());
      CHECK(unit.state() == ShardUnit::State::kUnsharded);
      CHECK_FALSE(unit.rest(c));  // not routed yet: a trainer that never calls unitForward
      CHECK(unit.state() == ShardUnit::State::kUnsharded);

      unit.preForward(c);
      CHECK(unit.trainingState() == ShardUnit::TrainingState::kForward);
      CHECK(unit.postForward(c) == reshard);
      CHECK(unit.routed());
      CHECK(unit.trainingState() == ShardUnit::TrainingState::kIdle);
      CHECK(unit.flat().resident() != reshard);
      unit.prefetch(c);  // the backward's prefetch
      CHECK(unit.state() ==
            (reshard ? ShardUnit::State::kGathering : ShardUnit::State::kUnsharded));
      unit.preBackward(c);
      CHECK(unit.state() == ShardUnit::State::kUnsharded);
      CHECK(unit.trainingState() == ShardUnit::TrainingState::kPreBackward);
      CHECK(torch::equal(unit.flat().params()[0], a));  // gathered from every rank's master
      CHECK(torch::equal(unit.flat().params()[1], b));
      CHECK(unit.postBackward(c) == reshard);
      CHECK(unit.trainingState() == ShardUnit::TrainingState::kPostBackward);
      CHECK(unit.rest(c) == reshard);  // the end of backward: nothing more to free
      CHECK(unit.trainingState() == ShardUnit::TrainingState::kIdle);
      CHECK(unit.state() == (reshard ? ShardUnit::State::kSharded : ShardUnit::State::kUnsharded));
    }
  });
}
