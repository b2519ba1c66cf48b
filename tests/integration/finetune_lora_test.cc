// finetune with LoRA (docs/finetune.md, "LoRA") in real processes at world 2: every strategy
// trains the adapters as DDP does (the same loss lines), the base stays as it was, the export is
// PEFT's layout (checked by lora_reference.py, plain PyTorch), `--adapter` evaluates it to the
// training run's last figure and trains it further, a killed run resumes bit for bit, and the
// bad input is one error line, exit 2, nothing written. The model is finetune_fixture.h's.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "integration/finetune_fixture.h"
#include "support/subprocess.h"

using namespace cxxlaunch::testing;
using namespace cxxlaunch::testing::finetune;
namespace fs = std::filesystem;

namespace {

const Args kLora = {"--lora_r", "4", "--lora_alpha", "16", "--lora_target_modules", "all-linear"};

// finetune_fixture.h's finetuneArgs at LoRA's learning rate: the adapters start at zero and learn
// slower than the full model does at the same rate.
Args tuneArgs(const std::string& model, const std::string& data, int steps,
              const std::string& out) {
  Args args = cxxlaunch::testing::finetune::finetuneArgs(model, data, steps, out);
  *std::find(args.begin(), args.end(), "3e-3") = "1e-2";
  return args;
}

Args loraArgs(const std::string& model, const std::string& data, int steps, const std::string& out,
              const Args& lora = kLora) {
  Args args = tuneArgs(model, data, steps, out);
  args.insert(args.end(), lora.begin(), lora.end());
  return args;
}

// The "step N/M  loss X" lines' figures, in order.
std::vector<std::string> lossLines(const std::string& out) {
  std::vector<std::string> losses;
  const std::regex line(R"(step +[0-9]+/[0-9]+  loss ([0-9.]+))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator();
       ++it) {
    losses.push_back((*it)[1]);
  }
  return losses;
}

// Every file of `dir` (not its folders) and its bytes.
std::map<std::string, std::string> filesOf(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file()) files[entry.path().filename()] = readFile(entry.path());
  }
  return files;
}

nlohmann::json safetensorsHeader(const std::string& path) {
  const std::string bytes = readFile(path);
  REQUIRE(bytes.size() >= 8);
  uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  return nlohmann::json::parse(bytes.substr(8, length));
}

// Every tensor of the safetensors file `path` (name -> its raw bytes).
std::map<std::string, std::string> tensorBytes(const std::string& path) {
  const std::string bytes = readFile(path);
  const auto header = safetensorsHeader(path);
  uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  std::map<std::string, std::string> tensors;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    const auto begin = info["data_offsets"][0].get<size_t>();
    const auto end = info["data_offsets"][1].get<size_t>();
    tensors[name] = bytes.substr(8 + length + begin, end - begin);
  }
  return tensors;
}

const std::map<std::string, std::string> kStrategies = {
    {"ddp", "distributed_type: MULTI_GPU\n"},
    {"zero2", "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n"},
    {"zero3",
     "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n  zero3_init_flag: true\n"},
    {"fsdp",
     "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n"
     "  fsdp_cpu_ram_efficient_loading: true\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
     "  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer\n"}};

}  // namespace

TEST_CASE(
    "finetune's LoRA trains alike in every strategy, leaves the base alone, and writes PEFT's "
    "adapter",
    "[finetune][integration][lora]") {
  TempDir dir;
  const std::string model = fixture(dir, "model", {});
  const std::string text = writeText(dir, 150);
  const auto base_files = filesOf(model);
  std::map<std::string, std::vector<std::string>> losses;
  std::map<std::string, std::vector<double>> evals;
  for (const auto& [name, body] : kStrategies) {
    INFO(name);
    const std::string out = dir.path() + "/out-" + name;
    const std::string frozen = dir.path() + "/frozen-" + name + ".safetensors";
    const Finished trained = launch(writeConfig(dir, name, body), loraArgs(model, text, 4, out),
                                    {{"CXXLAUNCH_FINETUNE_DUMP_FROZEN", frozen}});
    INFO(trained.out << trained.err);
    REQUIRE(trained.exit_code == 0);
    // The frozen weights in memory after training (the test hook's dump) are the base's bytes.
    const auto after = tensorBytes(frozen), before = tensorBytes(model + "/model.safetensors");
    CHECK(after.size() == before.size());
    CHECK(after == before);
    CHECK_THAT(trained.out, Catch::Contains("LoRA r 4 alpha 16 (scale 4) dropout 0 on all-linear "
                                            "in 14 modules: 8192 trainable parameters"));
    losses[name] = lossLines(trained.out);
    evals[name] = evalLosses(trained.out);
    REQUIRE(losses[name].size() == 4);
    REQUIRE(evals[name].size() == 2);              // before and after; no read-back
    CHECK(evals[name][1] < evals[name][0] - 0.3);  // the adapters learn the sentence
    // PEFT's files, and no model: no config.json, no model weights.
    CHECK(fs::exists(out + "/adapter_config.json"));
    CHECK_FALSE(fs::exists(out + "/config.json"));
    CHECK_FALSE(fs::exists(out + "/model.safetensors"));
    CHECK_FALSE(fs::exists(out + "/.export.partial"));
    const auto header = safetensorsHeader(out + "/adapter_model.safetensors");
    CHECK(header.size() == 28 + header.count("__metadata__"));
    const auto& a = header["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"];
    CHECK(a["dtype"] == "F32");
    CHECK(a["shape"] == nlohmann::json({4, 128}));
    CHECK(header["base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"]["shape"] ==
          nlohmann::json({32, 4}));
    const auto config = nlohmann::json::parse(readFile(out + "/adapter_config.json"));
    CHECK(config["peft_type"] == "LORA");
    CHECK(config["task_type"] == "CAUSAL_LM");
    CHECK(config["r"] == 4);
    CHECK(config["lora_alpha"] == 16.0);
    CHECK(config["bias"] == "none");
    CHECK(config["modules_to_save"].is_null());
    CHECK(config["base_model_name_or_path"] == fs::absolute(model).string());
    CHECK(config["target_modules"] == nlohmann::json({"down_proj", "gate_proj", "k_proj", "o_proj",
                                                      "q_proj", "up_proj", "v_proj"}));
    // The plain-PyTorch reader takes it onto the base: PEFT's keys, shapes and targets, and
    // trained (B no longer zero).
    const Finished reference =
        run({SYSTEM_PYTHON, LORA_REFERENCE, "--check-only", model, out}, {}, 60s);
    INFO(reference.out << reference.err);
    CHECK(reference.exit_code == 0);
  }
  // The same fp32 arithmetic, sharded or not: DDP's loss lines to the printed digit.
  for (const auto& [name, body] : kStrategies) {
    INFO(name);
    CHECK(losses[name] == losses["ddp"]);
    CHECK(evals[name][1] == Approx(evals["ddp"][1]).margin(1e-4));
  }
  // The base folder is untouched, and the adapter on it evaluates to the very figure of the run's
  // last evaluation.
  CHECK(filesOf(model) == base_files);
  for (const auto& [name, body] : kStrategies) {
    INFO(name);
    const std::string out = dir.path() + "/out-" + name;
    Args eval = tuneArgs(model, text, 0, "");
    eval.insert(eval.end(), {"--adapter", out});
    const Finished evaluated = launch(writeConfig(dir, name, body), eval);
    INFO(evaluated.out << evaluated.err);
    REQUIRE(evaluated.exit_code == 0);
    CHECK_THAT(evaluated.out, Catch::Contains("from " + out));
    const auto figures = evalLosses(evaluated.out);
    REQUIRE(figures.size() == 1);
    CHECK(figures[0] == evals[name][1]);
  }
  // Trained further: it starts where the first run ended, and writes an adapter again.
  const std::string further = dir.path() + "/further";
  Args more = tuneArgs(model, text, 2, further);
  more.insert(more.end(), {"--adapter", dir.path() + "/out-ddp"});
  const Finished continued = launch(writeConfig(dir, "ddp", kStrategies.at("ddp")), more);
  INFO(continued.out << continued.err);
  REQUIRE(continued.exit_code == 0);
  const auto figures = evalLosses(continued.out);
  REQUIRE(figures.size() == 2);
  CHECK(figures[0] == evals["ddp"][1]);
  CHECK(fs::exists(further + "/adapter_model.safetensors"));
}

TEST_CASE("finetune's LoRA run killed after a save resumes and ends bit for bit",
          "[finetune][integration][lora][resume]") {
  TempDir dir;
  const std::string model = fixture(dir, "model", {});
  const std::string text = writeText(dir, 150);
  const Args extra = {"--save_steps",
                      "2",
                      "--lora_r",
                      "4",
                      "--lora_target_modules",
                      "q_proj,v_proj,down_proj",
                      "--lora_dropout",
                      "0.1",
                      "--weight_decay",
                      "0.1"};
  for (const std::string name : {"ddp", "zero3"}) {
    INFO(name);
    const std::string config = writeConfig(dir, name, kStrategies.at(name));
    const std::string whole = dir.path() + "/whole-" + name, cut = dir.path() + "/cut-" + name;
    Args command = tuneArgs(model, text, 5, whole);
    command.insert(command.end(), extra.begin(), extra.end());
    const Finished a = launch(config, command);
    INFO(a.out << a.err);
    REQUIRE(a.exit_code == 0);
    command = tuneArgs(model, text, 5, cut);
    command.insert(command.end(), extra.begin(), extra.end());
    const Finished killed = launch(config, command, {{"CXXLAUNCH_FINETUNE_CRASH_AFTER_STEP", "3"}});
    INFO(killed.out << killed.err);
    REQUIRE(killed.exit_code != 0);
    CHECK_FALSE(fs::exists(cut + "/adapter_config.json"));
    const Finished b = launch(config, command, {{"CXXLAUNCH_FINETUNE_CRASH_AFTER_STEP", "3"}});
    INFO(b.out << b.err);
    REQUIRE(b.exit_code == 0);
    CHECK_THAT(b.out, Catch::Contains("resumed from " + cut + "/checkpoint-2 at step 2"));
    CHECK(readFile(cut + "/adapter_model.safetensors") ==
          readFile(whole + "/adapter_model.safetensors"));
    const auto in_a = lossLines(a.out), in_b = lossLines(b.out);
    REQUIRE(in_a.size() == 5);
    REQUIRE(in_b.size() == 3);
    CHECK(std::vector<std::string>(in_a.begin() + 2, in_a.end()) == in_b);
    // Finished: the same command again is refused.
    const Finished again = launch(config, command);
    CHECK(again.exit_code == 2);
    CHECK_THAT(again.out + again.err, Catch::Contains("already holds a LoRA adapter"));
    // The checkpoints hold the adapters and their optimizer state, not the frozen base: smaller
    // than the base's weights, and not a model merge-weights could write.
    CHECK(fs::file_size(cut + "/checkpoint-4/rank0.bin") +
              fs::file_size(cut + "/checkpoint-4/rank1.bin") <
          fs::file_size(model + "/model.safetensors") / 4);
    const Finished merged =
        run({CXXLAUNCH_BIN, "merge-weights", cut + "/checkpoint-4", dir.path() + "/merged"});
    CHECK(merged.exit_code == 2);
    CHECK_THAT(merged.err, Catch::Contains("merge-weights --lora ADAPTER --base " + model));
    CHECK_FALSE(fs::exists(dir.path() + "/merged"));
  }
}

TEST_CASE("finetune refuses bad LoRA input with one error line, exit 2 and nothing written",
          "[finetune][integration][lora]") {
  TempDir dir;
  const std::string model = fixture(dir, "model", {});
  const std::string other = fixture(dir, "other", {"--intermediate_size", "96"});
  const std::string text = writeText(dir, 60);
  // An adapter of `model` to load where it does not belong.
  const std::string adapter = dir.path() + "/adapter";
  const std::string project = dir.path() + "/runs";
  Args make = loraArgs(model, text, 1, adapter);
  make.insert(make.end(), {"--run_name", "lora"});
  const Finished made =
      run(make, {{"CXXLAUNCH_LOG_WITH", "jsonl"}, {"CXXLAUNCH_PROJECT_DIR", project}}, 60s);
  INFO(made.out << made.err);
  REQUIRE(made.exit_code == 0);
  // The trackers get the LoRA settings under PEFT's names.
  const auto tracked = nlohmann::json::parse(readFile(project + "/lora/config.json"));
  CHECK(tracked["lora_r"] == 4);
  CHECK(tracked["lora_target_modules"] == "all-linear");
  const std::string out = dir.path() + "/out";
  const std::vector<std::pair<Args, std::string>> cases = {
      {{"--lora_r", "4", "--lora_target_modules", "q_proj,qkv_proj"},
       "--lora_target_modules: 'qkv_proj' matches no Linear module of the model; its Linear "
       "modules are down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj"},
      {{"--lora_r", "33", "--lora_target_modules", "k_proj"},
       "--lora_r 33 is larger than 'model.layers.0.self_attn.k_proj' (32 x 64): give at most 32"},
      {{"--lora_r", "-1"}, "--lora_r must be 0 (no LoRA) or more"},
      {{"--lora_alpha", "16"},
       "--lora_alpha, --lora_dropout, --lora_target_modules and --use_rslora need --lora_r > 0"},
      {{"--lora_r", "4", "--lora_alpha", "0"}, "--lora_alpha must be a finite number > 0"},
      {{"--lora_r", "4", "--lora_dropout", "1"}, "--lora_dropout must be in [0, 1) (got 1)"},
      {{"--adapter", adapter, "--lora_r", "0"},
       "--adapter trains or evaluates a LoRA adapter and --lora_r 0 asks for a full fine-tune"},
      {{"--adapter", adapter, "--lora_r", "8"},
       "--adapter's adapter_config.json sets r, lora_alpha, lora_dropout, target_modules and "
       "use_rslora: drop the --lora_* and --use_rslora flags"},
      {{"--adapter", model}, "--adapter '" + model + "' is not a PEFT adapter folder"},
  };
  for (const auto& [extra, said] : cases) {
    Args argv = tuneArgs(model, text, 1, out);
    argv.insert(argv.end(), extra.begin(), extra.end());
    const Finished f = run(argv, {}, 60s);
    INFO(f.out << f.err);
    CHECK(f.exit_code == 2);
    CHECK_THAT(f.err, Catch::Contains("error: " + said));
    CHECK_FALSE(fs::exists(out));
  }
  // An adapter on another base: the shapes named.
  Args argv = tuneArgs(other, text, 1, out);
  argv.insert(argv.end(), {"--adapter", adapter});
  const Finished f = run(argv, {}, 60s);
  INFO(f.out << f.err);
  CHECK(f.exit_code == 2);
  CHECK_THAT(f.err, Catch::Contains("is not an adapter of this model") &&
                        Catch::Contains("mlp.down_proj.lora_A.weight is [4, 128] where the "
                                        "model's is [4, 96]"));
  CHECK_FALSE(fs::exists(out));
}
