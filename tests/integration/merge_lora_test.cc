// `cxxlaunch merge-weights --lora ADAPTER --base MODEL OUTPUT`, the real binary: small base model
// folders (fp32 in one file, bf16 sharded with an index, fp16) and adapters in PEFT's layout,
// written here with the torch-free safetensors writer, are merged, and every merged tensor is
// checked by an independent computation in Python (lora_merge_reference.py, Debian's
// python3-torch): targeted weights rounded once from the exact W + scale * B A, within one unit
// of the dtype of torch's float32 result; every other tensor byte for byte the base's. Bad input
// is one line, exit 2, and nothing written.

#include "tensorfile/merge_lora.h"

#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "support/subprocess.h"
#include "tensorfile/merge_weights.h"
#include "tensorfile/safetensors_file.h"

using cxxlaunch::testing::Finished;
using cxxlaunch::testing::readFile;
using cxxlaunch::testing::TempDir;
namespace ckpt = cxxlaunch::tensorfile;
namespace fs = std::filesystem;

namespace {

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// `count` values uniform in [-range, range), from `seed`.
std::vector<float> randomValues(size_t count, float range, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-range, range);
  std::vector<float> v(count);
  for (float& x : v) x = dist(gen);
  return v;
}

Tensor randomTensor(const std::string& name, std::vector<int64_t> shape, float range,
                    uint32_t seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return {name, shape, randomValues(static_cast<size_t>(n), range, seed)};
}

// One safetensors file of `tensors` in `dtype` (F32, BF16, F16: rounded to nearest even).
void writeTensors(const std::string& path, const std::vector<Tensor>& tensors,
                  const std::string& dtype) {
  std::vector<ckpt::SafetensorsTensor> layout;
  for (const auto& t : tensors) layout.push_back({t.name, dtype, t.shape});
  ckpt::SafetensorsFileWriter file(path, layout);
  for (const auto& t : tensors) {
    if (dtype == "F32") {
      file.append(t.values.data(), t.values.size() * 4);
      continue;
    }
    std::vector<uint16_t> half;
    for (float v : t.values) {
      half.push_back(dtype == "BF16" ? ckpt::floatToBFloat16(v) : ckpt::floatToHalf(v));
    }
    file.append(half.data(), half.size() * 2);
  }
  file.commit();
}

constexpr int64_t kHidden = 64, kInter = 96, kVocab = 128, kLayers = 2;

// A Llama-shaped base's tensors, by HF's names.
std::vector<Tensor> baseTensors() {
  std::vector<Tensor> t;
  uint32_t seed = 1;
  t.push_back(randomTensor("model.embed_tokens.weight", {kVocab, kHidden}, 1, seed++));
  for (int i = 0; i < kLayers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      t.push_back(randomTensor(p + "self_attn." + proj + ".weight", {kHidden, kHidden}, 1, seed++));
    }
    t.push_back(randomTensor(p + "mlp.gate_proj.weight", {kInter, kHidden}, 1, seed++));
    t.push_back(randomTensor(p + "mlp.down_proj.weight", {kHidden, kInter}, 1, seed++));
    t.push_back(randomTensor(p + "input_layernorm.weight", {kHidden}, 1, seed++));
  }
  t.push_back(randomTensor("model.norm.weight", {kHidden}, 1, seed++));
  t.push_back(randomTensor("lm_head.weight", {kVocab, kHidden}, 1, seed++));
  return t;
}

const std::map<std::string, std::string> kFolderFiles = {
    {"config.json", R"({"model_type": "llama", "hidden_size": 64})"},
    {"tokenizer.json", R"({"model": {"type": "BPE"}})"},
    {"generation_config.json", R"({"do_sample": false})"}};

// The base folder: in one file, or in `shards` files with an index.
void writeBase(const std::string& dir, const std::string& dtype, int shards = 1) {
  fs::create_directories(dir);
  const auto tensors = baseTensors();
  if (shards == 1) {
    writeTensors(dir + "/model.safetensors", tensors, dtype);
  } else {
    std::vector<std::pair<std::string, std::string>> weight_map;
    uint64_t total = 0;
    const size_t per = (tensors.size() + shards - 1) / shards;
    for (int s = 0; s < shards; ++s) {
      const std::string name = ckpt::safetensorsFileName(s, shards);
      std::vector<Tensor> part(tensors.begin() + std::min(tensors.size(), s * per),
                               tensors.begin() + std::min(tensors.size(), (s + 1) * per));
      writeTensors(dir + "/" + name, part, dtype);
      for (const auto& t : part) {
        weight_map.emplace_back(t.name, name);
        total += t.values.size() * (dtype == "F32" ? 4 : 2);
      }
    }
    ckpt::writeSafetensorsIndex(dir, total, weight_map);
  }
  for (const auto& [name, text] : kFolderFiles) std::ofstream(dir + "/" + name) << text;
}

struct AdapterSpec {
  int r = 8;
  double alpha = 16;
  bool rslora = false;
  std::string dtype = "F32";
  std::string adapter_name;  // "" (PEFT today), or "default" (older PEFT's keys)
  std::vector<std::string> modules = {"self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"};
  std::map<std::string, std::string> config;  // adapter_config.json's fields replaced or added
  bool embedding_adapter = false;             // adds a lora_embedding_A, which is not merged
};

// An adapter in PEFT's layout for the base above: A [r, in], B [out, r] per targeted module of
// every layer (B of layer 1's q_proj zeros, as PEFT initialises it).
void writeAdapter(const std::string& dir, const AdapterSpec& spec) {
  fs::create_directories(dir);
  std::vector<Tensor> tensors;
  uint32_t seed = 100;
  const std::string suffix = spec.adapter_name.empty() ? "" : "." + spec.adapter_name;
  std::string targets;
  for (const auto& m : spec.modules) {
    targets += (targets.empty() ? "[\"" : ", \"") + m.substr(m.rfind('.') + 1) + "\"";
  }
  for (int i = 0; i < kLayers; ++i) {
    for (const auto& module : spec.modules) {
      const std::string key = "base_model.model.model.layers." + std::to_string(i) + "." + module;
      const int64_t in = module == "mlp.down_proj" ? kInter : kHidden, out = kHidden;
      tensors.push_back(
          randomTensor(key + ".lora_A" + suffix + ".weight", {spec.r, in}, 0.5f, seed++));
      Tensor b = randomTensor(key + ".lora_B" + suffix + ".weight", {out, spec.r}, 0.5f, seed++);
      if (i == 1 && module == "self_attn.q_proj") std::fill(b.values.begin(), b.values.end(), 0.f);
      tensors.push_back(b);
    }
  }
  if (spec.embedding_adapter) {
    tensors.push_back(randomTensor("base_model.model.model.embed_tokens.lora_embedding_A",
                                   {spec.r, kVocab}, 0.5f, seed++));
  }
  writeTensors(dir + "/adapter_model.safetensors", tensors, spec.dtype);
  std::vector<std::pair<std::string, std::string>> fields = {
      {"peft_type", "\"LORA\""},
      {"task_type", "\"CAUSAL_LM\""},
      {"r", std::to_string(spec.r)},
      {"lora_alpha", std::to_string(spec.alpha)},
      {"lora_dropout", "0.05"},
      {"target_modules", targets + "]"},
      {"bias", "\"none\""},
      {"use_rslora", spec.rslora ? "true" : "false"},
      {"fan_in_fan_out", "false"},
      {"modules_to_save", "null"},
      {"rank_pattern", "{}"},
      {"alpha_pattern", "{}"},
      {"base_model_name_or_path", "\"tiny-llama\""},
      {"inference_mode", "true"}};
  for (const auto& [key, value] : spec.config) {
    auto at =
        std::find_if(fields.begin(), fields.end(), [&](const auto& f) { return f.first == key; });
    if (at == fields.end()) {
      fields.emplace_back(key, value);
    } else {
      at->second = value;
    }
  }
  std::string text = "{";
  for (const auto& [key, value] : fields) {
    text += (text.size() > 1 ? ", \"" : "\"") + key + "\": " + value;
  }
  std::ofstream(dir + "/adapter_config.json") << text << "}";
}

Finished mergeLora(std::vector<std::string> args) {
  args.insert(args.begin(), {CXXLAUNCH_BIN, "merge-weights"});
  return cxxlaunch::testing::run(args, {}, std::chrono::seconds(120));
}

Finished reference(const std::string& base, const std::string& adapter, const std::string& merged) {
  return cxxlaunch::testing::run({SYSTEM_PYTHON, LORA_MERGE_REFERENCE, base, adapter, merged}, {},
                                 std::chrono::seconds(120));
}

// The error line merge-weights printed, and that it is the only one.
std::string oneErrorLine(const Finished& f) {
  INFO(f.out << f.err);
  CHECK(f.exit_code == 2);
  CHECK(std::count(f.err.begin(), f.err.end(), '\n') == 1);
  CHECK(f.err.rfind("cxxlaunch merge-weights: error: ", 0) == 0);
  CHECK(f.out.empty());
  return f.err;
}

std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("merge-weights --lora writes base + scale * B A rounded once, in the base's dtype",
          "[merge_lora]") {
  struct Case {
    const char* what;
    std::string dtype;
    int shards;
    AdapterSpec adapter;
  };
  AdapterSpec bf16_rslora;
  bf16_rslora.rslora = true;
  bf16_rslora.r = 16;
  bf16_rslora.dtype = "BF16";
  bf16_rslora.adapter_name = "default";
  AdapterSpec fp16;
  fp16.r = 4;
  fp16.alpha = 8;
  const std::vector<Case> cases = {
      {"fp32, one file", "F32", 1, AdapterSpec{}},
      {"bf16, 3 files and an index, rslora, .default keys", "BF16", 3, bf16_rslora},
      {"fp16, one file", "F16", 1, fp16}};
  for (const auto& c : cases) {
    INFO(c.what);
    TempDir dir;
    const std::string base = dir.path() + "/base", adapter = dir.path() + "/adapter",
                      out = dir.path() + "/merged";
    writeBase(base, c.dtype, c.shards);
    writeAdapter(adapter, c.adapter);
    const Finished f = mergeLora({"--lora", adapter, "--base", base, out});
    INFO(f.out << f.err);
    REQUIRE(f.exit_code == 0);
    CHECK(f.err.empty());
    CHECK(f.out.find("6 of 17 tensors adapted") != std::string::npos);
    // The base's files, names and index as they were, and its config and tokenizer files.
    CHECK(listing(out) == listing(base));
    if (c.shards > 1) {
      CHECK(readFile(out + "/model.safetensors.index.json") ==
            readFile(base + "/model.safetensors.index.json"));
    }
    for (const auto& [name, text] : kFolderFiles) CHECK(readFile(out + "/" + name) == text);
    const Finished check = reference(base, adapter, out);
    INFO(check.out << check.err);
    CHECK(check.exit_code == 0);
    // The comparison can fail: the base itself is no merge, nor is this merge one of alpha 17.
    CHECK(reference(base, adapter, base).exit_code == 1);
    AdapterSpec other = c.adapter;
    other.alpha = 17;
    writeAdapter(dir.path() + "/alpha17", other);
    CHECK(reference(base, dir.path() + "/alpha17", out).exit_code == 1);
  }
}

TEST_CASE("merge-weights --lora with --max_shard_size splits the base's tensors afresh",
          "[merge_lora]") {
  TempDir dir;
  const std::string base = dir.path() + "/base", adapter = dir.path() + "/adapter",
                    out = dir.path() + "/merged";
  writeBase(base, "F32");
  writeAdapter(adapter, AdapterSpec{});
  const Finished f =
      mergeLora({"--lora", adapter, "--base", base, out, "--max_shard_size", "40KB"});
  INFO(f.out << f.err);
  REQUIRE(f.exit_code == 0);
  CHECK(fs::exists(out + "/model.safetensors.index.json"));
  const auto files = listing(out);
  CHECK(std::count_if(files.begin(), files.end(), [](const std::string& name) {
          return name.rfind("model-0000", 0) == 0;
        }) > 2);
  CHECK(!fs::exists(out + "/model.safetensors"));
  const Finished check = reference(base, adapter, out);
  INFO(check.out << check.err);
  CHECK(check.exit_code == 0);
}

TEST_CASE("merge-weights --lora refuses bad input with one line, exit 2 and nothing written",
          "[merge_lora]") {
  TempDir dir;
  const std::string base = dir.path() + "/base", out = dir.path() + "/merged";
  writeBase(base, "BF16");
  int n = 0;
  // Merges adapter `spec` (after `edit` on its folder) and returns the error line.
  auto refused = [&](const AdapterSpec& spec, const std::function<void(const std::string&)>& edit,
                     std::vector<std::string> args = {}) {
    const std::string adapter = dir.path() + "/adapter" + std::to_string(n++);
    writeAdapter(adapter, spec);
    if (edit) edit(adapter);
    const auto before = listing(dir.path());
    if (args.empty()) args = {"--lora", adapter, "--base", base, out};
    const std::string error = oneErrorLine(mergeLora(args));
    CHECK(listing(dir.path()) == before);  // no output, no staging folder left
    return error;
  };
  auto has = [](const std::string& error, const std::string& part) {
    INFO(error);
    CHECK(error.find(part) != std::string::npos);
  };
  auto config = [](std::map<std::string, std::string> fields) {
    AdapterSpec spec;
    spec.config = std::move(fields);
    return spec;
  };
  has(refused({}, [](const std::string& a) { fs::remove(a + "/adapter_config.json"); }),
      "adapter_config.json' is missing");
  has(refused({},
              [](const std::string& a) { std::ofstream(a + "/adapter_config.json") << "{r: 8"; }),
      "is not a JSON object");
  has(refused({}, [](const std::string& a) { fs::remove(a + "/adapter_model.safetensors"); }),
      "adapter_model.safetensors' is missing");
  has(refused(config({{"peft_type", "\"IA3\""}}), nullptr), "peft_type is 'IA3'");
  has(refused(config({{"fan_in_fan_out", "true"}}), nullptr), "fan_in_fan_out is true");
  has(refused(config({{"bias", "\"all\""}}), nullptr), "bias is \"all\"");
  has(refused(config({{"modules_to_save", "[\"lm_head\"]"}}), nullptr),
      "modules_to_save is [\"lm_head\"]");
  has(refused(config({{"use_dora", "true"}}), nullptr), "DoRA");
  has(refused(config({{"rank_pattern", "{\"q_proj\": 4}"}}), nullptr), "rank_pattern");
  has(refused(config({{"r", "4"}}), nullptr),
      "adapter_config.json says r 4, but the lora_A of 'model.layers.0.mlp.down_proj' has 8 rows");
  AdapterSpec embedding;
  embedding.embedding_adapter = true;
  has(refused(embedding, nullptr), "model.embed_tokens.lora_embedding_A");
  AdapterSpec qkv;
  qkv.modules = {"self_attn.qkv_proj"};
  const std::string missing = refused(qkv, nullptr);
  has(missing,
      "the base model has no tensor model.layers.0.self_attn.qkv_proj.weight, "
      "model.layers.1.self_attn.qkv_proj.weight (2 of the adapter's 2 targets)");
  has(missing, "('tiny-llama')");
  AdapterSpec gate;
  gate.modules = {"mlp.gate_proj"};  // written [64, 8] and [8, 64]; the base's is [96, 64]
  has(refused(gate, nullptr),
      "shapes do not match for 'model.layers.0.mlp.gate_proj': the base's weight [96, 64] "
      "([out, in]), lora_A [8, 64], lora_B [64, 8]: lora_A must be [r, in] = [8, 64] and lora_B "
      "[out, r] = [96, 8]");

  // The command line.
  const std::string adapter = dir.path() + "/good";
  writeAdapter(adapter, AdapterSpec{});
  has(refused({}, nullptr, {"--lora", adapter, out}), "--lora needs the adapter's base model");
  has(refused({}, nullptr, {"--lora", adapter, "--base", base, out, "--dtype", "bf16"}),
      "--dtype does not apply to --lora");
  has(refused({}, nullptr, {"--lora", adapter, "--base", base, base, out}), "give one folder");
  has(refused({}, nullptr, {"--base", base, adapter, out}), "--base is for --lora");
  // Outputs that overlap the inputs, and a base without safetensors.
  has(refused({}, nullptr, {"--lora", adapter, "--base", base, adapter + "/merged"}),
      "lies inside the adapter");
  has(refused({}, nullptr, {"--lora", adapter, "--base", base, base, "--overwrite"}),
      "is the base model");
  has(refused({}, nullptr, {"--lora", adapter, "--base", adapter, out}),
      "has neither model.safetensors nor model.safetensors.index.json");
}

TEST_CASE("merge-weights --lora replaces an OUTPUT only with --overwrite, and only when it works",
          "[merge_lora]") {
  TempDir dir;
  const std::string base = dir.path() + "/base", adapter = dir.path() + "/adapter",
                    out = dir.path() + "/merged";
  writeBase(base, "F32");
  writeAdapter(adapter, AdapterSpec{});
  fs::create_directories(out);
  std::ofstream(out + "/keep.txt") << "old";
  CHECK(oneErrorLine(mergeLora({"--lora", adapter, "--base", base, out})).find("--overwrite") !=
        std::string::npos);
  // A bad adapter with --overwrite: the old OUTPUT stays as it was.
  AdapterSpec bad;
  bad.config = {{"bias", "\"lora_only\""}};
  writeAdapter(dir.path() + "/bad", bad);
  oneErrorLine(mergeLora({"--lora", dir.path() + "/bad", "--base", base, out, "--overwrite"}));
  CHECK(listing(out) == std::vector<std::string>{"keep.txt"});
  const Finished f = mergeLora({"--lora", adapter, "--base", base, out, "--overwrite"});
  INFO(f.out << f.err);
  REQUIRE(f.exit_code == 0);
  CHECK(!fs::exists(out + "/keep.txt"));
  CHECK(reference(base, adapter, out).exit_code == 0);
  // The base's bytes are untouched, and nothing is left beside OUTPUT.
  CHECK(listing(dir.path()) == std::vector<std::string>{"adapter", "bad", "base", "merged"});
}

TEST_CASE("Rounding a double to odd float32 first makes its rounding to bf16 and fp16 one rounding",
          "[merge_lora]") {
  using ckpt::floatToBFloat16;
  using ckpt::floatToHalf;
  using ckpt::roundToOddFloat;
  // Just above the tie of 1 and 1 + 2^-7 (bf16): through float32 to nearest, the tie is rounded
  // to even (down, twice rounded); the nearest bf16 is up.
  const double above = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  CHECK(floatToBFloat16(static_cast<float>(above)) == 0x3f80);
  CHECK(floatToBFloat16(roundToOddFloat(above)) == 0x3f81);
  // Just below the tie of 1 + 2^-7 and 1 + 2^-6: the nearest is down, the tie's even one up.
  const double below = 1.0 + 3 * std::ldexp(1.0, -8) - std::ldexp(1.0, -40);
  CHECK(floatToBFloat16(static_cast<float>(below)) == 0x3f82);
  CHECK(floatToBFloat16(roundToOddFloat(below)) == 0x3f81);
  const double half_above = -(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40));
  CHECK(floatToHalf(static_cast<float>(half_above)) == 0xbc00);
  CHECK(floatToHalf(roundToOddFloat(half_above)) == 0xbc01);
  // Floats pass through; so do infinities and NaN; beyond float32's range is infinity.
  CHECK(roundToOddFloat(0.15625) == 0.15625f);
  CHECK(roundToOddFloat(-0.0) == 0.0f);
  CHECK(std::signbit(roundToOddFloat(-0.0)));
  CHECK(std::isinf(roundToOddFloat(1e300)));
  CHECK(std::isnan(roundToOddFloat(std::nan(""))));
  CHECK(roundToOddFloat(1e-50) == std::nextafter(0.0f, 1.0f));  // inexact: the odd one
}
