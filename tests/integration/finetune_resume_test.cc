// finetune with HF Trainer's recipe and its checkpoints, in real processes (docs/finetune.md):
// the schedule's lr at each step, the epochs, the weight-decay groups, the flags against the
// launch's YAML, and a run killed after a save that, run again with the same command (or
// restarted by the launcher), ends with the very bytes of an uninterrupted run under DDP, ZeRO-3
// and FSDP. The model is finetune_fixture.h's tiny one; every run takes a few steps.

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

// finetune's flags with Trainer's names, nothing else set but what the tests need.
Args recipeArgs(const std::string& model, const std::string& data, const std::string& out,
                const Args& extra) {
  Args args = {FINETUNE_BIN, "--model_dir",     model, "--data",
               data,         "--seq_len",       "32",  "--per_device_train_batch_size",
               "4",          "--logging_steps", "1"};
  if (!out.empty()) args.insert(args.end(), {"--output_dir", out});
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// The "lr X" of each "step N/M" line, by step.
std::map<int, std::string> printedLrs(const std::string& out) {
  std::map<int, std::string> lrs;
  const std::regex line(R"(step +([0-9]+)/[0-9]+  loss [0-9.]+(?: \([^)]*\))?  lr ([-+.e0-9]+))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator();
       ++it) {
    lrs[std::stoi((*it)[1])] = (*it)[2];
  }
  return lrs;
}

// The raw bytes of tensor `name` in the safetensors file `path`.
std::string tensorBytes(const std::string& path, const std::string& name) {
  const std::string bytes = readFile(path);
  REQUIRE(bytes.size() >= 8);
  uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  const auto header = nlohmann::json::parse(bytes.substr(8, length));
  INFO(name);
  REQUIRE(header.contains(name));
  const auto offsets = header[name]["data_offsets"];
  const auto begin = offsets[0].get<size_t>(), end = offsets[1].get<size_t>();
  return bytes.substr(8 + length + begin, end - begin);
}

const char* kHookEnv = "CXXLAUNCH_FINETUNE_CRASH_AFTER_STEP";

}  // namespace

TEST_CASE("finetune's lr follows Trainer's schedules, warmup_steps winning over warmup_ratio",
          "[finetune][integration][recipe]") {
  TempDir dir;
  const std::string model = fixture(dir, "model", {});
  const std::string text = writeText(dir, 150);
  // 4 steps, 2 of warmup, a peak of 1e-3: the lr logged after each step, as Trainer logs it
  // (the schedule's after its step).
  using Lrs = std::map<int, std::string>;
  const std::vector<std::pair<Args, Lrs>> cases = {
      {{"--lr_scheduler_type", "linear", "--warmup_steps", "2"},
       {{1, "5.00e-04"}, {2, "1.00e-03"}, {3, "5.00e-04"}, {4, "0.00e+00"}}},
      {{"--lr_scheduler_type", "cosine", "--warmup_ratio", "0.5"},
       {{1, "5.00e-04"}, {2, "1.00e-03"}, {3, "5.00e-04"}, {4, "0.00e+00"}}},
      {{"--lr_scheduler_type", "constant_with_warmup", "--warmup_steps", "2"},
       {{1, "5.00e-04"}, {2, "1.00e-03"}, {3, "1.00e-03"}, {4, "1.00e-03"}}},
      {{"--lr_scheduler_type", "constant", "--warmup_steps", "2"},  // no warmup in Trainer
       {{1, "1.00e-03"}, {2, "1.00e-03"}, {3, "1.00e-03"}, {4, "1.00e-03"}}},
      // warmup_steps 1 wins over warmup_ratio 0.5; linear: (4 - s) / 3 after it.
      {{"--warmup_steps", "1", "--warmup_ratio", "0.5"},
       {{1, "1.00e-03"}, {2, "6.67e-04"}, {3, "3.33e-04"}, {4, "0.00e+00"}}},
  };
  for (const auto& [flags, expected] : cases) {
    Args extra = {"--max_steps", "4", "--learning_rate", "1e-3", "--save_steps", "0"};
    extra.insert(extra.end(), flags.begin(), flags.end());
    const Finished done = run(recipeArgs(model, text, dir.path() + "/out", extra), {}, 60s);
    INFO(done.out << done.err);
    REQUIRE(done.exit_code == 0);
    CHECK(printedLrs(done.out) == expected);
    fs::remove_all(dir.path() + "/out");
  }
  // --eval_steps: an evaluation every that many steps besides before and after training.
  const Finished evaluated = run(recipeArgs(model, text, dir.path() + "/out",
                                            {"--max_steps", "4", "--eval_steps", "2",
                                             "--save_steps", "0", "--logging_steps", "4"}),
                                 {}, 60s);
  INFO(evaluated.out << evaluated.err);
  REQUIRE(evaluated.exit_code == 0);
  CHECK(evalLosses(evaluated.out).size() == 4);  // before, at step 2, after, read back
  CHECK_THAT(evaluated.out,
             Catch::Contains("(at step 2; fp32 compute)") && !Catch::Contains("(at step 4;"));
}

TEST_CASE("finetune counts its steps from the epochs as Trainer does, and --max_steps wins",
          "[finetune][integration][recipe]") {
  TempDir dir;
  const std::string model = fixture(dir, "model", {});
  const std::string text = writeText(dir, 150);  // 189 blocks of 32 to train on
  // batch 4, 1 process: 48 batches an epoch; accumulation 5: 48 / 5 = 9 steps an epoch.
  const std::vector<std::pair<Args, std::string>> cases = {
      {{"--num_train_epochs", "0.5"}, "24 optimizer steps"},
      {{"--num_train_epochs", "1", "--gradient_accumulation_steps", "5"}, "9 optimizer steps"},
      {{"--num_train_epochs", "0.5", "--max_steps", "3"}, "3 optimizer steps"},
  };
  for (const auto& [flags, said] : cases) {
    Args extra = {"--save_steps", "0", "--logging_steps", "100"};
    extra.insert(extra.end(), flags.begin(), flags.end());
    const Finished done = run(recipeArgs(model, text, dir.path() + "/out", extra), {}, 120s);
    INFO(done.out << done.err);
    REQUIRE(done.exit_code == 0);
    CHECK_THAT(done.out, Catch::Contains(said));
    fs::remove_all(dir.path() + "/out");
  }
}

// One step from the same weights and the same batch: AdamW's update is the same whatever the
// decay, so a parameter that does not decay ends with the same bytes at weight decay 0 and 0.5,
// and one that decays does not.
TEST_CASE("finetune's weight decay skips biases and norm weights, as Trainer groups them",
          "[finetune][integration][recipe]") {
  TempDir dir;
  const std::string model = fixture(dir, "qwen", {"--model_type", "qwen2"});  // q/k/v biases
  const std::string text = writeText(dir, 150);
  std::vector<std::string> exports;
  for (const char* decay : {"0", "0.5"}) {
    const std::string out = dir.path() + "/out-" + decay;
    const Finished done =
        run(recipeArgs(model, text, out,
                       {"--max_steps", "1", "--learning_rate", "1e-2", "--weight_decay", decay,
                        "--lr_scheduler_type", "constant", "--save_steps", "0"}),
            {}, 60s);
    INFO(done.out << done.err);
    REQUIRE(done.exit_code == 0);
    exports.push_back(out + "/model.safetensors");
  }
  for (const char* name :
       {"model.norm.weight", "model.layers.0.input_layernorm.weight",
        "model.layers.1.post_attention_layernorm.weight", "model.layers.0.self_attn.q_proj.bias"}) {
    INFO(name);
    CHECK(tensorBytes(exports[0], name) == tensorBytes(exports[1], name));
  }
  for (const char* name : {"model.layers.0.self_attn.q_proj.weight", "lm_head.weight",
                           "model.embed_tokens.weight", "model.layers.1.mlp.down_proj.weight"}) {
    INFO(name);
    CHECK(tensorBytes(exports[0], name) != tensorBytes(exports[1], name));
  }
}

TEST_CASE("finetune settles accumulation and clipping between its flags and the launch's YAML",
          "[finetune][integration][recipe]") {
  TempDir dir;
  const std::string model = fixture(dir, "model", {});
  const std::string text = writeText(dir, 150);
  const std::string yaml = writeConfig(dir, "ds",
                                       "distributed_type: DEEPSPEED\n"
                                       "deepspeed_config:\n"
                                       "  zero_stage: 2\n"
                                       "  gradient_accumulation_steps: 2\n"
                                       "  gradient_clipping: 0.5\n");
  const std::string out = dir.path() + "/out";
  const Args base = {"--max_steps", "1", "--save_steps", "0"};
  // Not given: the YAML's.
  Finished done = launch(yaml, recipeArgs(model, text, out, base));
  INFO(done.out << done.err);
  REQUIRE(done.exit_code == 0);
  CHECK_THAT(done.out,
             Catch::Contains("x 2 accumulation steps") && Catch::Contains("max grad norm 0.5"));
  fs::remove_all(out);
  // Given alike: fine; given otherwise: one error line, nothing written.
  Args same = base;
  same.insert(same.end(), {"--gradient_accumulation_steps", "2", "--max_grad_norm", "0.5"});
  done = launch(yaml, recipeArgs(model, text, out, same));
  CHECK(done.exit_code == 0);
  fs::remove_all(out);
  for (const auto& [flag, value, said] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"--gradient_accumulation_steps", "4",
            "--gradient_accumulation_steps 4 disagrees with the launch's "
            "gradient_accumulation_steps 2"},
           {"--max_grad_norm", "1",
            "--max_grad_norm 1 disagrees with the launch's gradient_clipping 0.5"}}) {
    Args other = base;
    other.insert(other.end(), {flag, value});
    done = launch(yaml, recipeArgs(model, text, out, other));
    INFO(done.out << done.err);
    CHECK(done.exit_code == 2);
    CHECK_THAT(done.out + done.err, Catch::Contains("error: " + said));
    CHECK_FALSE(fs::exists(out));
  }
  // Without YAML values: Trainer's defaults (1 step of accumulation, clipping at 1.0).
  done = run(recipeArgs(model, text, out, base), {}, 60s);
  CHECK(done.exit_code == 0);
  CHECK_THAT(done.out,
             Catch::Contains("x 1 accumulation steps") && Catch::Contains("max grad norm 1)"));
}

// (a) an uninterrupted run; (b) the same command with the crash hook: the last rank exits after
// step 3, whose save is step 2's, and the same command again resumes there. The bytes of the
// export and the loss lines after the resume are (a)'s.
TEST_CASE("finetune killed after a save resumes with the same command and ends bit for bit",
          "[finetune][integration][resume]") {
  TempDir dir;
  const std::string model = fixture(dir, "model", {});
  const std::string text = writeText(dir, 150);
  const Args recipe = {"--max_steps",    "5", "--save_steps",   "2",   "--learning_rate",    "3e-3",
                       "--warmup_steps", "1", "--weight_decay", "0.1", "--save_total_limit", "2"};
  for (const auto& [name, body] : std::vector<std::pair<std::string, std::string>>{
           {"ddp", "distributed_type: MULTI_GPU\n"},
           {"zero3",
            "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n"
            "  zero3_init_flag: true\n"},
           {"fsdp",
            "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n"
            "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
            "  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer\n"}}) {
    INFO(name);
    const std::string config = writeConfig(dir, name, body);
    const std::string whole = dir.path() + "/whole-" + name, cut = dir.path() + "/cut-" + name;
    const Finished a = launch(config, recipeArgs(model, text, whole, recipe));
    INFO(a.out << a.err);
    REQUIRE(a.exit_code == 0);
    const Args command = recipeArgs(model, text, cut, recipe);
    const Finished killed = launch(config, command, {{kHookEnv, "3"}});
    INFO(killed.out << killed.err);
    REQUIRE(killed.exit_code != 0);
    CHECK_THAT(killed.out, Catch::Contains("saved " + cut + "/checkpoint-2 ("));
    CHECK_FALSE(fs::exists(cut + "/config.json"));  // no export
    const Finished b = launch(config, command, {{kHookEnv, "3"}});
    INFO(b.out << b.err);
    REQUIRE(b.exit_code == 0);
    CHECK_THAT(b.out, Catch::Contains("resumed from " + cut + "/checkpoint-2 at step 2"));
    CHECK(readFile(cut + "/model.safetensors") == readFile(whole + "/model.safetensors"));
    for (int step = 3; step <= 5; ++step) {
      const std::regex loss("step +" + std::to_string(step) + "/5  loss ([0-9.]+)");
      std::smatch in_a, in_b;
      REQUIRE(std::regex_search(a.out, in_a, loss));
      REQUIRE(std::regex_search(b.out, in_b, loss));
      CHECK(in_a[1] == in_b[1]);
    }
    // Trainer's place and names, the newest --save_total_limit kept (the last step's included).
    CHECK(fs::exists(cut + "/checkpoint-5/manifest"));
    CHECK(fs::exists(cut + "/checkpoint-4/manifest"));
    CHECK_FALSE(fs::exists(cut + "/checkpoint-2"));
    CHECK_FALSE(fs::exists(cut + "/.export.partial"));
    // Finished: the same command again is refused, and changes nothing.
    const Finished again = launch(config, command);
    CHECK(again.exit_code == 2);
    CHECK_THAT(again.out + again.err, Catch::Contains("already holds a fine-tuned model"));
  }
}

TEST_CASE("finetune restarted by the launcher's --max_restarts resumes by itself",
          "[finetune][integration][resume]") {
  TempDir dir;
  const std::string model = fixture(dir, "model", {});
  const std::string text = writeText(dir, 150);
  const std::string config = writeConfig(dir, "ddp", "distributed_type: MULTI_GPU\n");
  const Args recipe = {"--max_steps", "4", "--save_steps", "2", "--learning_rate", "3e-3"};
  const std::string whole = dir.path() + "/whole", restarted = dir.path() + "/restarted";
  const Finished a = launch(config, recipeArgs(model, text, whole, recipe));
  REQUIRE(a.exit_code == 0);
  const Finished b = launch(config, recipeArgs(model, text, restarted, recipe), {{kHookEnv, "3"}},
                            {"--max_restarts", "1"});
  INFO(b.out << b.err);
  REQUIRE(b.exit_code == 0);
  CHECK_THAT(b.out, Catch::Contains("resumed from " + restarted + "/checkpoint-2 at step 2"));
  CHECK(readFile(restarted + "/model.safetensors") == readFile(whole + "/model.safetensors"));
}

TEST_CASE("finetune --resume_from_checkpoint takes a path or the latest, and latest requires one",
          "[finetune][integration][resume]") {
  TempDir dir;
  const std::string model = fixture(dir, "model", {});
  const std::string text = writeText(dir, 150);
  const std::string out = dir.path() + "/out";
  const Args recipe = {"--max_steps", "4", "--save_steps", "1", "--learning_rate", "3e-3"};
  Args latest = recipe;
  latest.insert(latest.end(), {"--resume_from_checkpoint", "latest"});
  Finished done = run(recipeArgs(model, text, out, latest), {}, 60s);
  CHECK(done.exit_code == 2);
  CHECK_THAT(done.err, Catch::Contains("error: --resume_from_checkpoint latest: there is no "
                                       "checkpoint in '" +
                                       out + "'"));
  CHECK_FALSE(fs::exists(out + "/config.json"));

  done = run(recipeArgs(model, text, out, recipe), {{kHookEnv, "3"}}, 60s);
  REQUIRE(done.exit_code == 3);
  // A path: that checkpoint, not the newest.
  Args path = recipe;
  path.insert(path.end(), {"--resume_from_checkpoint", out + "/checkpoint-1"});
  done = run(recipeArgs(model, text, out, path), {}, 60s);
  INFO(done.out << done.err);
  REQUIRE(done.exit_code == 0);
  CHECK_THAT(done.out, Catch::Contains("resumed from " + out + "/checkpoint-1 at step 1"));
  Args missing = recipe;
  missing.insert(missing.end(), {"--resume_from_checkpoint", dir.path() + "/nowhere"});
  done = run(recipeArgs(model, text, dir.path() + "/other", missing), {}, 60s);
  CHECK(done.exit_code == 2);
  CHECK_THAT(done.err, Catch::Contains("no such checkpoint"));
}

TEST_CASE("finetune's OUT may hold its checkpoints, never a finished model or foreign files",
          "[finetune][integration][resume]") {
  TempDir dir;
  const std::string model = fixture(dir, "model", {});
  const std::string text = writeText(dir, 150);
  const Args recipe = {"--max_steps", "2", "--save_steps", "0"};
  const std::string foreign = dir.path() + "/foreign";
  fs::create_directories(foreign);
  std::ofstream(foreign + "/notes.txt") << "mine\n";
  Finished done = run(recipeArgs(model, text, foreign, recipe), {}, 60s);
  CHECK(done.exit_code == 2);
  CHECK_THAT(done.err, Catch::Contains("holds 'notes.txt', which is not this program's"));
  CHECK(fs::exists(foreign + "/notes.txt"));
  CHECK_FALSE(fs::exists(foreign + "/config.json"));
  // An export cut short before its config.json: its files are replaced by the new export.
  const std::string cut = dir.path() + "/cut";
  fs::create_directories(cut + "/.export.partial");
  std::ofstream(cut + "/model-00001-of-00002.safetensors") << "half";
  done = run(recipeArgs(model, text, cut, recipe), {}, 60s);
  INFO(done.out << done.err);
  REQUIRE(done.exit_code == 0);
  CHECK(fs::exists(cut + "/model.safetensors"));
  CHECK_FALSE(fs::exists(cut + "/model-00001-of-00002.safetensors"));
  CHECK_FALSE(fs::exists(cut + "/.export.partial"));
}
