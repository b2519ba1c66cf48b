// The sharded strategies in real processes: the example trainer under `cxxlaunch run`, over Gloo
// (shared memory, and TCP alone), chosen by the launch's settings and a config file only. Every
// mode must end with the parameters DDP ends with (the trainer dumps them gathered, in name
// order, as float32).

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>

#include "support/subprocess.h"

using namespace cxxlaunch::testing;
using namespace std::chrono_literals;
using Args = std::vector<std::string>;
using Env = std::map<std::string, std::string>;

namespace {

struct Trained {
  Finished finished;
  std::vector<float> params;
};

Trained train(const TempDir& dir, int nproc, const Args& trainer_args, const Env& env,
              const Args& launch_flags = {}) {
  static int runs = 0;
  const std::string dump = dir.path() + "/params" + std::to_string(runs++) + ".bin";
  Args argv = {CXXLAUNCH_BIN, "run", "--nproc_per_node", std::to_string(nproc)};
  argv.insert(argv.end(), launch_flags.begin(), launch_flags.end());
  argv.push_back(TRAIN_BIN);
  argv.insert(argv.end(), trainer_args.begin(), trainer_args.end());
  argv.insert(argv.end(), {"--dump_params", dump});
  Trained t{run(argv, env, 240s), {}};
  const std::string bytes = readFile(dump);
  t.params.resize(bytes.size() / sizeof(float));
  // A run that failed wrote no parameters: nothing to copy (and memcpy takes no null pointer,
  // not even for 0 bytes).
  if (!t.params.empty()) {
    std::memcpy(t.params.data(), bytes.data(), t.params.size() * sizeof(float));
  }
  return t;
}

// Two launchers on loopback, two workers each: two simulated nodes forming one world of 4.
Trained trainOnTwoNodes(const TempDir& dir, const Args& trainer_args, const Env& env) {
  static int runs = 0;
  const std::string id = "nodes" + std::to_string(runs++);
  const std::string dump = dir.path() + "/" + id + ".bin";
  // Node 0 is told to host (is_host=1): a port someone else took between freePort() and its
  // bind fails it at once ("cannot listen"), and a fresh port is tried, instead of both nodes
  // knocking at a stranger's server until the join timeout.
  Trained t;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const std::string endpoint = "127.0.0.1:" + std::to_string(freePort());
    std::vector<std::unique_ptr<Subprocess>> nodes;
    for (int n = 0; n < 2; ++n) {
      Args argv = {CXXLAUNCH_BIN,
                   "run",
                   "--rdzv_endpoint",
                   endpoint,
                   "--rdzv_id",
                   id,
                   "--rdzv_conf",
                   "keep_alive_interval=0.3,keep_alive_max_misses=7,join_timeout=60,is_host=" +
                       std::to_string(n == 0 ? 1 : 0),
                   "--nnodes",
                   "2",
                   "--nproc_per_node",
                   "2",
                   TRAIN_BIN};
      argv.insert(argv.end(), trainer_args.begin(), trainer_args.end());
      argv.insert(argv.end(), {"--dump_params", dump});
      nodes.push_back(std::make_unique<Subprocess>(argv, env));
    }
    t = Trained{};
    bool port_taken = false;
    for (auto& node : nodes) {
      auto finished = node->wait(240s);
      REQUIRE(finished);
      if (&node == &nodes.front() && finished->exit_code != 0 &&
          finished->err.find("cannot listen") != std::string::npos) {
        port_taken = true;  // the other node is stopped when `nodes` goes
        break;
      }
      t.finished.out += finished->out;
      t.finished.err += finished->err;
      t.finished.exit_code = std::max(t.finished.exit_code, finished->exit_code);
    }
    if (!port_taken) break;
  }
  const std::string bytes = readFile(dump);
  t.params.resize(bytes.size() / sizeof(float));
  // A run that failed wrote no parameters: nothing to copy (and memcpy takes no null pointer,
  // not even for 0 bytes).
  if (!t.params.empty()) {
    std::memcpy(t.params.data(), bytes.data(), t.params.size() * sizeof(float));
  }
  return t;
}

// max |a - b| / max |b|: one relative tolerance for the whole model.
double relativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  REQUIRE(!a.empty());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::abs(b[i])));
  }
  return diff / scale;
}

const Args kGpt = {"--model",   "gpt", "--steps",  "6", "--batch_size", "4", "--seq_len",     "16",
                   "--d_model", "32",  "--layers", "3", "--heads",      "2", "--print_every", "3"};

}  // namespace

TEST_CASE("Every strategy ends where DDP ends, in real processes", "[sharding][integration]") {
  TempDir dir;
  for (int nproc : {2, 4}) {
    for (const Args& optimizer : {Args{"--optimizer", "adamw"}, Args{"--optimizer", "sgd"}}) {
      Args args = kGpt;
      args.insert(args.end(), optimizer.begin(), optimizer.end());
      // Accumulation and clipping on: the sharded paths of both are exercised.
      const Env settings = {{"CXXLAUNCH_GRADIENT_ACCUMULATION_STEPS", "2"},
                            {"CXXLAUNCH_GRADIENT_CLIPPING", "0.5"}};
      Env ddp_env = settings;
      ddp_env["CXXLAUNCH_STRATEGY"] = "ddp";
      const Trained ddp = train(dir, nproc, args, ddp_env);
      INFO(ddp.finished.out << ddp.finished.err);
      REQUIRE(ddp.finished.exit_code == 0);
      const std::vector<std::string> strategies =
          nproc == 2 ? std::vector<std::string>{"zero1",
                                                "zero2",
                                                "zero3",
                                                "fsdp_full_shard",
                                                "fsdp_shard_grad_op",
                                                "fsdp_no_shard"}
                     : std::vector<std::string>{"zero1", "zero2", "zero3"};
      for (const auto& strategy : strategies) {
        Env env = settings;
        env["CXXLAUNCH_STRATEGY"] = strategy;
        const Trained sharded = train(dir, nproc, args, env);
        INFO(strategy << " on " << nproc << " processes, " << optimizer[1] << "\n"
                      << sharded.finished.out << sharded.finished.err);
        REQUIRE(sharded.finished.exit_code == 0);
        CHECK_THAT(sharded.finished.out, Catch::Contains(strategy + ": "));
        CHECK(relativeDifference(sharded.params, ddp.params) < 1e-5);
      }
    }
  }
}

TEST_CASE("ZeRO-3 over TCP alone, and FULL_SHARD from an accelerate config file",
          "[sharding][integration]") {
  TempDir dir;
  const Trained ddp = train(dir, 2, kGpt, {{"CXXLAUNCH_STRATEGY", "ddp"}});
  REQUIRE(ddp.finished.exit_code == 0);

  const Trained tcp =
      train(dir, 2, kGpt, {{"CXXLAUNCH_STRATEGY", "zero3"}, {"CXXLAUNCH_SHARED_MEMORY", "off"}});
  INFO(tcp.finished.out << tcp.finished.err);
  REQUIRE(tcp.finished.exit_code == 0);
  CHECK(relativeDifference(tcp.params, ddp.params) < 1e-5);

  const std::string config = dir.path() + "/fsdp.yaml";
  std::ofstream(config) << "compute_environment: LOCAL_MACHINE\n"
                           "distributed_type: FSDP\n"
                           "use_cpu: true\n"
                           "num_machines: 1\n"
                           "num_processes: 2\n"
                           "fsdp_config:\n"
                           "  fsdp_sharding_strategy: FULL_SHARD\n"
                           "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                           "  fsdp_transformer_layer_cls_to_wrap: Block\n"
                           "  fsdp_backward_prefetch: BACKWARD_PRE\n"
                           "  fsdp_sync_module_states: true\n";
  const Trained fsdp = train(dir, 2, kGpt, {}, {"--config_file", config});
  INFO(fsdp.finished.out << fsdp.finished.err);
  REQUIRE(fsdp.finished.exit_code == 0);
  CHECK_THAT(fsdp.finished.out, Catch::Contains("fsdp_full_shard: 4 unit(s) (3 module(s)"));
  CHECK(relativeDifference(fsdp.params, ddp.params) < 1e-5);

  // A unit name that matches nothing: one clear line naming the model's module types, exit 2.
  const Trained bad = train(dir, 2, kGpt,
                            {{"CXXLAUNCH_STRATEGY", "fsdp_full_shard"},
                             {"CXXLAUNCH_FSDP_AUTO_WRAP_POLICY", "TRANSFORMER_BASED_WRAP"},
                             {"CXXLAUNCH_FSDP_TRANSFORMER_LAYER_CLS_TO_WRAP", "Blocks"}});
  CHECK(bad.finished.exit_code == 2);
  CHECK_THAT(bad.finished.err, Catch::Contains("'Blocks', which is no module type of this model") &&
                                   Catch::Contains("BlockImpl, EmbeddingImpl, GptImpl"));
}

TEST_CASE("bf16 from an accelerate config: ZeRO-3 and FULL_SHARD agree with DDP in bf16",
          "[sharding][integration][bf16]") {
  TempDir dir;
  const Trained fp32 = train(dir, 2, kGpt, {{"CXXLAUNCH_STRATEGY", "ddp"}});
  REQUIRE(fp32.finished.exit_code == 0);
  const Trained ddp =
      train(dir, 2, kGpt, {{"CXXLAUNCH_STRATEGY", "ddp"}}, {"--mixed_precision", "bf16"});
  INFO(ddp.finished.out << ddp.finished.err);
  REQUIRE(ddp.finished.exit_code == 0);
  CHECK_THAT(ddp.finished.out, Catch::Contains("compute in BFloat16"));

  const std::string config = dir.path() + "/zero3_bf16.yaml";
  std::ofstream(config) << "compute_environment: LOCAL_MACHINE\n"
                           "distributed_type: DEEPSPEED\n"
                           "use_cpu: true\n"
                           "mixed_precision: bf16\n"
                           "num_machines: 1\n"
                           "num_processes: 2\n"
                           "deepspeed_config:\n"
                           "  zero_stage: 3\n";
  const Trained zero3 = train(dir, 2, kGpt, {}, {"--config_file", config});
  INFO(zero3.finished.out << zero3.finished.err);
  REQUIRE(zero3.finished.exit_code == 0);
  CHECK_THAT(zero3.finished.out,
             Catch::Contains("zero3: ") && Catch::Contains("compute in BFloat16"));
  const Trained fsdp = train(dir, 2, kGpt, {{"CXXLAUNCH_STRATEGY", "fsdp_full_shard"}},
                             {"--mixed_precision", "bf16"});
  REQUIRE(fsdp.finished.exit_code == 0);
  // The same bf16 arithmetic in every mode; visibly not fp32's.
  CHECK(relativeDifference(zero3.params, ddp.params) < 1e-2);
  CHECK(relativeDifference(fsdp.params, ddp.params) < 1e-2);
  CHECK(relativeDifference(ddp.params, fp32.params) > 1e-4);
}

TEST_CASE("HYBRID_SHARD on two simulated nodes ends where DDP ends", "[sharding][integration]") {
  TempDir dir;
  const Env settings = {{"CXXLAUNCH_GRADIENT_ACCUMULATION_STEPS", "2"},
                        {"CXXLAUNCH_GRADIENT_CLIPPING", "0.5"},
                        {"CXXLAUNCH_FSDP_TRANSFORMER_LAYER_CLS_TO_WRAP", "Block"}};
  Env ddp_env = settings;
  ddp_env["CXXLAUNCH_STRATEGY"] = "ddp";
  const Trained ddp = trainOnTwoNodes(dir, kGpt, ddp_env);
  INFO(ddp.finished.out << ddp.finished.err);
  REQUIRE(ddp.finished.exit_code == 0);
  for (const std::string strategy : {"fsdp_hybrid_shard", "fsdp_hybrid_shard_zero2"}) {
    Env env = settings;
    env["CXXLAUNCH_STRATEGY"] = strategy;
    const Trained hybrid = trainOnTwoNodes(dir, kGpt, env);
    INFO(strategy << "\n" << hybrid.finished.out << hybrid.finished.err);
    REQUIRE(hybrid.finished.exit_code == 0);
    CHECK_THAT(hybrid.finished.out, Catch::Contains("on 1/2 shards x 2 node replicas"));
    CHECK(relativeDifference(hybrid.params, ddp.params) < 1e-5);
  }
}

TEST_CASE("nvme offload from an accelerate config, and a disk too small for it",
          "[sharding][integration][nvme]") {
  TempDir dir;
  const Trained ddp = train(dir, 2, kGpt, {{"CXXLAUNCH_STRATEGY", "ddp"}});
  REQUIRE(ddp.finished.exit_code == 0);
  const std::string swap = dir.path() + "/swap";
  std::filesystem::create_directory(swap);
  const std::string config = dir.path() + "/zero3_nvme.yaml";
  std::ofstream(config) << "compute_environment: LOCAL_MACHINE\n"
                           "distributed_type: DEEPSPEED\n"
                           "use_cpu: true\n"
                           "num_machines: 1\n"
                           "num_processes: 2\n"
                           "deepspeed_config:\n"
                           "  zero_stage: 3\n"
                           "  offload_optimizer_device: nvme\n"
                           "  offload_optimizer_nvme_path: "
                        << swap
                        << "\n"
                           "  offload_param_device: nvme\n"
                           "  offload_param_nvme_path: "
                        << swap << "\n";
  const Trained nvme = train(dir, 2, kGpt, {}, {"--config_file", config});
  INFO(nvme.finished.out << nvme.finished.err);
  REQUIRE(nvme.finished.exit_code == 0);
  CHECK_THAT(nvme.finished.out, Catch::Contains("offloaded to nvme"));
  CHECK(relativeDifference(nvme.params, ddp.params) < 1e-5);
  CHECK(std::filesystem::is_empty(swap));  // the swap files had no name

  // A real filesystem too small for the state (a 16 KiB tmpfs in a private mount namespace):
  // the workers stop before training with the sizes, exit 2.
  std::string command = "mount -t tmpfs -o size=16k tmpfs '" + swap + "' && exec " + CXXLAUNCH_BIN +
                        " run --nproc_per_node 2 --config_file '" + config + "' " + TRAIN_BIN;
  for (const auto& arg : kGpt) command += " " + arg;
  const Finished full = run({"/usr/bin/unshare", "-m", "/bin/sh", "-c", command}, {}, 120s);
  INFO(full.out << full.err);
  CHECK(full.exit_code == 2);
  CHECK_THAT(full.err, Catch::Contains("offload_param_nvme_path '" + swap + "' cannot hold") &&
                           Catch::Contains("needed") && Catch::Contains("free"));
  CHECK_THAT(full.out, !Catch::Contains("step "));
}

namespace {

// "total 354.2 KiB" / "MiB" in the trainer's last line, in bytes.
double reportedTotal(const std::string& out) {
  std::smatch m;
  REQUIRE(std::regex_search(out, m, std::regex("total ([0-9.]+) (KiB|MiB)")));
  return std::stod(m[1]) * (m[2] == "KiB" ? 1024.0 : 1048576.0);
}

// The row `cxxlaunch estimate-memory` prints for `dtype` and `strategy`, in bytes.
double estimated(const std::string& table, const std::string& dtype, const std::string& strategy) {
  std::smatch m;
  const std::regex row(dtype + " +" + strategy + " +([0-9.]+) ");
  REQUIRE(std::regex_search(table, m, row));
  const double unit = table.find("in MB") != std::string::npos ? 1e6 : 1e9;
  return std::stod(m[1]) * unit;
}

}  // namespace

TEST_CASE("cxxlaunch estimate-memory agrees with the trainer's memoryReport in every mode",
          "[sharding][integration][estimate]") {
  TempDir dir;
  const Args model = {"--model",      "gpt", "--steps",   "2",  "--warmup",      "0",
                      "--batch_size", "2",   "--seq_len", "16", "--d_model",     "128",
                      "--layers",     "4",   "--heads",   "4",  "--print_every", "2"};
  const Trained probe = train(dir, 2, model, {{"CXXLAUNCH_STRATEGY", "ddp"}});
  std::smatch m;
  REQUIRE(
      std::regex_search(probe.finished.out, m, std::regex("training gpt \\(([0-9]+) parameters")));
  const Finished table = run({CXXLAUNCH_BIN, "estimate-memory", "--params", m[1], "--num_processes",
                              "2", "--dtypes", "fp32,bf16"});
  REQUIRE(table.exit_code == 0);
  for (const std::string precision : {"fp32", "bf16"}) {
    for (const std::string strategy : {"ddp", "zero1", "zero2", "zero3"}) {
      const Trained t = train(dir, 2, model, {{"CXXLAUNCH_STRATEGY", strategy}},
                              {"--mixed_precision", precision == "fp32" ? "no" : "bf16"});
      INFO(precision << " " << strategy << "\n" << t.finished.out << t.finished.err << table.out);
      REQUIRE(t.finished.exit_code == 0);
      const double ratio =
          reportedTotal(t.finished.out) / estimated(table.out, precision, strategy);
      CHECK(std::abs(ratio - 1) < 0.05);
    }
  }
}

TEST_CASE(
    "World 4 over TCP: prefetch, activation checkpointing and nvme offload end where DDP ends",
    "[sharding][integration]") {
  TempDir dir;
  const Env common = {{"CXXLAUNCH_SHARED_MEMORY", "off"},
                      {"CXXLAUNCH_GRADIENT_ACCUMULATION_STEPS", "2"},
                      {"CXXLAUNCH_GRADIENT_CLIPPING", "0.5"}};
  Env ddp_env = common;
  ddp_env["CXXLAUNCH_STRATEGY"] = "ddp";
  const Trained ddp = train(dir, 4, kGpt, ddp_env);
  REQUIRE(ddp.finished.exit_code == 0);
  const std::string swap = dir.path() + "/swap";
  std::filesystem::create_directory(swap);
  const std::vector<Env> variants = {
      {{"CXXLAUNCH_STRATEGY", "fsdp_full_shard"},
       {"CXXLAUNCH_FSDP_BACKWARD_PREFETCH", "BACKWARD_POST"},
       {"CXXLAUNCH_FSDP_FORWARD_PREFETCH", "true"}},
      {{"CXXLAUNCH_STRATEGY", "fsdp_full_shard"},
       {"CXXLAUNCH_FSDP_BACKWARD_PREFETCH", "NO_PREFETCH"},
       {"CXXLAUNCH_FSDP_ACTIVATION_CHECKPOINTING", "true"}},
      {{"CXXLAUNCH_STRATEGY", "zero3"},
       {"CXXLAUNCH_OFFLOAD_OPTIMIZER", "nvme"},
       {"CXXLAUNCH_OFFLOAD_OPTIMIZER_NVME_PATH", swap},
       {"CXXLAUNCH_OFFLOAD_PARAMS", "nvme"},
       {"CXXLAUNCH_OFFLOAD_PARAM_NVME_PATH", swap}},
      {{"CXXLAUNCH_STRATEGY", "zero2"},
       {"CXXLAUNCH_OFFLOAD_OPTIMIZER", "nvme"},
       {"CXXLAUNCH_OFFLOAD_OPTIMIZER_NVME_PATH", swap}},
  };
  for (Env env : variants) {
    env.insert(common.begin(), common.end());
    const Trained t = train(dir, 4, kGpt, env);
    INFO(env.at("CXXLAUNCH_STRATEGY") << "\n" << t.finished.out << t.finished.err);
    REQUIRE(t.finished.exit_code == 0);
    CHECK_THAT(t.finished.out, Catch::Contains("on 1/4 shards"));
    CHECK(relativeDifference(t.params, ddp.params) < 1e-5);
  }
}
