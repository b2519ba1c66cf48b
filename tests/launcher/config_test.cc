// The config: every real file loads and round-trips, each error class names its position, the
// layers resolve in order, and the result reaches LaunchOptions and the worker environment.

#include "launcher/config.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "launcher/cli.h"
#include "launcher/memory_estimate.h"
#include "support/subprocess.h"

using namespace cxxlaunch::launcher;
using cxxlaunch::testing::TempDir;
namespace fs = std::filesystem;
using Args = std::vector<std::string>;
using Env = std::map<std::string, std::string>;

namespace {

std::vector<std::string> yamlFilesIn(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {  // throws if the folder is missing
    if (entry.path().extension() == ".yaml" || entry.path().extension() == ".yml") {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string write(const TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// The message of the ConfigError that loading (and validating) `text` throws.
std::string errorOf(const std::string& text, const Env& env = {},
                    const std::vector<FlagValue>& flags = {}) {
  TempDir dir;
  ConfigLayers layers;
  layers.file = write(dir, "c.yaml", text);
  layers.env = env;
  layers.flags = flags;
  try {
    resolveConfig(layers);
  } catch (const ConfigError& e) {
    std::string message = e.what();
    for (auto at = message.find(dir.path()); at != std::string::npos;
         at = message.find(dir.path())) {
      message.erase(at, dir.path().size() + 1);
    }
    return message;
  }
  FAIL("no error for:\n" << text);
  return "";
}

HostInfo host(int gpus = 0) {
  HostInfo h;
  h.cpus = 8;
  h.gpus = gpus;
  h.path = "/usr/bin:/bin";
  return h;
}

}  // namespace

TEST_CASE("Every accelerate example file and every file in configs/ loads and round-trips",
          "[config]") {
  std::vector<std::string> files = yamlFilesIn(SHARED_ACCELERATE_CONFIGS);
  const auto ours = yamlFilesIn(EXAMPLE_CONFIGS);
  REQUIRE(files.size() >= 7);
  REQUIRE(ours.size() >= 5);
  files.insert(files.end(), ours.begin(), ours.end());
  for (const auto& file : files) {
    INFO(file);
    ConfigLayers layers;
    layers.file = file;
    const Config loaded = resolveConfig(layers);
    REQUIRE(loaded.isSet("distributed_type"));
    const std::string text = writeConfigText(loaded);
    INFO(text);
    const Config again = parseConfigText(text, "written");
    REQUIRE(again == loaded);
    REQUIRE(again.values().size() == loaded.values().size());
    REQUIRE(writeConfigText(again) == text);
  }
}

TEST_CASE("accelerate's keys that do not apply are reported with their position, not fatal",
          "[config]") {
  const Config c = loadConfigFile(std::string(SHARED_ACCELERATE_CONFIGS) + "/fp8.yaml");
  REQUIRE(c.ignored.count("fp8_config") == 1);
  REQUIRE(c.notes.size() == 1);
  REQUIRE_THAT(c.notes[0], Catch::Contains("fp8.yaml:6:1: fp8_config is accelerate's and does not "
                                           "apply to cxxlaunch; ignored"));
  REQUIRE(workerSettings(c, {}).at("CXXLAUNCH_MIXED_PRECISION") == "bf16");  // fp8 runs as bf16
  // accelerate's DeepSpeed example names a JSON of its templates (beside the examples' folder, as
  // in accelerate's tree), and its stage is read from there.
  ConfigLayers ds;
  ds.file = std::string(SHARED_ACCELERATE_CONFIGS) + "/deepspeed.yaml";
  const Config resolved = resolveConfig(ds);
  REQUIRE(resolved.text("deepspeed_config.zero_stage") == "1");
  REQUIRE_THAT(resolved.origin("deepspeed_config.zero_stage").where,
               Catch::EndsWith("zero_stage1_config.json:32:18"));
}

TEST_CASE("The writer quotes strings so that YAML 1.1 readers keep NO and addresses as text",
          "[config]") {
  Config c;
  c.set("distributed_type", "NO", {Origin::kFile, "x"});
  c.set("main_process_ip", "1234", {Origin::kFile, "x"});
  c.set("num_processes", "2", {Origin::kFile, "x"});
  c.set("deepspeed_config.zero_stage", "3", {Origin::kFile, "x"});
  REQUIRE(writeConfigText(c) ==
          "distributed_type: \"NO\"\nnum_processes: 2\nmain_process_ip: \"1234\"\n"
          "deepspeed_config:\n  zero_stage: 3\n");
}

TEST_CASE("A YAML syntax error names file:line:column", "[config][errors]") {
  REQUIRE(errorOf("distributed_type: MULTI_GPU\nnum_processes: [2\n") ==
          "c.yaml:3:1: YAML syntax error: end of sequence flow not found; fix the file or write a "
          "new one with `cxxlaunch config`");
  REQUIRE_THAT(errorOf("- a\n- b\n"), Catch::StartsWith("c.yaml:1:1: a config file is a mapping"));
  REQUIRE_THAT(errorOf("fp8_config: " + std::string(3000, '[')),
               Catch::EndsWith(": the YAML nests too deeply to be a config file"));
}

TEST_CASE("A value of the wrong type names the value's position and what fits",
          "[config][errors]") {
  REQUIRE(errorOf("distributed_type: MULTI_GPU\nnum_processes: two\n") ==
          "c.yaml:2:16: num_processes: 'two' is not a whole number from 1 to 16777216");
  REQUIRE(errorOf("use_cpu: maybe\n") == "c.yaml:1:10: use_cpu: 'maybe' is not true or false");
  REQUIRE(errorOf("mixed_precision: fp64\n") ==
          "c.yaml:1:18: mixed_precision: 'fp64' is not one of no, fp16, bf16 or fp8");
  REQUIRE(errorOf("distributed_type: XLA\n") ==
          "c.yaml:1:19: distributed_type: 'XLA' is not supported by cxxlaunch; use one of NO, "
          "MULTI_CPU, MULTI_GPU, FSDP or DEEPSPEED");
  REQUIRE(errorOf("fsdp_config:\n  fsdp_offload_params: [1]\n") ==
          "c.yaml:2:24: fsdp_config.fsdp_offload_params must be true or false, not a list");
  REQUIRE(errorOf("main_process_ip: \"a\\x01b\"\n") ==
          "c.yaml:1:18: main_process_ip: the value has control characters or is not valid UTF-8");
  REQUIRE(errorOf("fsdp_config: 3\n") ==
          "c.yaml:1:14: fsdp_config must be a mapping of keys (or {})");
}

TEST_CASE("An unknown key names its position and the closest known key", "[config][errors]") {
  // The guide by its real path (doc_reference_test.cc), here the source tree's.
  const std::string see = " (see the config guide: " + std::string(CONFIG_DOC) + ")";
  REQUIRE(errorOf("distributed_type: MULTI_GPU\nnum_proceses: 2\n") ==
          "c.yaml:2:1: unknown key 'num_proceses'; did you mean num_processes?" + see);
  REQUIRE(errorOf("fsdp_config:\n  fsdp_sharding_stratgy: FULL_SHARD\n") ==
          "c.yaml:2:3: unknown key 'fsdp_config.fsdp_sharding_stratgy'; did you mean "
          "fsdp_config.fsdp_sharding_strategy?" +
              see);
  REQUIRE(errorOf("cxxlaunch:\n  join_timout: 5\n") ==
          "c.yaml:2:3: unknown key 'cxxlaunch.join_timout'; did you mean "
          "cxxlaunch.join_timeout?" +
              see);
  REQUIRE(errorOf("zzzzzzzz: 1\n") == "c.yaml:1:1: unknown key 'zzzzzzzz'" + see);
}

TEST_CASE("Several unknown keys are named in one error", "[config][errors]") {
  REQUIRE(errorOf("num_proceses: 2\ndistributed_type: MULTI_CPU\nzzzzzzzz: 1\nfsdp_config:\n"
                  "  fsdp_sharding_stratgy: FULL_SHARD\n") ==
          "c.yaml:1:1: 3 unknown keys: 'num_proceses' (line 1; did you mean num_processes?), "
          "'zzzzzzzz' (line 3), 'fsdp_config.fsdp_sharding_stratgy' (line 5; did you mean "
          "fsdp_config.fsdp_sharding_strategy?) (see the config guide: " +
              std::string(CONFIG_DOC) + ")");
}

TEST_CASE("Impossible combinations name the setting at fault", "[config][errors]") {
  REQUIRE(errorOf("distributed_type: MULTI_CPU\nmixed_precision: fp16\n") ==
          "c.yaml:2:18: fp16 needs a GPU, but this config trains on CPUs (distributed_type "
          "MULTI_CPU at c.yaml:1:19); use bf16 or no");
  REQUIRE(errorOf("use_cpu: true\nmixed_precision: fp16\n") ==
          "c.yaml:2:18: fp16 needs a GPU, but this config trains on CPUs (use_cpu at "
          "c.yaml:1:10); use bf16 or no");
  REQUIRE(errorOf("distributed_type: MULTI_GPU\nnum_machines: 2\nnum_processes: 3\n"
                  "main_process_ip: 10.0.0.1\n") ==
          "c.yaml:3:16: num_processes is the total across machines and must divide evenly: 3 "
          "processes on 2 machines (num_machines at c.yaml:2:15)");
  REQUIRE(errorOf("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 4\n") ==
          "c.yaml:3:15: deepspeed_config.zero_stage: 4 is out of range; use a whole number from 0 "
          "to 3");
  REQUIRE(errorOf("cxxlaunch:\n  join_timeout: -5\n") ==
          "c.yaml:2:17: cxxlaunch.join_timeout: -5 is out of range; use a number of seconds > 0 "
          "and <= 31536000");
  REQUIRE(errorOf("cxxlaunch:\n  close_timeout: -1\n") ==
          "c.yaml:2:18: cxxlaunch.close_timeout: -1 is out of range; use a number of seconds >= 0 "
          "and <= 31536000");
  // Past the top, the message names it (it once said only "a number >= 0").
  REQUIRE(errorOf("distributed_type: DEEPSPEED\ndeepspeed_config:\n  gradient_clipping: 1e31\n") ==
          "c.yaml:3:22: deepspeed_config.gradient_clipping: 1e31 is out of range; use a number "
          "from 0 to 1e+30");
  REQUIRE(errorOf("num_machines: 2\nmachine_rank: 2\nmain_process_ip: h\n") ==
          "c.yaml:2:15: machine_rank 2 is out of range for 2 machine(s); use 0 to 1");
  REQUIRE(errorOf("distributed_type: MULTI_GPU\nnum_machines: 2\n") ==
          "c.yaml:2:15: a job on several machines needs main_process_ip: the address of the "
          "machine with machine_rank 0");
  REQUIRE(errorOf("distributed_type: MULTI_GPU\nnum_processes: 2\ngpu_ids: 0,1,2\n") ==
          "c.yaml:3:10: gpu_ids names 3 GPU(s) but each machine runs 2 process(es) (num_processes "
          "at c.yaml:2:16); give one GPU per process");
  REQUIRE(errorOf("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n  "
                  "offload_param_device: nvme\n") ==
          "c.yaml:4:25: nvme offload needs a directory on local disk: set "
          "offload_param_nvme_path");
  REQUIRE(
      errorOf("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n  "
              "offload_optimizer_device: nvme\n  offload_optimizer_nvme_path: /nonexistent\n") ==
      "c.yaml:5:32: offload_optimizer_nvme_path '/nonexistent' is not an existing directory; "
      "create it first");
  REQUIRE(errorOf("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n  "
                  "offload_param_device: nvme\n  offload_param_nvme_path: /tmp\n") ==
          "c.yaml:4:25: offload_param_device nvme needs zero_stage 3 (parameters sharded at "
          "rest)");
}

TEST_CASE("A bad value from a flag or the environment names the flag or the variable",
          "[config][errors]") {
  REQUIRE(errorOf("use_cpu: true\n", {}, {{"mixed_precision", "fp16", "--mixed_precision"}}) ==
          "--mixed_precision: fp16 needs a GPU, but this config trains on CPUs (use_cpu at "
          "c.yaml:1:10); use bf16 or no");
  REQUIRE(errorOf("{}\n", {{"CXXLAUNCH_NUM_PROCESSES", "-3"}}) ==
          "CXXLAUNCH_NUM_PROCESSES: num_processes: -3 is out of range; use a whole number from 1 "
          "to 16777216");
}

TEST_CASE("An unknown tracker in the file, the environment or a flag is named where it is set",
          "[config][errors]") {
  const std::string known =
      "; the known ones are tensorboard, csv and jsonl (or all), as a comma list";
  REQUIRE(errorOf("cxxlaunch:\n  log_with: csv,tensorbord\n") ==
          "c.yaml:2:13: unknown tracker 'tensorbord' (did you mean 'tensorboard'?)" + known);
  REQUIRE(errorOf("{}\n", {{"CXXLAUNCH_LOG_WITH", "wandb"}}) ==
          "CXXLAUNCH_LOG_WITH: unknown tracker 'wandb'" + known);
  REQUIRE(errorOf("{}\n", {}, {{"cxxlaunch.log_with", "jsonl,mlflow,comet", "--log_with"}}) ==
          "--log_with: unknown trackers 'mlflow', 'comet'" + known);
}

TEST_CASE("Resolution: flag > CXXLAUNCH_* environment > file > default, with provenance",
          "[config]") {
  TempDir dir;
  ConfigLayers layers;
  layers.file = write(dir, "c.yaml",
                      "distributed_type: MULTI_GPU\nmixed_precision: bf16\nnum_processes: 4\n"
                      "deepspeed_config:\n  gradient_accumulation_steps: 8\n");
  layers.env = {{"CXXLAUNCH_MIXED_PRECISION", "fp16"}, {"CXXLAUNCH_NUM_PROCESSES", "6"}};
  layers.flags = {{"num_processes", "2", "--num_processes"}};
  const Config c = resolveConfig(layers);
  REQUIRE(c.text("num_processes") == "2");
  REQUIRE(c.origin("num_processes").describe() == "flag --num_processes");
  REQUIRE(c.text("mixed_precision") == "fp16");
  REQUIRE(c.origin("mixed_precision").describe() == "env CXXLAUNCH_MIXED_PRECISION");
  REQUIRE(c.text("deepspeed_config.gradient_accumulation_steps") == "8");
  REQUIRE(c.origin("deepspeed_config.gradient_accumulation_steps").describe() ==
          "file " + layers.file + ":5:32");
  REQUIRE(c.text("num_machines") == "1");
  REQUIRE(c.origin("num_machines").describe() == "default");
  const std::string table = describeConfig(c, layers.env);
  REQUIRE_THAT(table, Catch::Contains("  mixed_precision  ") &&
                          Catch::Contains("fp16  (env CXXLAUNCH_MIXED_PRECISION)") &&
                          Catch::Contains("2  (flag --num_processes)") &&
                          Catch::Contains("  CXXLAUNCH_GRADIENT_ACCUMULATION_STEPS=8\n"));
}

TEST_CASE("A DeepSpeed config file's stage, offload, accumulation, clipping and precision are read",
          "[config]") {
  TempDir dir;
  // As DeepSpeed projects write it: "auto" where accelerate fills in, sections cxxlaunch leaves
  // to the trainer.
  write(dir, "ds.json", R"({
  "bf16": {"enabled": true},
  "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
  "zero_optimization": {
    "stage": 3,
    "offload_optimizer": {"device": "cpu", "pin_memory": true},
    "overlap_comm": true,
    "stage3_gather_16bit_weights_on_model_save": true
  },
  "gradient_accumulation_steps": 4,
  "gradient_clipping": 1.0,
  "train_micro_batch_size_per_gpu": "auto"
})");
  ConfigLayers layers;
  layers.file = write(dir, "c.yaml",
                      "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n"
                      "  deepspeed_config_file: ds.json\n");  // beside the YAML
  layers.flags = {{"deepspeed_config.gradient_clipping", "0.5", "--gradient_clipping"}};
  const Config c = resolveConfig(layers);
  CHECK(c.text("deepspeed_config.zero_stage") == "3");
  CHECK(c.origin("deepspeed_config.zero_stage").describe() ==
        "file " + dir.path() + "/ds.json:5:14");
  CHECK(c.text("deepspeed_config.offload_optimizer_device") == "cpu");
  CHECK(c.text("deepspeed_config.offload_param_device") == "none");
  CHECK(c.text("deepspeed_config.zero3_save_16bit_model") == "true");
  CHECK(c.text("deepspeed_config.gradient_accumulation_steps") == "4");
  CHECK(c.text("deepspeed_config.gradient_clipping") == "0.5");  // the flag wins
  CHECK(c.text("mixed_precision") == "bf16");
  CHECK_THAT(c.notes.back(), Catch::Contains("optimizer, train_micro_batch_size_per_gpu are "
                                             "DeepSpeed's and not used by cxxlaunch"));
  CHECK(workerSettings(c, {}).at("CXXLAUNCH_STRATEGY") == "zero3");

  // "auto" leaves the default; the same setting in the YAML and the JSON is refused.
  write(dir, "auto.json",
        R"({"zero_optimization": {"stage": "auto"}, "bf16": {"enabled": "auto"}})");
  layers.file = write(dir, "c.yaml",
                      "distributed_type: DEEPSPEED\ndeepspeed_config:\n"
                      "  deepspeed_config_file: auto.json\n");
  layers.flags = {};
  CHECK(resolveConfig(layers).text("deepspeed_config.zero_stage") == "2");
  CHECK(errorOf("distributed_type: DEEPSPEED\nmixed_precision: fp16\ndeepspeed_config:\n"
                "  deepspeed_config_file: " +
                dir.path() + "/ds.json\n") ==
        "c.yaml:2:18: mixed_precision is set here and, as fp16/bf16 .enabled, in the DeepSpeed "
        "config file (" +
            dir.path() + "/ds.json:2:23); set it in one of them (accelerate refuses both too)");
}

TEST_CASE("A DeepSpeed config file that is missing, not JSON or malformed is one clear error",
          "[config][errors]") {
  TempDir dir;
  const std::string bad = write(dir, "bad.json", "{\"zero_optimization\": {\"stage\": 3");
  const std::string list = write(dir, "list.json", "[1, 2]");
  const std::string stage = write(dir, "stage.json", R"({"zero_optimization": {"stage": 7}})");
  const std::string nested = write(dir, "nested.json", R"({"gradient_clipping": {"max": 1}})");
  auto yaml = [](const std::string& file) {
    return "distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: " + file +
           "\n";
  };
  CHECK_THAT(errorOf(yaml(dir.path() + "/none.json")),
             Catch::StartsWith("c.yaml:3:26: ") && Catch::Contains("none.json") &&
                 Catch::Contains("relative paths are read from the current directory"));
  CHECK_THAT(errorOf(yaml(bad)),
             Catch::StartsWith(bad + ":1:") && Catch::Contains("not valid JSON"));
  CHECK(errorOf(yaml(list)) == list +
                                   ": a DeepSpeed config file is a JSON object, such as "
                                   "{\"zero_optimization\": {\"stage\": 3}}");
  CHECK(errorOf(yaml(stage)) == stage +
                                    ":1:33: deepspeed_config.zero_stage: 7 is out of range; "
                                    "use a whole number from 0 to 3");
  CHECK(errorOf(yaml(nested)) == nested +
                                     ":1:23: gradient_clipping must be a single value, not "
                                     "a mapping");
}

TEST_CASE("distributed_type, zero_stage and the sharding strategy map to CXXLAUNCH_STRATEGY",
          "[config]") {
  struct Case {
    std::string yaml, strategy, backend, offload_optimizer, offload_params, state_dict;
  };
  const std::vector<Case> cases = {
      {"distributed_type: NO\n", "ddp", "auto", "none", "none", "sharded"},
      {"distributed_type: MULTI_CPU\n", "ddp", "gloo", "none", "none", "sharded"},
      {"distributed_type: MULTI_GPU\nuse_cpu: true\n", "ddp", "gloo", "none", "none", "sharded"},
      {"distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 0\n", "ddp", "auto", "none",
       "none", "sharded"},
      {"distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 1\n", "zero1", "auto", "none",
       "none", "sharded"},
      {"distributed_type: DEEPSPEED\n", "zero2", "auto", "none", "none", "sharded"},
      {"distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n  "
       "offload_optimizer_device: cpu\n  offload_param_device: cpu\n",
       "zero3", "auto", "cpu", "cpu", "sharded"},
      {"distributed_type: FSDP\n", "fsdp_full_shard", "auto", "none", "none", "full"},
      {"distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: 2\n", "fsdp_shard_grad_op",
       "auto", "none", "none", "full"},
      {"distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: HYBRID_SHARD\n  "
       "fsdp_offload_params: true\n  fsdp_state_dict_type: SHARDED_STATE_DICT\n",
       "fsdp_hybrid_shard", "auto", "cpu", "cpu", "sharded"},
      {"distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: NO_SHARD\n",
       "fsdp_no_shard", "auto", "none", "none", "full"},
      {"distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: 5\n",
       "fsdp_hybrid_shard_zero2", "auto", "none", "none", "full"},
      {"distributed_type: FSDP\nfsdp_config:\n  fsdp_reshard_after_forward: false\n",
       "fsdp_shard_grad_op", "auto", "none", "none", "full"},
      {"distributed_type: MULTI_GPU\nfsdp_config:\n  fsdp_sharding_strategy: NO_SHARD\n", "ddp",
       "auto", "none", "none", "sharded"},
  };
  for (const auto& c : cases) {
    INFO(c.yaml);
    const auto env = workerSettings(parseConfigText(c.yaml, "c.yaml"), {});
    REQUIRE(env.at("CXXLAUNCH_STRATEGY") == c.strategy);
    REQUIRE(env.at("CXXLAUNCH_BACKEND") == c.backend);
    REQUIRE(env.at("CXXLAUNCH_OFFLOAD_OPTIMIZER") == c.offload_optimizer);
    REQUIRE(env.at("CXXLAUNCH_OFFLOAD_PARAMS") == c.offload_params);
    REQUIRE(env.at("CXXLAUNCH_STATE_DICT_TYPE") == c.state_dict);
  }
}

TEST_CASE("A worker variable set in the launcher's environment wins over the file, not a flag",
          "[config]") {
  Config c = parseConfigText("distributed_type: DEEPSPEED\n", "c.yaml");
  const Env env = {{"CXXLAUNCH_STRATEGY", "zero1"}};
  REQUIRE(workerSettings(c, env).at("CXXLAUNCH_STRATEGY") == "zero1");
  c.set("deepspeed_config.zero_stage", "3", {Origin::kFlag, "--zero_stage"});
  REQUIRE(workerSettings(c, env).at("CXXLAUNCH_STRATEGY") == "zero3");
}

TEST_CASE("cxxlaunch run takes the config file, and torchrun's flags win over it",
          "[config][cli]") {
  TempDir dir;
  const std::string file = write(dir, "c.yaml",
                                 "distributed_type: MULTI_GPU\nmixed_precision: bf16\n"
                                 "num_processes: 3\ngpu_ids: 0,2,3\ncxxlaunch:\n  max_restarts: 4\n"
                                 "  join_timeout: 7.5\n  log_dir: /tmp/logs\n");
  auto o = parseRunArgs({"--config_file", file, "/bin/true"}, host(4));
  REQUIRE(o.nproc_per_node == 3);
  REQUIRE(o.gpus == std::vector<int>{0, 2, 3});
  REQUIRE(o.max_restarts == 4);
  REQUIRE(o.rdzv.join_timeout.count() == 7500);
  REQUIRE(o.log_dir == "/tmp/logs");
  REQUIRE(o.worker_env.at("CXXLAUNCH_MIXED_PRECISION") == "bf16");
  REQUIRE(o.worker_env.at("CXXLAUNCH_STRATEGY") == "ddp");

  auto flags = parseRunArgs({"--config-file=" + file, "--max_restarts", "1", "--gpus", "1",
                             "--mixed-precision", "no", "--use_fsdp", "/bin/true"},
                            host(4));
  REQUIRE(flags.nproc_per_node == 1);
  REQUIRE(flags.gpus == std::vector<int>{1});
  REQUIRE(flags.max_restarts == 1);
  REQUIRE(flags.worker_env.at("CXXLAUNCH_MIXED_PRECISION") == "no");
  REQUIRE(flags.worker_env.at("CXXLAUNCH_STRATEGY") == "fsdp_full_shard");

  auto cpu =
      parseRunArgs({"--config_file", file, "--cpu", "--num_processes", "2", "/bin/true"}, host(4));
  REQUIRE(cpu.nproc_per_node == 2);
  REQUIRE(cpu.gpus.empty());
  REQUIRE(cpu.worker_env.at("CXXLAUNCH_BACKEND") == "gloo");
  REQUIRE(cpu.worker_env.at("CUDA_VISIBLE_DEVICES").empty());
}

TEST_CASE("Process counts that disagree: two flags are an error, a flag over the file a note",
          "[config][cli]") {
  REQUIRE_THROWS_WITH(
      parseRunArgs({"--num_processes", "3", "--nproc_per_node", "1", "/bin/true"}, host()),
      "--nproc_per_node 1 conflicts with --num_processes 3; give one of them");
  REQUIRE_THROWS_WITH(parseRunArgs({"--nproc-per-node=1", "--num-machines=2",
                                    "--main_process_ip=10.0.0.1", "--num-processes=4", "/bin/true"},
                                   host()),
                      "--nproc_per_node 1 conflicts with --num_processes 4 (2 per machine over 2 "
                      "machines); give one of them");
  CHECK(parseRunArgs({"--num_processes", "3", "--nproc_per_node", "3", "/bin/true"}, host())
            .config_notes.empty());

  TempDir dir;
  const std::string file = write(dir, "c.yaml", "distributed_type: MULTI_CPU\nnum_processes: 2\n");
  auto o = parseRunArgs({"--config_file", file, "--nproc_per_node", "3", "/bin/true"}, host());
  CHECK(o.nproc_per_node == 3);
  CHECK(o.config_notes == std::vector<std::string>{"--nproc_per_node 3 overrides num_processes 2 "
                                                   "from file " +
                                                   file + ":2:16"});
  auto env = parseRunArgs({"--nproc_per_node", "3", "/bin/true"}, [] {
    HostInfo h = host();
    h.env["CXXLAUNCH_NUM_PROCESSES"] = "2";
    return h;
  }());
  CHECK(env.config_notes == std::vector<std::string>{"--nproc_per_node 3 overrides num_processes 2 "
                                                     "from env CXXLAUNCH_NUM_PROCESSES"});
}

TEST_CASE("A multi-machine config maps to the static rendezvous at main_process_ip:port",
          "[config][cli]") {
  TempDir dir;
  const std::string file = write(dir, "c.yaml",
                                 "distributed_type: MULTI_GPU\nnum_machines: 2\nnum_processes: 8\n"
                                 "machine_rank: 1\nmain_process_ip: 10.1.2.3\n"
                                 "main_process_port: 29555\n");
  auto o = parseRunArgs({"--config_file", file, "/bin/true"}, host(4));
  REQUIRE(o.nproc_per_node == 4);
  REQUIRE(o.rdzv.min_nodes == 2);
  REQUIRE(o.rdzv.max_nodes == 2);
  REQUIRE(o.rdzv.node_rank == 1);
  REQUIRE(o.rdzv.backend == "static");
  REQUIRE(o.rdzv.endpoint == "10.1.2.3:29555");
  REQUIRE(o.run_id == "accelerate-10-1-2-3-29555");
  auto flags = parseRunArgs({"--config_file", file, "--node_rank", "0", "--rdzv_id", "mine",
                             "--nproc_per_node", "2", "/bin/true"},
                            host(4));
  REQUIRE(flags.rdzv.node_rank == 0);
  REQUIRE(flags.run_id == "mine");
  REQUIRE(flags.nproc_per_node == 2);
}

TEST_CASE("The default config file is used when no --config_file is given", "[config][cli]") {
  TempDir dir;
  HostInfo h = host();
  h.default_config =
      write(dir, "default_config.yaml", "distributed_type: MULTI_CPU\nnum_processes: 5\n");
  REQUIRE(parseRunArgs({"/bin/true"}, h).nproc_per_node == 5);
  h.default_config = dir.path() + "/missing.yaml";
  REQUIRE(parseRunArgs({"/bin/true"}, h).nproc_per_node == 1);
  h.env = {{"CXXLAUNCH_NUM_PROCESSES", "3"}};
  REQUIRE(parseRunArgs({"/bin/true"}, h).nproc_per_node == 3);
}

TEST_CASE("An unknown accelerate-style flag gets a suggestion", "[config][cli]") {
  REQUIRE_THROWS_WITH(parseRunArgs({"--num_proceses", "2", "/bin/true"}, host()),
                      "unknown flag '--num_proceses'; did you mean --num_processes? (see cxxlaunch "
                      "run --help)");
  REQUIRE_THROWS_WITH(parseRunArgs({"--zero_stage", "5", "/bin/true"}, host()),
                      "--zero_stage: deepspeed_config.zero_stage: 5 is out of range; use a whole "
                      "number from 0 to 3");
}

TEST_CASE("estimate-memory follows the ZeRO paper's formulas for cxxlaunch's layout",
          "[estimate]") {
  MemoryEstimateOptions o;
  o.params = 7.5e9;  // the paper's example: 7.5B parameters on 64 ranks
  o.ranks = 64;
  o.dtypes = {"bf16", "fp32"};
  std::map<std::string, std::pair<double, double>> got;
  for (const auto& row : estimateMemory(o)) {
    got[row.dtype + " " + row.strategy] = {row.gpu_bytes, row.cpu_bytes};
  }
  const double psi = 7.5e9, n = 64;
  // fp32: the paper's 4 + 4 + 8 bytes, sharded stage by stage.
  CHECK(got["fp32 ddp"].first == 16 * psi);
  CHECK(got["fp32 zero1"].first == (8 + 8 / n) * psi);
  CHECK(got["fp32 zero2"].first == (4 + 12 / n) * psi);
  CHECK(got["fp32 zero3"].first == 16 / n * psi);
  CHECK(got["fp32 zero3+offload+params"] == std::pair<double, double>{4 / n * psi, 12 / n * psi});
  // Mixed precision: 2-byte compute copies, fp32 masters and fp32 gradient shards (the paper's
  // fp16 gradients would be 2 bytes: DDP 16Ψ, ZeRO-1 31.41 GB, ZeRO-2 16.64 GB there).
  CHECK(got["bf16 ddp"].first == 20 * psi);
  CHECK(got["bf16 zero1"].first == (2 + 2 + 16 / n) * psi);
  CHECK(got["bf16 zero2"].first == (2 + 16 / n) * psi);
  CHECK(got["bf16 zero3"].first == 16 / n * psi);
  CHECK(got["bf16 zero2+offload"] == std::pair<double, double>{(2 + 8 / n) * psi, 8 / n * psi});
  CHECK(got["bf16 zero3+offload"] == std::pair<double, double>{8 / n * psi, 8 / n * psi});
  CHECK(got["bf16 zero3+offload+params"] == std::pair<double, double>{4 / n * psi, 12 / n * psi});
  // cpu offload: master, gradient shard and moments on the host, compute copies on the device.
  CHECK(got["bf16 zero2+cpu"] == std::pair<double, double>{2 * psi, 16 / n * psi});
  CHECK(got["fp32 zero3+cpu"] == std::pair<double, double>{4 / n * psi, 16 / n * psi});
  CHECK(got["bf16 zero3+cpu+params"] == std::pair<double, double>{0, 16 / n * psi});
  CHECK_THAT(formatEstimate(o), Catch::Contains("bf16   zero1                         31.88"));
  o.params = 1e6;  // small models in MB
  CHECK_THAT(formatEstimate(o), Catch::Contains("in MB") &&
                                    Catch::Contains("fp32   ddp                           16.00"));
}

TEST_CASE("estimate-memory reads a list of layer sizes", "[estimate]") {
  TempDir dir;
  const std::string file =
      write(dir, "layers.yaml", "layers:\n  - 1000\n  - {name: big, params: 3e3}\n  - 500\n");
  auto o = parseEstimateArgs({"--config", file, "--num_processes", "2", "--dtypes", "fp32"});
  REQUIRE(o.params == 4500);
  REQUIRE(o.largest_layer == 3000);
  REQUIRE(estimateMemory(o).front().gpu_bytes == 16 * 4500);
  REQUIRE_THROWS_WITH(parseEstimateArgs({"--dtypes", "int3", "--params", "1"}),
                      "--dtypes: 'int3' is not fp32, bf16 or fp16");
  REQUIRE_THROWS_WITH(parseEstimateArgs({"--num_processes", "2"}),
                      "give the model size: --params 7e9, or --config layers.yaml");
  // Numbers past int and paths that are not files: one clear error, not undefined behaviour or
  // a hang.
  REQUIRE_THROWS_WITH(parseEstimateArgs({"--params", "1", "--num_processes", "1e30"}),
                      Catch::Contains("is not a whole number from 1 to 16777216"));
  REQUIRE_THROWS_WITH(parseEstimateArgs({"--config", "/dev/zero"}),
                      Catch::Contains("not a regular file"));
  REQUIRE_THROWS_WITH(parseEstimateArgs({"--config", dir.path()}),
                      Catch::Contains("is a directory"));
}

TEST_CASE("docs/config.md names every key with its default, flag and variable", "[config][docs]") {
  std::ifstream in(CONFIG_DOC);
  REQUIRE(in.good());
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const auto& spec : configSchema()) {
    INFO(spec.key);
    std::string row = "| `" + spec.key + "` |";
    const auto at = doc.find(row);
    REQUIRE(at != std::string::npos);
    const std::string line = doc.substr(at, doc.find('\n', at) - at);
    if (!spec.default_value.empty())
      REQUIRE_THAT(line, Catch::Contains("`" + spec.default_value + "`"));
    if (!spec.flag.empty()) REQUIRE_THAT(line, Catch::Contains("`--" + spec.flag + "`"));
    if (!spec.env.empty()) REQUIRE_THAT(line, Catch::Contains("`" + spec.env + "`"));
  }
}
