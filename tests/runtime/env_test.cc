#include "runtime/env.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "common/env_names.h"
#include "common/error.h"

using namespace cxxlaunch;

namespace {
// Sets variables for one test and restores the environment afterwards.
struct ScopedEnv {
  explicit ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (auto [name, value] : vars) {
      names.push_back(name);
      ::setenv(name, value, 1);
    }
  }
  ~ScopedEnv() {
    for (auto* name : names) ::unsetenv(name);
  }
  std::vector<const char*> names;
};
}  // namespace

TEST_CASE("Without the launcher a program is a world of one", "[env]") {
  auto e = runtime::readWorkerEnv();
  REQUIRE(e.rank == 0);
  REQUIRE(e.world_size == 1);
  REQUIRE(e.local_world_size == 1);
  REQUIRE_FALSE(e.launched());
  REQUIRE_FALSE(e.device.has_value());
  REQUIRE(e.store_endpoint.empty());
  REQUIRE(e.shared_memory);
}

TEST_CASE("The launcher's contract is read into the struct", "[env]") {
  ScopedEnv vars({{env::kRank, "5"},
                  {env::kLocalRank, "1"},
                  {env::kWorldSize, "8"},
                  {env::kLocalWorldSize, "4"},
                  {env::kGroupRank, "1"},
                  {env::kGroupWorldSize, "2"},
                  {env::kRoleName, "trainer"},
                  {env::kMasterAddr, "10.0.0.1"},
                  {env::kMasterPort, "29500"},
                  {env::kRestartCount, "2"},
                  {env::kMaxRestarts, "3"},
                  {env::kRunId, "job"},
                  {env::kDevice, "3"},
                  {env::kStoreEndpoint, "127.0.0.1:4000"}});
  auto e = runtime::readWorkerEnv();
  REQUIRE(e.rank == 5);
  REQUIRE(e.local_rank == 1);
  REQUIRE(e.world_size == 8);
  REQUIRE(e.local_world_size == 4);
  REQUIRE(e.node_rank == 1);
  REQUIRE(e.num_nodes == 2);
  REQUIRE(e.role == "trainer");
  REQUIRE(e.master_addr == "10.0.0.1");
  REQUIRE(e.master_port == 29500);
  REQUIRE(e.restart_count == 2);
  REQUIRE(e.max_restarts == 3);
  REQUIRE(e.launched());
  REQUIRE(e.device == 3);
  REQUIRE(e.store_endpoint == "127.0.0.1:4000");
}

TEST_CASE("A malformed variable is named in the error", "[env]") {
  {
    ScopedEnv vars({{env::kWorldSize, "two"}});
    REQUIRE_THROWS_WITH(runtime::readWorkerEnv(), Catch::Contains("WORLD_SIZE='two'"));
  }
  {
    ScopedEnv vars({{env::kRank, "4"}, {env::kWorldSize, "4"}});
    REQUIRE_THROWS_AS(runtime::readWorkerEnv(), InvalidArgument);
  }
  {
    ScopedEnv vars({{env::kSharedMemory, "no"}});
    REQUIRE_THROWS_WITH(runtime::readWorkerEnv(),
                        Catch::Contains("CXXLAUNCH_SHARED_MEMORY='no' is not one of: on, off"));
  }
  {
    ScopedEnv vars({{env::kSharedMemory, "off"}});
    REQUIRE_FALSE(runtime::readWorkerEnv().shared_memory);
  }
}

TEST_CASE("The sharding settings are read, and malformed ones named", "[env]") {
  {
    ScopedEnv vars({{env::kStrategy, "fsdp_full_shard"},
                    {env::kFsdpAutoWrapPolicy, "TRANSFORMER_BASED_WRAP"},
                    {env::kFsdpTransformerLayerClsToWrap, "Block, Decoder ,"},
                    {env::kFsdpMinNumParams, "200000000000"},
                    {env::kFsdpBackwardPrefetch, "BACKWARD_POST"},
                    {env::kFsdpForwardPrefetch, "true"},
                    {env::kFsdpSyncModuleStates, "false"},
                    {env::kOffloadOptimizer, "cpu"}});
    const auto e = runtime::readWorkerEnv();
    CHECK(e.strategy == "fsdp_full_shard");
    CHECK(e.strategy == runtime::StrategyKind::kFsdpFullShard);
    CHECK(e.fsdp_auto_wrap_policy == runtime::WrapPolicy::kTransformerBased);
    CHECK(e.fsdp_transformer_layer_cls == std::vector<std::string>{"Block", "Decoder"});
    CHECK(e.fsdp_min_num_params == 200000000000LL);
    CHECK(e.fsdp_backward_prefetch == runtime::BackwardPrefetch::kPost);
    CHECK(e.fsdp_forward_prefetch);
    CHECK_FALSE(e.fsdp_sync_module_states);
    CHECK(e.offload_optimizer == runtime::OffloadDevice::kCpu);
    CHECK(e.offload_params == runtime::OffloadDevice::kNone);
    CHECK(e.offloads(runtime::OffloadDevice::kCpu));
    CHECK_FALSE(e.offloads(runtime::OffloadDevice::kNvme));
    CHECK(runtime::offloadDeviceName(e.offload_optimizer) == "cpu");
    CHECK(runtime::offloadDeviceName(runtime::OffloadDevice::kNvme) == "nvme");
  }
  {
    ScopedEnv vars({{env::kStrategy, "zero4"}});
    CHECK_THROWS_WITH(runtime::readWorkerEnv(),
                      Catch::Contains("CXXLAUNCH_STRATEGY='zero4' is not one of: ddp, zero1"));
  }
  {
    ScopedEnv vars({{env::kOffloadParams, "disk"}});
    CHECK_THROWS_WITH(
        runtime::readWorkerEnv(),
        Catch::Contains("CXXLAUNCH_OFFLOAD_PARAMS='disk' is not one of: none, cpu, nvme"));
  }
  {
    ScopedEnv vars({{env::kFsdpForwardPrefetch, "yes"}});
    CHECK_THROWS_WITH(
        runtime::readWorkerEnv(),
        Catch::Contains("CXXLAUNCH_FSDP_FORWARD_PREFETCH='yes' is not true or false"));
  }
  {
    ScopedEnv vars({{env::kFsdpBackwardPrefetch, "PRE"}});
    CHECK_THROWS_WITH(runtime::readWorkerEnv(), Catch::Contains("BACKWARD_PRE, BACKWARD_POST"));
  }
}

TEST_CASE("A strategy is parsed once into what it shards, and reads as its name", "[env]") {
  using runtime::StrategyKind;
  using runtime::StrategySetting;
  const std::vector<std::tuple<std::string, StrategyKind, int, bool>> all = {
      {"ddp", StrategyKind::kDdp, 0, false},
      {"fsdp_no_shard", StrategyKind::kFsdpNoShard, 0, false},
      {"zero1", StrategyKind::kZero1, 1, false},
      {"zero2", StrategyKind::kZero2, 2, false},
      {"fsdp_shard_grad_op", StrategyKind::kFsdpShardGradOp, 2, false},
      {"fsdp_hybrid_shard_zero2", StrategyKind::kFsdpHybridShardZero2, 2, true},
      {"zero3", StrategyKind::kZero3, 3, false},
      {"fsdp_full_shard", StrategyKind::kFsdpFullShard, 3, false},
      {"fsdp_hybrid_shard", StrategyKind::kFsdpHybridShard, 3, true},
  };
  for (const auto& [name, kind, stage, hybrid] : all) {
    INFO(name);
    const StrategySetting parsed = name;
    CHECK(parsed == kind);
    CHECK(parsed.stage() == stage);
    CHECK(parsed.hybrid() == hybrid);
    CHECK(parsed.name() == name);
    CHECK(parsed == name);
    CHECK(parsed == StrategySetting(kind));
    std::ostringstream printed;
    printed << parsed;
    CHECK(printed.str() == name);
    CHECK(static_cast<std::string>(parsed) == name);
  }
  CHECK(StrategySetting() == "ddp");
  CHECK_FALSE(StrategySetting("zero2") == "zero3");
  CHECK_THROWS_WITH(StrategySetting("ZeRO3"),
                    Catch::Contains("strategy 'ZeRO3' is not one of: ddp"));
}

TEST_CASE("The trackers and the project folder are read, and an unknown tracker is refused",
          "[env]") {
  {
    ScopedEnv vars({{env::kLogWith, "csv, TensorBoard"}, {env::kProjectDir, "/tmp/runs"}});
    const auto e = runtime::readWorkerEnv();
    REQUIRE(e.log_with == std::vector<std::string>{"csv", "tensorboard"});
    REQUIRE(e.project_dir == "/tmp/runs");
  }
  ScopedEnv bad({{env::kLogWith, "csv,wandb"}});
  REQUIRE_THROWS_WITH(runtime::readWorkerEnv(),
                      Catch::Contains("CXXLAUNCH_LOG_WITH: unknown tracker 'wandb'") &&
                          Catch::Contains("tensorboard, csv and jsonl"));
}
