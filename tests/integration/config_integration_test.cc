// The config commands end to end: the real `cxxlaunch` binary, the wizard driven through a real
// pseudo-terminal and through a pipe, files it writes launched for real.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "launcher/config.h"
#include "support/pty.h"
#include "support/subprocess.h"

using namespace cxxlaunch::testing;
using namespace std::chrono_literals;
using Args = std::vector<std::string>;
using Env = std::map<std::string, std::string>;
namespace fs = std::filesystem;

namespace {

// The worker environment each rank printed (`/usr/bin/env` under cxxlaunch run), by rank; in a
// multi-node job the console prefix also names the node.
std::map<std::string, std::string> envOf(const std::string& text, int rank, int node = -1) {
  const std::string prefix =
      "[rank " + (node >= 0 ? std::to_string(node) + ":" : "") + std::to_string(rank) + "]: ";
  std::map<std::string, std::string> vars;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with(prefix)) continue;
    line = line.substr(prefix.size());
    const auto eq = line.find('=');
    if (eq != std::string::npos) vars[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return vars;
}

std::string write(const TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// A private cache folder, so that no default config file of this machine takes part.
Env isolated(const TempDir& dir, Env env = {}) {
  env["XDG_CACHE_HOME"] = dir.path() + "/cache";
  return env;
}

}  // namespace

TEST_CASE(
    "The wizard on a terminal: arrow-key menus, a wrong answer asked again, and the file "
    "it writes loads and launches",
    "[wizard]") {
  TempDir dir;
  const std::string file = dir.path() + "/wizard.yaml";
  {
    Pty pty({CXXLAUNCH_BIN, "config", "--config_file", file}, isolated(dir));
    REQUIRE(pty.expect("Which type of machine are you using? (arrows to move, enter to choose)"));
    REQUIRE(pty.expect(" > No distributed training"));
    pty.send("\x1b[B");  // down: multi-CPU
    REQUIRE(pty.expect(" > multi-CPU"));
    pty.send("\r");
    REQUIRE(pty.expect("-> multi-CPU"));
    REQUIRE(
        pty.expect("How many different machines will you use (more than 1 for multi-node "
                   "training)? [1]: "));
    pty.send("two\n");
    REQUIRE(pty.expect("  'two' is not a whole number from 1 to 65536; try again."));
    REQUIRE(pty.expect("How many different machines"));
    pty.send("1\n");
    REQUIRE(pty.expect("Should distributed operations be checked while running for errors?"));
    REQUIRE(pty.expect("[yes/NO]: "));
    pty.send("\n");
    REQUIRE(pty.expect("Do you want to use DeepSpeed? [yes/NO]: "));
    pty.send("\n");
    REQUIRE(pty.expect("Do you want to use FullyShardedDataParallel? [yes/NO]: "));
    pty.send("\n");
    REQUIRE(pty.expect("How many processes should be used in total, across all machines? [1]: "));
    pty.send("3\n");
    REQUIRE(pty.expect("Do you wish to use mixed precision?"));
    REQUIRE(pty.expect(" > no"));
    pty.send("\x1b[B\r");  // bf16: fp16 is not offered on CPUs
    REQUIRE(pty.expect("-> bf16"));
    REQUIRE(pty.expect("cxxlaunch configuration saved at " + file));
    REQUIRE(pty.wait() == 0);
  }
  const auto config = cxxlaunch::launcher::loadConfigFile(file);
  REQUIRE(config.text("distributed_type") == "MULTI_CPU");
  REQUIRE(config.text("num_processes") == "3");
  REQUIRE(config.text("mixed_precision") == "bf16");
  REQUIRE(config.text("debug") == "false");

  auto result = run({CXXLAUNCH_BIN, "run", "--config_file", file, "/usr/bin/env"}, isolated(dir));
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  for (int rank = 0; rank < 3; ++rank) {
    auto env = envOf(result.out, rank);
    REQUIRE(env["WORLD_SIZE"] == "3");
    REQUIRE(env["CXXLAUNCH_STRATEGY"] == "ddp");
    REQUIRE(env["CXXLAUNCH_MIXED_PRECISION"] == "bf16");
    REQUIRE(env["CXXLAUNCH_BACKEND"] == "gloo");
  }
}

TEST_CASE("Ctrl-C in a wizard menu ends it and gives the terminal back in line mode", "[wizard]") {
  TempDir dir;
  const std::string file = dir.path() + "/never.yaml";
  Pty pty({CXXLAUNCH_BIN, "config", "--config_file", file}, isolated(dir));
  REQUIRE(pty.expect(" > No distributed training"));
  struct termios raw {};
  REQUIRE(::tcgetattr(pty.master(), &raw) == 0);
  REQUIRE((raw.c_lflag & ICANON) == 0);  // the menu has the terminal in raw mode
  pty.send("\x03");
  REQUIRE(pty.wait() == 128 + SIGINT);
  struct termios after {};
  REQUIRE(::tcgetattr(pty.master(), &after) == 0);
  REQUIRE((after.c_lflag & ICANON) != 0);
  REQUIRE((after.c_lflag & ECHO) != 0);
  REQUIRE_FALSE(fs::exists(file));
}

TEST_CASE(
    "The wizard on a pipe: numbered prompts, re-asking, DeepSpeed options, and it never "
    "overwrites without --force",
    "[wizard]") {
  TempDir dir;
  const std::string file = dir.path() + "/ds.yaml";
  // multi-GPU, 1 machine, no debug, DeepSpeed yes, stage 9 (wrong) then 3, optimizer and params
  // offloaded to cpu, 4 accumulation steps, clipping 0.5, 16-bit save yes, init flag default,
  // 2 processes, GPUs 0,1, bf16.
  const std::string answers =
      write(dir, "answers", "2\n1\n\nyes\n9\n3\n1\n1\n4\nyes\n0.5\nyes\n\n2\n0,1\n2\n");
  const std::string command =
      std::string(CXXLAUNCH_BIN) + " config --config_file " + file + " < " + answers;
  // Two GPUs, as the launcher counts them: multi-GPU is offered only where there are GPUs.
  const Env gpus = isolated(dir, {{"CUDA_VISIBLE_DEVICES", "0,1"}});
  auto result = run({"/bin/sh", "-c", command}, gpus);
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  // Several GPUs: multi-GPU is the default, as accelerate's.
  REQUIRE_THAT(result.out, Catch::Contains("  [0] No distributed training\n  [1] multi-CPU\n  [2] "
                                           "multi-GPU\nchoose 0-2 [2]: "));
  REQUIRE_THAT(result.out, Catch::Contains("  '9' is not one of the numbers 0 to 3; try again."));
  const auto config = cxxlaunch::launcher::loadConfigFile(file);
  const auto env = cxxlaunch::launcher::workerSettings(config, {});
  REQUIRE(env.at("CXXLAUNCH_STRATEGY") == "zero3");
  REQUIRE(env.at("CXXLAUNCH_OFFLOAD_OPTIMIZER") == "cpu");
  REQUIRE(env.at("CXXLAUNCH_OFFLOAD_PARAMS") == "cpu");
  REQUIRE(env.at("CXXLAUNCH_GRADIENT_ACCUMULATION_STEPS") == "4");
  REQUIRE(env.at("CXXLAUNCH_GRADIENT_CLIPPING") == "0.5");
  REQUIRE(env.at("CXXLAUNCH_ZERO3_SAVE_16BIT_MODEL") == "true");
  REQUIRE(env.at("CXXLAUNCH_MIXED_PRECISION") == "bf16");
  REQUIRE(config.text("gpu_ids") == "0,1");

  const std::string before = readFile(file);
  auto again = run({"/bin/sh", "-c", command}, gpus);
  REQUIRE(again.exit_code == 2);
  REQUIRE_THAT(again.err, Catch::Contains(file + " already exists; pass --force to replace it"));
  REQUIRE(readFile(file) == before);
  auto forced = run({"/bin/sh", "-c", command + " --force"}, gpus);
  REQUIRE(forced.exit_code == 0);
}

TEST_CASE("The wizard offers DeepSpeed and FSDP on CPUs, with every value their keys accept",
          "[wizard]") {
  TempDir dir;
  auto answer = [&](const std::string& name, const std::string& answers) {
    const std::string file = dir.path() + "/" + name + ".yaml";
    auto result = run({"/bin/sh", "-c",
                       std::string(CXXLAUNCH_BIN) + " config --config_file " + file + " < " +
                           write(dir, name + ".answers", answers)},
                      isolated(dir));
    INFO(result.out << result.err);
    REQUIRE(result.exit_code == 0);
    return std::make_pair(result.out, cxxlaunch::launcher::loadConfigFile(file));
  };
  // multi-CPU, 1 machine, no debug, DeepSpeed, stage 3, the optimizer to nvme (a folder that
  // does not exist, asked again, then this test's), no parameter offload, the rest by default, 2
  // processes, no mixed precision.
  const auto [ds_out, ds] = answer(
      "ds", "1\n1\n\nyes\n3\n1\n" + dir.path() + "/nope\n" + dir.path() + "\n0\n\n\n\n\n2\n0\n");
  CHECK_THAT(ds_out, Catch::Contains("'" + dir.path() + "/nope' is not an existing directory"));
  CHECK_THAT(ds_out,
             Catch::Contains("Where to offload optimizer states?\n  [0] none\n  [1] nvme\n"));
  const auto ds_env = cxxlaunch::launcher::workerSettings(ds, {});
  CHECK(ds_env.at("CXXLAUNCH_STRATEGY") == "zero3");
  CHECK(ds_env.at("CXXLAUNCH_OFFLOAD_OPTIMIZER") == "nvme");
  CHECK(ds.text("deepspeed_config.offload_optimizer_nvme_path") == dir.path());
  // multi-CPU, 1 machine, no debug, no DeepSpeed, FSDP, HYBRID_SHARD_ZERO2, wrapping Block, the
  // rest by default (the state dict type FULL, as the key's default), 2 processes.
  const auto [fsdp_out, fsdp] = answer("fsdp", "1\n1\n\n\nyes\n4\n0\nBlock\n\n\n\n\n\n2\n0\n");
  CHECK_THAT(fsdp_out, Catch::Contains("[4] HYBRID_SHARD_ZERO2"));
  CHECK_THAT(fsdp_out, Catch::Contains("[1] LOCAL_STATE_DICT"));
  CHECK(fsdp.text("distributed_type") == "FSDP");
  CHECK(fsdp.text("fsdp_config.fsdp_sharding_strategy") == "HYBRID_SHARD_ZERO2");
  CHECK(fsdp.text("fsdp_config.fsdp_state_dict_type") == "FULL_STATE_DICT");
}

TEST_CASE("The wizard offers only what this machine can run, and records use_cpu as accelerate",
          "[wizard]") {
  TempDir dir;
  // `visible`: the launcher's CUDA_VISIBLE_DEVICES, "" for a machine without a GPU.
  auto answer = [&](const std::string& name, const std::string& visible,
                    const std::string& answers) {
    const std::string file = dir.path() + "/" + name + ".yaml";
    auto result = run({"/bin/sh", "-c",
                       std::string(CXXLAUNCH_BIN) + " config --config_file " + file + " < " +
                           write(dir, name + ".answers", answers)},
                      isolated(dir, {{"CUDA_VISIBLE_DEVICES", visible}}));
    INFO(result.out << result.err);
    REQUIRE(result.exit_code == 0);
    return std::make_pair(result.out, cxxlaunch::launcher::loadConfigFile(file));
  };
  // No GPU, one process: neither multi-GPU nor fp16 is offered, and CPU is not a question.
  const auto [cpu_out, cpu] = answer("cpu", "", "0\n1\n");
  CHECK_THAT(cpu_out,
             Catch::Contains("  [0] No distributed training\n  [1] multi-CPU\nchoose 0-1"));
  CHECK_THAT(cpu_out, !Catch::Contains("multi-GPU") && !Catch::Contains("fp16"));
  CHECK_THAT(cpu_out, !Catch::Contains("CPU only"));
  CHECK_THAT(cpu_out, Catch::Contains("No GPU found on this machine: training runs on CPUs "
                                      "(use_cpu: true).\n"));
  CHECK_THAT(cpu_out,
             Catch::Contains("Do you wish to use mixed precision?\n  [0] no\n  [1] bf16\n"));
  CHECK(cpu.text("use_cpu") == "true");
  CHECK(cpu.isSet("use_cpu"));
  CHECK(cpu.text("mixed_precision") == "bf16");
  // No GPU, multi-CPU: use_cpu: true in the file.
  const auto [multi_out, multi] = answer("multi", "", "1\n1\n\n\n\n2\n0\n");
  CHECK(multi.text("distributed_type") == "MULTI_CPU");
  CHECK(multi.isSet("use_cpu"));
  CHECK(multi.text("use_cpu") == "true");
  // Two GPUs, but multi-CPU with DeepSpeed (ZeRO-2, the rest by default, 2 processes): CPU
  // workers, so use_cpu: true and no fp16 (which once was offered here, and failed in workers).
  const auto [ds_out, ds] = answer("ds", "0,1", "1\n1\n\nyes\n2\n0\n\n\n2\n1\n");
  CHECK(ds.text("distributed_type") == "DEEPSPEED");
  CHECK(ds.text("use_cpu") == "true");
  CHECK(ds.text("mixed_precision") == "bf16");
  CHECK_THAT(ds_out, !Catch::Contains("fp16"));
  // One GPU, one process: CPU only is a question again, and fp16 is offered.
  const auto [gpu_out, gpu] = answer("gpu", "0", "0\nno\n1\n");
  CHECK_THAT(gpu_out, Catch::Contains("[2] multi-GPU"));
  CHECK_THAT(gpu_out, Catch::Contains("Do you want to run your training on CPU only"));
  CHECK_THAT(gpu_out, Catch::Contains("  [0] no\n  [1] fp16\n  [2] bf16\n"));
  CHECK(gpu.text("use_cpu") == "false");
  CHECK(gpu.text("mixed_precision") == "fp16");
}

TEST_CASE(
    "A config that needs a GPU is refused by config --print, test and run where there is none",
    "[config][wizard]") {
  TempDir dir;
  const std::string file = write(dir, "fp16.yaml", "mixed_precision: fp16\n");
  const std::string marker = dir.path() + "/spawned";
  const std::string error =
      file +
      ":1:18: fp16 needs a GPU, but this machine has none visible (no NVIDIA GPU in "
      "/proc/driver/nvidia/gpus, or CUDA_VISIBLE_DEVICES names none), so the workers would train "
      "on CPUs; use bf16 or no here\n";
  // "" and -1: the ways to hide every GPU from CUDA.
  for (const std::string visible : {"", "-1"}) {
    const Env none =
        isolated(dir, {{"CUDA_VISIBLE_DEVICES", visible}, {"CXXLAUNCH_SELFTEST", TEST_WORKER}});
    auto print = run({CXXLAUNCH_BIN, "config", "--print", "--config_file", file}, none);
    CHECK(print.exit_code == 2);
    CHECK(print.err == "cxxlaunch config: error: " + error);
    auto test = run({CXXLAUNCH_BIN, "test", "--config_file", file, "--", "env"}, none);
    CHECK(test.exit_code == 2);
    CHECK(test.err == "cxxlaunch test: error: " + error);
    CHECK(test.out.empty());  // no worker started
    auto launched =
        run({CXXLAUNCH_BIN, "run", "--config_file", file, "/usr/bin/touch", marker}, none);
    CHECK(launched.exit_code == 2);
    CHECK(launched.err == "cxxlaunch run: error: " + error);
    CHECK_FALSE(fs::exists(marker));
  }
  // Where a GPU is visible the file is fine.
  auto gpu = run({CXXLAUNCH_BIN, "config", "--print", "--config_file", file},
                 isolated(dir, {{"CUDA_VISIBLE_DEVICES", "0"}}));
  CHECK(gpu.exit_code == 0);
  CHECK_THAT(gpu.out, Catch::Contains("fp16"));
}

TEST_CASE("The wizard's questions for several machines", "[wizard]") {
  TempDir dir;
  const std::string file = dir.path() + "/node.yaml";
  // multi-CPU, 2 machines, rank 1, the main IP, port 0 (refused) then the default, not the same
  // network, c10d, no debug, no DeepSpeed, no FSDP, 3 processes (refused: uneven) then 4, no
  // mixed precision.
  const std::string answers =
      write(dir, "answers", "1\n2\n1\n10.0.0.1\n0\n\nno\n1\n\n\n\n3\n4\n0\n");
  auto result =
      run({"/bin/sh", "-c",
           std::string(CXXLAUNCH_BIN) + " config --config_file " + file + " < " + answers},
          isolated(dir));
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  REQUIRE_THAT(result.out,
               Catch::Contains("What is the rank of this machine?\n  [0] 0\n  [1] 1\n"));
  REQUIRE_THAT(result.out,
               Catch::Contains("  several machines need a fixed port, not 0; try again."));
  REQUIRE_THAT(result.out,
               Catch::Contains("  the total must divide evenly among 2 machines; try again."));
  const auto config = cxxlaunch::launcher::loadConfigFile(file);
  REQUIRE(config.text("num_machines") == "2");
  REQUIRE(config.text("machine_rank") == "1");
  REQUIRE(config.text("main_process_ip") == "10.0.0.1");
  REQUIRE(config.text("main_process_port") == "29500");
  REQUIRE(config.text("same_network") == "false");
  REQUIRE(config.text("rdzv_backend") == "c10d");
  REQUIRE(config.text("num_processes") == "4");
  REQUIRE(config.text("mixed_precision") == "no");

  // The same answers with etcd as the rendezvous backend.
  const std::string etcd = write(dir, "etcd", "1\n2\n1\n10.0.0.1\n29400\nno\n2\n\n\n\n4\n0\n");
  auto with_etcd =
      run({"/bin/sh", "-c",
           std::string(CXXLAUNCH_BIN) + " config --force --config_file " + file + " < " + etcd},
          isolated(dir));
  INFO(with_etcd.out << with_etcd.err);
  REQUIRE(with_etcd.exit_code == 0);
  REQUIRE_THAT(with_etcd.out, Catch::Contains("  [2] etcd\n  [3] etcd-v2\n"));
  const auto etcd_config = cxxlaunch::launcher::loadConfigFile(file);
  REQUIRE(etcd_config.text("rdzv_backend") == "etcd");
  REQUIRE(etcd_config.text("main_process_port") == "29400");
}

TEST_CASE("config default writes the default file once, and run uses it without --config_file",
          "[config]") {
  TempDir dir;
  const Env env = isolated(dir);
  auto first = run({CXXLAUNCH_BIN, "config", "default", "--mixed_precision", "bf16"}, env);
  INFO(first.err);
  REQUIRE(first.exit_code == 0);
  const std::string path = dir.path() + "/cache/cxxlaunch/default_config.yaml";
  REQUIRE_THAT(first.out, Catch::Contains("saved at " + path));
  REQUIRE(cxxlaunch::launcher::loadConfigFile(path).text("mixed_precision") == "bf16");
  auto second = run({CXXLAUNCH_BIN, "config", "default"}, env);
  REQUIRE(second.exit_code == 2);
  REQUIRE_THAT(second.err, Catch::Contains("already exists"));

  auto launched = run({CXXLAUNCH_BIN, "run", "/usr/bin/env"}, env);
  REQUIRE(launched.exit_code == 0);
  REQUIRE(envOf(launched.out, 0)["CXXLAUNCH_MIXED_PRECISION"] == "bf16");

  auto printed = run({CXXLAUNCH_BIN, "config", "--print"},
                     isolated(dir, {{"CXXLAUNCH_GRADIENT_CLIPPING", "2.5"}}));
  REQUIRE(printed.exit_code == 0);
  REQUIRE_THAT(printed.out, Catch::Contains("config file: " + path));
  REQUIRE_THAT(printed.out, Catch::Contains("bf16  (file " + path + ":3:18)"));
  REQUIRE_THAT(printed.out, Catch::Contains("2.5  (env CXXLAUNCH_GRADIENT_CLIPPING)"));
}

TEST_CASE("run: flag > environment > file reaches the workers", "[config]") {
  TempDir dir;
  const std::string file =
      write(dir, "c.yaml",
            "distributed_type: MULTI_CPU\nnum_processes: 2\nmixed_precision: bf16\n"
            "deepspeed_config:\n  gradient_accumulation_steps: 3\n  gradient_clipping: 1.0\n");
  auto result = run(
      {CXXLAUNCH_BIN, "run", "--config_file", file, "--gradient_clipping", "0.25", "/usr/bin/env"},
      isolated(dir, {{"CXXLAUNCH_GRADIENT_ACCUMULATION_STEPS", "6"},
                     {"CXXLAUNCH_GRADIENT_CLIPPING", "9"}}));
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  for (int rank = 0; rank < 2; ++rank) {
    auto env = envOf(result.out, rank);
    REQUIRE(env["WORLD_SIZE"] == "2");
    REQUIRE(env["CXXLAUNCH_MIXED_PRECISION"] == "bf16");
    REQUIRE(env["CXXLAUNCH_GRADIENT_ACCUMULATION_STEPS"] == "6");
    REQUIRE(env["CXXLAUNCH_GRADIENT_CLIPPING"] == "0.25");
  }
}

TEST_CASE(
    "run with a bad config: one message with file:line:column, exit code 2, nothing "
    "spawned",
    "[config]") {
  TempDir dir;
  const std::string marker = dir.path() + "/spawned";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"distributed_type: MULTI_GPU\nnum_processes: [2\n", "bad.yaml:3:1: YAML syntax error"},
      {"num_processes: two\n", "bad.yaml:1:16: num_processes: 'two' is not a whole number"},
      {"mixed_precison: bf16\n",
       "bad.yaml:1:1: unknown key 'mixed_precison'; did you mean mixed_precision?"},
      {"use_cpu: true\nmixed_precision: fp16\n", "bad.yaml:2:18: fp16 needs a GPU"},
  };
  for (const auto& [text, message] : cases) {
    const std::string file = write(dir, "bad.yaml", text);
    auto result =
        run({CXXLAUNCH_BIN, "run", "--config_file", file, "/usr/bin/touch", marker}, isolated(dir));
    INFO(text);
    REQUIRE(result.exit_code == 2);
    REQUIRE_THAT(result.err,
                 Catch::StartsWith("cxxlaunch run: error: " + dir.path() + "/" + message));
    REQUIRE(std::count(result.err.begin(), result.err.end(), '\n') == 1);
    REQUIRE_FALSE(fs::exists(marker));
  }
}

TEST_CASE("Two machines from one accelerate file (differing only in machine_rank) form one world",
          "[config][multinode]") {
  TempDir dir;
  const std::string port = std::to_string(freePort());
  std::vector<std::unique_ptr<Subprocess>> machines;
  for (int rank : {1, 0}) {
    const std::string file = write(
        dir, "node" + std::to_string(rank) + ".yaml",
        "distributed_type: MULTI_CPU\nnum_machines: 2\nnum_processes: 4\nmachine_rank: " +
            std::to_string(rank) + "\nmain_process_ip: 127.0.0.1\nmain_process_port: " + port +
            "\nrdzv_backend: static\nsame_network: true\n");
    machines.push_back(std::make_unique<Subprocess>(
        Args{CXXLAUNCH_BIN, "run", "--config_file", file, "/usr/bin/env"}, isolated(dir)));
  }
  std::set<std::string> ranks;
  for (size_t m = 0; m < machines.size(); ++m) {
    auto finished = machines[m]->wait(60s);
    REQUIRE(finished);
    INFO(finished->out << finished->err);
    REQUIRE(finished->exit_code == 0);
    const int node = m == 0 ? 1 : 0;  // machine_rank decides the node rank, not arrival
    for (int rank = 2 * node; rank < 2 * node + 2; ++rank) {
      auto env = envOf(finished->out, rank, node);
      ranks.insert(env["RANK"]);
      REQUIRE(env["WORLD_SIZE"] == "4");
      REQUIRE(env["LOCAL_WORLD_SIZE"] == "2");
      REQUIRE(env["GROUP_RANK"] == std::to_string(node));
      REQUIRE(env["TORCHELASTIC_RUN_ID"] == "accelerate-127-0-0-1-" + port);
    }
  }
  REQUIRE(ranks == std::set<std::string>{"0", "1", "2", "3"});
}

TEST_CASE("cxxlaunch test runs the self-test worker with the config and gives a verdict",
          "[selftest]") {
  TempDir dir;
  const std::string file =
      write(dir, "cpu.yaml", "distributed_type: MULTI_CPU\nnum_processes: 3\n");
  auto ready = run({CXXLAUNCH_BIN, "test", "--config_file", file, "--", "env"},
                   isolated(dir, {{"CXXLAUNCH_SELFTEST", TEST_WORKER}}));
  INFO(ready.out << ready.err);
  REQUIRE(ready.exit_code == 0);
  REQUIRE(envOf(ready.out, 2)["WORLD_SIZE"] == "3");
  REQUIRE_THAT(ready.out, Catch::EndsWith("cxxlaunch test: your setup is ready (3 worker(s) per "
                                          "machine, strategy ddp)\n"));

  auto two = run({CXXLAUNCH_BIN, "test", "--", "env"},
                 isolated(dir, {{"CXXLAUNCH_SELFTEST", TEST_WORKER}}));
  REQUIRE(two.exit_code == 0);
  REQUIRE(envOf(two.out, 1)["WORLD_SIZE"] == "2");  // two workers when nothing says how many

  auto failing = run({CXXLAUNCH_BIN, "test", "--config_file", file, "--", "rank", "1", "exit", "3"},
                     isolated(dir, {{"CXXLAUNCH_SELFTEST", TEST_WORKER}}));
  REQUIRE(failing.exit_code == 1);
  REQUIRE_THAT(failing.out, Catch::Contains("cxxlaunch test: your setup is NOT ready: the "
                                            "self-test failed with exit code 3"));

  auto missing =
      run({CXXLAUNCH_BIN, "test"}, isolated(dir, {{"CXXLAUNCH_SELFTEST", dir.path() + "/nope"}}));
  REQUIRE(missing.exit_code == 1);
  REQUIRE_THAT(missing.out, Catch::Contains("your setup is NOT ready: the self-test worker"));
}

TEST_CASE("cxxlaunch env prints versions, hardware and the config in use", "[config]") {
  TempDir dir;
  const std::string file = write(dir, "c.yaml", "distributed_type: MULTI_CPU\nfp8_config: {}\n");
  auto result = run({CXXLAUNCH_BIN, "env", "--config_file", file}, isolated(dir));
  REQUIRE(result.exit_code == 0);
  for (const char* line : {"- cxxlaunch version: ", "- LibTorch version (build time): ",
                           "- NCCL version (build time): ", "- CUDA runtime version (build time): ",
                           "- CUDA driver: ", "- gRPC version: 1.",
                           "- CPU: ", "- RAM: ", "- GPUs: ", "    - distributed_type: MULTI_CPU\n",
                           "    - fp8_config: {} (ignored)\n"}) {
    REQUIRE_THAT(result.out, Catch::Contains(line));
  }
  auto none = run({CXXLAUNCH_BIN, "env"}, isolated(dir));
  REQUIRE_THAT(none.out, Catch::Contains("- Config: not found"));
}

TEST_CASE("cxxlaunch estimate-memory prints the table, and bad input is a usage error",
          "[estimate]") {
  auto result =
      run({CXXLAUNCH_BIN, "estimate-memory", "--params", "7.5e9", "--num_processes", "64"});
  REQUIRE(result.exit_code == 0);
  REQUIRE_THAT(result.out, Catch::Contains("bf16   zero1                         31.88"));
  REQUIRE_THAT(result.out, Catch::Contains("fp32   ddp                          120.00"));
  auto bad = run({CXXLAUNCH_BIN, "estimate-memory", "--params", "lots"});
  REQUIRE(bad.exit_code == 2);
  REQUIRE(bad.err ==
          "cxxlaunch estimate-memory: error: --params: 'lots' is not a positive number "
          "(e.g. 7e9)\n");
}
