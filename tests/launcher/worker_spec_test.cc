#include "launcher/worker_spec.h"

#include <catch2/catch.hpp>
#include <map>

#include "common/env_names.h"

using namespace cxxlaunch::launcher;
namespace env = cxxlaunch::env;

namespace {

std::map<std::string, std::string> asMap(const std::vector<std::string>& entries) {
  std::map<std::string, std::string> out;
  for (const auto& e : entries) {
    const auto eq = e.find('=');
    // The first definition is the one getenv finds: a second one would be a bug.
    REQUIRE(out.emplace(e.substr(0, eq), e.substr(eq + 1)).second);
  }
  return out;
}

LaunchOptions twoWorkers() {
  LaunchOptions options;
  options.nproc_per_node = 2;
  options.max_restarts = 3;
  options.run_id = "job-7";
  options.role = "trainer";
  options.program = "/bin/echo";
  return options;
}

WorldAssignment secondNodeOfTwo() {
  WorldAssignment world;
  world.node_rank = 1;
  world.num_nodes = 2;
  world.rank_offset = 2;
  world.world_size = 4;
  world.restart_count = 1;
  world.master_addr = "10.0.0.1";
  world.master_port = 29500;
  world.store_endpoint = "10.0.0.1:29400";
  world.store_prefix = "job-7/3";
  return world;
}

Worker localRank(int local_rank, const WorldAssignment& world) {
  Worker w;
  w.local_rank = local_rank;
  w.global_rank = world.rank_offset + local_rank;
  w.error_file = "/logs/attempt_1/" + std::to_string(local_rank) + "/error.json";
  w.heartbeat_file = "/logs/attempt_1/" + std::to_string(local_rank) + "/heartbeat";
  return w;
}

}  // namespace

TEST_CASE("A worker gets torchrun's contract for its place in the world", "[worker_spec]") {
  const LaunchOptions options = twoWorkers();
  const WorldAssignment world = secondNodeOfTwo();
  const WorkerSpec spec(options, {"PATH=/usr/bin", "HOME=/root"});
  const auto e = asMap(spec.environment(localRank(1, world), world));
  CHECK(e.at(env::kRank) == "3");
  CHECK(e.at(env::kLocalRank) == "1");
  CHECK(e.at(env::kWorldSize) == "4");
  CHECK(e.at(env::kLocalWorldSize) == "2");
  CHECK(e.at(env::kGroupRank) == "1");
  CHECK(e.at(env::kGroupWorldSize) == "2");
  CHECK(e.at(env::kRoleName) == "trainer");
  CHECK(e.at(env::kRoleRank) == "3");
  CHECK(e.at(env::kRoleWorldSize) == "4");
  CHECK(e.at(env::kMasterAddr) == "10.0.0.1");
  CHECK(e.at(env::kMasterPort) == "29500");
  CHECK(e.at(env::kRestartCount) == "1");
  CHECK(e.at(env::kMaxRestarts) == "3");
  CHECK(e.at(env::kRunId) == "job-7");
  CHECK(e.at(env::kErrorFile) == "/logs/attempt_1/1/error.json");
  CHECK(e.at(env::kHeartbeatFile) == "/logs/attempt_1/1/heartbeat");
  CHECK(e.at(env::kStoreEndpoint) == "10.0.0.1:29400");
  CHECK(e.at(env::kStorePrefix) == "job-7/3");
  CHECK(e.at("PATH") == "/usr/bin");
  CHECK(e.at("HOME") == "/root");
  // No credentials given, none set; no --gpus, no device.
  CHECK(e.count(env::kToken) == 0);
  CHECK(e.count(env::kTlsCa) == 0);
  CHECK(e.count(env::kDevice) == 0);
}

TEST_CASE("The contract's variables are the launcher's: inherited ones are replaced",
          "[worker_spec]") {
  const LaunchOptions options = twoWorkers();
  const WorldAssignment world = secondNodeOfTwo();
  // A launcher started by a worker of another job inherits that worker's contract.
  const WorkerSpec spec(options, {"RANK=9", "WORLD_SIZE=99", "TORCHELASTIC_RUN_ID=outer",
                                  "CXXLAUNCH_TOKEN=outer-secret", "KEEP=me"});
  const auto e = asMap(spec.environment(localRank(0, world), world));
  CHECK(e.at(env::kRank) == "2");
  CHECK(e.at(env::kWorldSize) == "4");
  CHECK(e.at(env::kRunId) == "job-7");
  CHECK(e.count(env::kToken) == 0);
  CHECK(e.at("KEEP") == "me");
}

TEST_CASE("The config's worker settings win over the inherited environment", "[worker_spec]") {
  LaunchOptions options = twoWorkers();
  options.worker_env = {{env::kStrategy, "zero2"}, {env::kMixedPrecision, "bf16"}};
  const WorldAssignment world = secondNodeOfTwo();
  const WorkerSpec spec(options, {std::string(env::kStrategy) + "=ddp"});
  const auto e = asMap(spec.environment(localRank(0, world), world));
  CHECK(e.at(env::kStrategy) == "zero2");
  CHECK(e.at(env::kMixedPrecision) == "bf16");
}

TEST_CASE("OMP_NUM_THREADS is 1 with several workers unless the user set it", "[worker_spec]") {
  LaunchOptions options = twoWorkers();
  const WorldAssignment world = secondNodeOfTwo();
  const Worker w = localRank(0, world);
  CHECK(asMap(WorkerSpec(options, {}).environment(w, world)).at(env::kOmpNumThreads) == "1");
  CHECK(asMap(WorkerSpec(options, {"OMP_NUM_THREADS=6"}).environment(w, world))
            .at(env::kOmpNumThreads) == "6");
  options.nproc_per_node = 1;
  CHECK(asMap(WorkerSpec(options, {}).environment(w, world)).count(env::kOmpNumThreads) == 0);
}

TEST_CASE("The store's credentials and the device follow the world and --gpus", "[worker_spec]") {
  LaunchOptions options = twoWorkers();
  options.gpus = {4, 6};
  WorldAssignment world = secondNodeOfTwo();
  world.token = "secret";
  world.store_user = "job";
  world.tls_ca = "/ca.pem";
  world.tls_cert = "/cert.pem";
  world.tls_key = "/key.pem";
  const WorkerSpec spec(options, {});
  const auto e = asMap(spec.environment(localRank(1, world), world));
  CHECK(e.at(env::kToken) == "secret");
  CHECK(e.at(env::kStoreUser) == "job");
  CHECK(e.at(env::kTlsCa) == "/ca.pem");
  CHECK(e.at(env::kTlsCert) == "/cert.pem");
  CHECK(e.at(env::kTlsKey) == "/key.pem");
  CHECK(e.at(env::kDevice) == "1");  // its local rank among the visible devices

  world.store_endpoint.clear();  // no store: none of its settings
  const auto without = asMap(spec.environment(localRank(1, world), world));
  CHECK(without.count(env::kStorePrefix) == 0);
  CHECK(without.count(env::kToken) == 0);
}

TEST_CASE("Arguments pass verbatim but for ${local_rank}", "[worker_spec]") {
  LaunchOptions options = twoWorkers();
  options.args = {"--out=run_${local_rank}.txt", "${local_rank}${local_rank}", "$local_rank",
                  "a b"};
  const WorldAssignment world = secondNodeOfTwo();
  const SpawnSpec spawn = WorkerSpec(options, {}).of(localRank(1, world), world);
  CHECK(spawn.program == "/bin/echo");
  CHECK(spawn.argv ==
        std::vector<std::string>{"/bin/echo", "--out=run_1.txt", "11", "$local_rank", "a b"});
  CHECK(substituteLocalRank("${local_rank", 3) == "${local_rank");
}
