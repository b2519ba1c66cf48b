#include "tensorfile/lora_adapter.h"

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <vector>

#include "common/error.h"
#include "common/file.h"

namespace cxxlaunch::tensorfile {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr size_t kMaxConfigBytes = 16u << 20;
constexpr size_t kNamesListed = 5;

std::string shapeText(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// The first names of `names`, and how many more there are.
std::string listed(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size() && i < kNamesListed; ++i) {
    text += (i ? ", " : "") + names[i];
  }
  if (names.size() > kNamesListed) {
    text += " and " + std::to_string(names.size() - kNamesListed) + " more";
  }
  return text;
}

// A value as the message shows it: its JSON, cut short.
std::string shown(const json& value) {
  std::string text = value.dump();
  if (text.size() <= 120) return text;
  size_t cut = 117;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80) --cut;  // UTF-8
  text = text.substr(0, cut) + "...";
  return text;
}

bool floatingDtype(const std::string& dtype) {
  return dtype == "F32" || dtype == "BF16" || dtype == "F16" || dtype == "F64";
}

// Reads the settings merging depends on, refusing those it does not support.
void readSettings(const json& config, const std::string& path, LoraAdapter& adapter) {
  auto bad = [&](const std::string& why) { return InvalidArgument("'" + path + "': " + why); };
  auto field = [&](const char* key) -> const json* {
    const auto it = config.find(key);
    return it == config.end() || it->is_null() ? nullptr : &*it;
  };
  const json* type = field("peft_type");
  if (type == nullptr || !type->is_string()) {
    throw bad("no peft_type: not the adapter_config.json of a PEFT adapter");
  }
  if (type->get<std::string>() != "LORA") {
    throw bad("peft_type is '" + type->get<std::string>() +
              "': merge-weights --lora merges LORA adapters only");
  }
  if (const json* r = field("r")) {
    if (!r->is_number_integer() || r->get<int64_t>() < 1 || r->get<int64_t>() > (1 << 20)) {
      throw bad("r is " + shown(*r) + ", not a positive whole number");
    }
    adapter.r = static_cast<int>(r->get<int64_t>());
  }
  if (const json* alpha = field("lora_alpha")) {
    if (!alpha->is_number() || !std::isfinite(alpha->get<double>())) {
      throw bad("lora_alpha is " + shown(*alpha) + ", not a number");
    }
    adapter.alpha = alpha->get<double>();
  }
  auto flag = [&](const char* key) {
    const json* value = field(key);
    if (value != nullptr && !value->is_boolean()) {
      throw bad(std::string(key) + " is " + shown(*value) + ", not true or false");
    }
    return value != nullptr && value->get<bool>();
  };
  adapter.rslora = flag("use_rslora");
  if (flag("fan_in_fan_out")) {
    throw bad(
        "fan_in_fan_out is true (an adapter of Conv1D layers, whose weights are stored [in, out] "
        "as GPT-2's): not supported, merge-weights --lora merges Linear layers' [out, in] "
        "weights");
  }
  if (flag("use_dora")) {
    throw bad("use_dora is true: DoRA adapters are not supported, only plain LoRA");
  }
  if (const json* bias = field("bias")) {
    if (!bias->is_string() || bias->get<std::string>() != "none") {
      throw bad("bias is " + shown(*bias) +
                ": the adapter trains biases too, which merge-weights --lora does not merge; "
                "only bias \"none\" is supported");
    }
  }
  if (const json* modules = field("modules_to_save"); modules != nullptr && !modules->empty()) {
    throw bad("modules_to_save is " + shown(*modules) +
              ": the adapter holds whole trained copies of those modules, which merge-weights "
              "--lora does not merge; only modules_to_save null is supported");
  }
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    if (const json* pattern = field(key); pattern != nullptr && !pattern->empty()) {
      throw bad(std::string(key) + " is " + shown(*pattern) +
                ": per-module ranks and alphas are not supported, only one r and lora_alpha");
    }
  }
  if (const json* base = field("base_model_name_or_path"); base != nullptr && base->is_string()) {
    adapter.base_model = base->get<std::string>();
  }
  adapter.scale = adapter.rslora ? adapter.alpha / std::sqrt(static_cast<double>(adapter.r))
                                 : adapter.alpha / adapter.r;
}

}  // namespace

LoraAdapter readLoraConfig(const std::string& dir) {
  const std::string path = (fs::path(dir) / kAdapterConfigName).string();
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) {
    throw InvalidArgument("'" + path + "' is missing: --lora takes the folder PEFT's " +
                          "save_pretrained (or finetune) writes, with " + kAdapterConfigName +
                          " and " + kAdapterWeightsName);
  }
  const json config =
      json::parse(readRegularFile(path, "adapter config", kMaxConfigBytes), nullptr, false);
  if (config.is_discarded() || !config.is_object()) {
    throw InvalidArgument("'" + path + "' is not a JSON object: not the adapter_config.json " +
                          "of a PEFT adapter");
  }
  LoraAdapter adapter;
  readSettings(config, path, adapter);
  return adapter;
}

void pairLoraTensors(LoraAdapter& adapter, const SafetensorsFolder& weights,
                     const std::string& weights_path) {
  // base_model.model.<module>.lora_<A|B>[.<adapter name>].weight
  static const std::regex kKey(R"(base_model\.model\.(.+)\.lora_([AB])(?:\.([^.]+))?\.weight)");
  std::vector<std::string> unknown;
  std::set<std::string> names;  // adapter names seen ("" for none)
  std::map<std::string, LoraPair> modules;
  for (const auto& file : weights.files()) {
    for (const auto& tensor : file.tensors) {
      std::smatch m;
      if (!std::regex_match(tensor.name, m, kKey)) {
        unknown.push_back(tensor.name);
        continue;
      }
      names.insert(m[3].str());
      LoraPair& pair = modules[m[1].str()];
      (m[2].str() == "A" ? pair.a : pair.b) = tensor.name;
    }
  }
  if (!unknown.empty()) {
    throw InvalidArgument("'" + weights_path + "' holds tensors that are no lora_A/lora_B of a " +
                          "module (" + listed(unknown) + "): embeddings' adapters, DoRA, " +
                          "modules_to_save and biases are not merged, only Linear layers' LoRA");
  }
  if (names.size() > 1) {
    throw InvalidArgument("'" + weights_path + "' holds several adapters (named " +
                          listed({names.begin(), names.end()}) + "): save one adapter per folder");
  }
  if (modules.empty()) throw InvalidArgument("'" + weights_path + "' holds no LoRA tensors");
  std::vector<std::string> unpaired;
  for (const auto& [module, pair] : modules) {
    if (pair.a.empty() || pair.b.empty()) {
      unpaired.push_back(module + (pair.a.empty() ? " (no lora_A)" : " (no lora_B)"));
    }
    adapter.pairs[module + ".weight"] = pair;
  }
  if (!unpaired.empty()) {
    throw InvalidArgument("'" + weights_path + "' is incomplete: " + listed(unpaired));
  }
}

void checkLoraAgainstBase(const LoraAdapter& adapter, const SafetensorsFolder& weights,
                          const SafetensorsFolder& base, const std::string& base_path) {
  std::vector<std::string> missing;
  for (const auto& [target, pair] : adapter.pairs) {
    if (base.find(target) == nullptr) missing.push_back(target);
  }
  if (!missing.empty()) {
    std::string hint = "is '" + base_path + "' the adapter's base";
    if (!adapter.base_model.empty()) hint += " ('" + adapter.base_model + "')";
    throw InvalidArgument("the base model has no tensor " + listed(missing) + " (" +
                          std::to_string(missing.size()) + " of the adapter's " +
                          std::to_string(adapter.pairs.size()) + " targets): " + hint + "?");
  }
  for (const auto& [target, pair] : adapter.pairs) {
    const SafetensorsEntry& w = *base.find(target);
    const SafetensorsEntry& a = *weights.find(pair.a);
    const SafetensorsEntry& b = *weights.find(pair.b);
    const std::string module = target.substr(0, target.size() - 7);
    if (w.dtype != "F32" && w.dtype != "BF16" && w.dtype != "F16" && w.dtype != "F64") {
      throw InvalidArgument("the base's '" + target + "' is " + w.dtype +
                            ", not a floating-point weight an adapter can be merged into");
    }
    for (const auto* t : {&a, &b}) {
      if (!floatingDtype(t->dtype)) {
        throw InvalidArgument("the adapter's '" + t->name + "' is " + t->dtype +
                              ", not floating-point");
      }
    }
    if (a.shape.size() == 2 && b.shape.size() == 2 && a.shape[0] == b.shape[1] &&
        a.shape[0] != adapter.r) {
      throw InvalidArgument("adapter_config.json says r " + std::to_string(adapter.r) +
                            ", but the lora_A of '" + module + "' has " +
                            std::to_string(a.shape[0]) + " rows: the config is not this adapter's");
    }
    const int64_t r = adapter.r;
    if (w.shape.size() != 2 || a.shape != std::vector<int64_t>{r, w.shape[1]} ||
        b.shape != std::vector<int64_t>{w.shape[0], r}) {
      std::string expected = "lora_A must be [r, in] and lora_B [out, r]";
      if (w.shape.size() == 2) {
        expected = "lora_A must be [r, in] = " + shapeText({r, w.shape[1]}) +
                   " and lora_B [out, r] = " + shapeText({w.shape[0], r});
      }
      throw InvalidArgument("shapes do not match for '" + module + "': the base's weight " +
                            shapeText(w.shape) + " ([out, in]), lora_A " + shapeText(a.shape) +
                            ", lora_B " + shapeText(b.shape) + ": " + expected +
                            "; is this the adapter's base?");
    }
  }
}

}  // namespace cxxlaunch::tensorfile
