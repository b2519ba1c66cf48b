// What `cxxlaunch run` checks against this machine before it starts anything: a config that
// needs a GPU where there is none is refused; more workers than cores or GPUs start, with a
// warning that says what follows.

#include "launcher/launch_options.h"

#include <catch2/catch.hpp>
#include <fstream>

#include "launcher/cli.h"
#include "launcher/config.h"
#include "support/subprocess.h"

using namespace cxxlaunch::launcher;
using cxxlaunch::testing::TempDir;
using Args = std::vector<std::string>;

namespace {

HostInfo host(int cpus, int gpus) {
  HostInfo h;
  h.cpus = cpus;
  h.gpus = gpus;
  h.path = "/usr/bin:/bin";
  return h;
}

std::string yaml(const TempDir& dir, const std::string& text) {
  const std::string path = dir.path() + "/c.yaml";
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST_CASE("fp16 on a machine with no GPU is refused before anything starts", "[config][machine]") {
  TempDir dir;
  const std::string fp16 = yaml(dir, "distributed_type: MULTI_GPU\nmixed_precision: fp16\n");
  CHECK_THROWS_AS(parseRunArgs({"--config_file", fp16, "/bin/true"}, host(8, 0)), ConfigError);
  CHECK_THROWS_WITH(parseRunArgs({"--config_file", fp16, "/bin/true"}, host(8, 0)),
                    fp16 +
                        ":2:18: fp16 needs a GPU, but this machine has none visible (no NVIDIA GPU "
                        "in /proc/driver/nvidia/gpus, or CUDA_VISIBLE_DEVICES names none), so the "
                        "workers would train on CPUs; use bf16 or no here");
  CHECK_THROWS_WITH(parseRunArgs({"--mixed_precision", "fp16", "/bin/true"}, host(8, 0)),
                    Catch::StartsWith("--mixed_precision: fp16 needs a GPU, but this machine"));
  // With a GPU it runs; bf16 and no run anywhere.
  CHECK(parseRunArgs({"--config_file", fp16, "/bin/true"}, host(8, 1))
            .worker_env.at("CXXLAUNCH_MIXED_PRECISION") == "fp16");
  CHECK_NOTHROW(parseRunArgs({"--mixed_precision", "bf16", "/bin/true"}, host(8, 0)));
  // A config that asks for CPUs itself keeps its own message, on any machine.
  CHECK_THROWS_WITH(parseRunArgs({"--cpu", "--mixed_precision", "fp16", "/bin/true"}, host(8, 4)),
                    Catch::Contains("but this config trains on CPUs (use_cpu at --cpu)"));
  // The same check alone, as `config --print` uses it.
  Config c;
  c.set("mixed_precision", "fp16", {Origin::kEnv, "CXXLAUNCH_MIXED_PRECISION"});
  CHECK_THROWS_WITH(validateConfigOnMachine(c, 0),
                    Catch::StartsWith("CXXLAUNCH_MIXED_PRECISION: fp16 needs a GPU"));
  CHECK_NOTHROW(validateConfigOnMachine(c, 2));
}

TEST_CASE("More CPU workers than cores start with a warning that says what follows",
          "[cli][oversubscription]") {
  TempDir dir;
  const std::string want =
      " worker processes on 2 CPU core(s) available to this launcher: the workers will share "
      "cores (oversubscribed), so each step runs slower than with 2 worker(s) or fewer; lower "
      "--nproc_per_node or num_processes";
  for (const Args& args :
       {Args{"--num_processes", "64", "/bin/true"}, Args{"--nproc_per_node", "64", "/bin/true"},
        Args{"--nproc_per_node=64", "--multi_gpu", "/bin/true"},  // no GPU: CPU workers
        Args{"--config_file", yaml(dir, "distributed_type: FSDP\nnum_processes: 64\n"),
             "/bin/true"}}) {
    INFO(Catch::StringMaker<Args>::convert(args));
    const LaunchOptions o = parseRunArgs(args, host(2, 0));
    CHECK(o.nproc_per_node == 64);
    CHECK(o.warnings == std::vector<std::string>{"64" + want});
  }
  // At or below the count, and --nproc_per_node cpu: nothing to say.
  CHECK(parseRunArgs({"--nproc_per_node", "2", "/bin/true"}, host(2, 0)).warnings.empty());
  CHECK(parseRunArgs({"--nproc_per_node", "cpu", "/bin/true"}, host(2, 0)).warnings.empty());
  // On a GPU machine, --cpu workers count against the cores too.
  CHECK(parseRunArgs({"--cpu", "--nproc_per_node", "3", "/bin/true"}, host(2, 8)).warnings ==
        std::vector<std::string>{"3" + want});
}

TEST_CASE("More GPU workers than GPUs start with a warning that says what follows",
          "[cli][oversubscription]") {
  const LaunchOptions o = parseRunArgs({"--nproc_per_node", "4", "/bin/true"}, host(64, 2));
  CHECK(o.warnings ==
        std::vector<std::string>{
            "4 worker processes on 2 GPU(s): a program that takes cuda:LOCAL_RANK fails on local "
            "ranks 2 and above, and workers that share a GPU run slower and split its memory; use "
            "--nproc_per_node 2 or fewer, or --cpu"});
  // Many cores do not matter to a GPU run, nor does a count within the GPUs.
  CHECK(parseRunArgs({"--nproc_per_node", "2", "/bin/true"}, host(1, 2)).warnings.empty());
  CHECK(parseRunArgs({"--nproc_per_node", "gpu", "/bin/true"}, host(1, 2)).warnings.empty());
}
