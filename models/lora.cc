#include "models/lora.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/dropout.h>
#include <torch/nn/functional/linear.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/deferred_init.h"

namespace cxxlaunch::models {
namespace {

using nlohmann::json;

std::string number(double value) {
  char out[32];
  std::snprintf(out, sizeof(out), "%g", value);
  return out;
}

std::string shapeText(c10::IntArrayRef shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// nn.Linear's weight init, kaiming_uniform_(a=√5): gain √(2 / (1 + 5)), bound gain · √(3 / fan_in)
// = 1 / √fan_in. The seed is drawn now (as llama.cc's parameters draw theirs), so the values do
// not depend on when the strategy makes them.
runtime::Initializer kaimingUniform(int64_t fan_in) {
  uint64_t seed = 0;
  {
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    seed = generator.get<at::CPUGeneratorImpl>()->random64();
  }
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  return [seed, bound](torch::Tensor& values) {
    torch::Tensor cpu = torch::empty(values.sizes(), torch::kFloat);
    cpu.uniform_(-bound, bound, at::make_generator<at::CPUGeneratorImpl>(seed));
    values.copy_(cpu);
  };
}

bool targets(const std::string& name, const std::string& target) {
  return name == target || (name.size() > target.size() && name.ends_with(target) &&
                            name[name.size() - target.size() - 1] == '.');
}

std::string lastPart(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

// Copies `source` into a parameter's values, whatever its dtype and device.
runtime::Initializer copyOf(std::shared_ptr<runtime::checkpoint::SafetensorsReader> reader,
                            std::string name) {
  return [reader = std::move(reader), name = std::move(name)](torch::Tensor& values) {
    values.copy_(reader->tensor(name));
  };
}

std::shared_ptr<runtime::checkpoint::SafetensorsReader> openWeights(const std::string& path) {
  return std::make_shared<runtime::checkpoint::SafetensorsReader>(path);
}

}  // namespace

double LoraConfig::scale() const {
  return alpha / (use_rslora ? std::sqrt(static_cast<double>(r)) : static_cast<double>(r));
}

void LoraConfig::check() const {
  if (r < 1) throw InvalidArgument("lora_r must be 1 or more (got " + std::to_string(r) + ")");
  if (!std::isfinite(alpha) || !(alpha > 0)) {
    throw InvalidArgument("lora_alpha must be a finite number > 0 (got " + number(alpha) + ")");
  }
  if (!(dropout >= 0 && dropout < 1)) {
    throw InvalidArgument("lora_dropout must be in [0, 1) (got " + number(dropout) + ")");
  }
  if (target_modules.empty()) {
    throw InvalidArgument("lora_target_modules names no module (give q_proj,v_proj or all-linear)");
  }
  for (const auto& target : target_modules) {
    if (target.empty()) throw InvalidArgument("lora_target_modules has an empty name");
  }
}

LoraFactorImpl::LoraFactorImpl(int64_t in, int64_t out)
    : weight(register_parameter("weight", torch::empty({out, in}))) {}

std::vector<std::string> addLora(LlamaForCausalLMImpl& model, const LoraConfig& config) {
  config.check();
  const bool all = config.target_modules.size() == 1 && config.target_modules[0] == kAllLinear;
  // 1. every Linear by name; 2. the targets each matched, every one checked before a change.
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::LinearImpl>>> linears;
  for (const auto& item : model.named_modules()) {
    if (item.value()->named_children().contains("lora_A")) {
      throw InvalidArgument("the model has LoRA adapters already ('" + item.key() + "')");
    }
    auto linear = std::dynamic_pointer_cast<torch::nn::LinearImpl>(item.value());
    if (linear) linears.emplace_back(item.key(), linear);
  }
  std::set<std::string> names;  // the Linear names there are, for the error
  for (const auto& [name, linear] : linears) names.insert(lastPart(name));
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::LinearImpl>>> chosen;
  for (const auto& [name, linear] : linears) {
    const bool hit = all ? lastPart(name) != "lm_head"
                         : std::any_of(config.target_modules.begin(), config.target_modules.end(),
                                       [&](const std::string& t) { return targets(name, t); });
    if (hit) chosen.emplace_back(name, linear);
  }
  if (!all) {
    for (const auto& target : config.target_modules) {
      if (std::none_of(linears.begin(), linears.end(),
                       [&](const auto& l) { return targets(l.first, target); })) {
        std::string list;
        for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
        throw InvalidArgument("lora_target_modules: '" + target +
                              "' matches no Linear module of the model; its Linear modules are " +
                              list + " (or give all-linear)");
      }
    }
  }
  for (const auto& [name, linear] : chosen) {
    const int64_t in = linear->options.in_features(), out = linear->options.out_features();
    if (config.r > std::min(in, out)) {
      throw InvalidArgument("lora_r " + std::to_string(config.r) + " is larger than '" + name +
                            "' (" + std::to_string(out) + " x " + std::to_string(in) +
                            "): give at most " + std::to_string(std::min(in, out)));
    }
  }
  for (auto& p : model.parameters()) p.requires_grad_(false);
  std::vector<std::string> adapted;
  for (const auto& [name, linear] : chosen) {
    const int64_t in = linear->options.in_features(), out = linear->options.out_features();
    auto a = linear->register_module("lora_A", LoraFactor(in, config.r));
    auto b = linear->register_module("lora_B", LoraFactor(config.r, out));
    a->dropout = config.dropout;
    a->scale = config.scale();
    runtime::initParameter(a->weight, kaimingUniform(in));
    runtime::initParameter(b->weight, [](torch::Tensor& values) { values.zero_(); });
    adapted.push_back(name);
  }
  return adapted;
}

torch::Tensor linearForward(torch::nn::LinearImpl& layer, const torch::Tensor& x) {
  torch::Tensor y = layer.forward(x);
  const auto children = layer.named_children();
  const auto* a = children.find("lora_A");
  const auto* b = children.find("lora_B");
  if (a == nullptr || b == nullptr) return y;
  const auto& down = static_cast<const LoraFactorImpl&>(**a);
  const auto& up = static_cast<const LoraFactorImpl&>(**b);
  namespace F = torch::nn::functional;
  const torch::Tensor in =
      down.dropout > 0 && layer.is_training()
          ? F::dropout(x, F::DropoutFuncOptions().p(down.dropout).training(true))
          : x;
  return y + F::linear(F::linear(in, down.weight), up.weight) * down.scale;
}

bool isLoraParameter(const std::string& name) {
  return name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight");
}

std::vector<torch::Tensor> trainableParameters(const torch::nn::Module& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model.parameters()) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

void loadFrozenWeights(torch::nn::Module& model, const std::string& dir) {
  const auto reader = openWeights(dir);
  std::vector<std::string> missing, reshaped;
  for (const auto& item : model.named_parameters()) {
    if (item.value().requires_grad()) continue;
    auto it = reader->entries().find(item.key());
    if (it == reader->entries().end()) {
      missing.push_back(item.key());
    } else if (it->second.shape != item.value().sizes().vec()) {
      reshaped.push_back(item.key() + " " + shapeText(it->second.shape) + " where the model has " +
                         shapeText(item.value().sizes()));
    }
  }
  if (!missing.empty() || !reshaped.empty()) {
    std::string why;
    for (const auto& n : missing) why += "\n  missing: " + n;
    for (const auto& n : reshaped) why += "\n  of another shape: " + n;
    throw InvalidArgument("'" + dir + "' does not hold this model's base weights:" + why);
  }
  for (auto& item : model.named_parameters()) {
    if (!item.value().requires_grad())
      runtime::initParameter(item.value(), copyOf(reader, item.key()));
  }
}

void loadAdapterWeights(torch::nn::Module& model, const std::string& file) {
  const auto reader = openWeights(file);
  std::set<std::string> unused;
  for (const auto& [name, entry] : reader->entries()) unused.insert(name);
  std::string why;
  for (const auto& item : model.named_parameters()) {
    if (!isLoraParameter(item.key())) continue;
    const std::string key = kPeftPrefix + item.key();
    auto it = reader->entries().find(key);
    unused.erase(key);
    if (it == reader->entries().end()) {
      why += "\n  missing: " + key + " " + shapeText(item.value().sizes());
    } else if (it->second.shape != item.value().sizes().vec()) {
      why += "\n  " + key + " is " + shapeText(it->second.shape) + " where the model's is " +
             shapeText(item.value().sizes());
    }
  }
  for (const auto& name : unused) why += "\n  not in this model: " + name;
  if (!why.empty()) {
    throw InvalidArgument("'" + file +
                          "' is not an adapter of this model (another base, rank or "
                          "set of target modules):" +
                          why);
  }
  for (auto& item : model.named_parameters()) {
    if (isLoraParameter(item.key())) {
      runtime::initParameter(item.value(), copyOf(reader, kPeftPrefix + item.key()));
    }
  }
}

std::string adapterConfigJson(const LoraConfig& config, const std::vector<std::string>& adapted,
                              const std::string& base_model_name_or_path) {
  std::set<std::string> modules;
  for (const auto& name : adapted) modules.insert(lastPart(name));
  const json j = {{"peft_type", "LORA"},
                  {"task_type", "CAUSAL_LM"},
                  {"r", config.r},
                  {"lora_alpha", config.alpha},
                  {"lora_dropout", config.dropout},
                  {"target_modules", std::vector<std::string>(modules.begin(), modules.end())},
                  {"bias", "none"},
                  {"use_rslora", config.use_rslora},
                  {"fan_in_fan_out", false},
                  {"modules_to_save", nullptr},
                  {"init_lora_weights", true},
                  {"base_model_name_or_path", base_model_name_or_path},
                  {"inference_mode", true}};
  return j.dump(2) + "\n";
}

LoraConfig adapterConfigFromJson(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw InvalidArgument(origin + " is not JSON (" + e.what() + ")");
  }
  auto refuse = [&](const std::string& why) { throw InvalidArgument(origin + ": " + why); };
  if (!j.is_object()) refuse("not a JSON object");
  if (j.value("peft_type", json()) != "LORA") refuse("peft_type is not \"LORA\"");
  if (j.contains("bias") && j["bias"] != "none")
    refuse("bias is not \"none\"; LoRA biases are not run");
  if (j.contains("fan_in_fan_out") && j["fan_in_fan_out"] == true) refuse("fan_in_fan_out is true");
  if (j.contains("modules_to_save") && !j["modules_to_save"].is_null()) {
    refuse("modules_to_save is set; only the LoRA factors are loaded");
  }
  LoraConfig c;
  if (!j.contains("r") || !j["r"].is_number_integer()) refuse("r is not a whole number");
  c.r = j["r"].get<int64_t>();
  if (j.contains("lora_alpha")) {
    if (!j["lora_alpha"].is_number()) refuse("lora_alpha is not a number");
    c.alpha = j["lora_alpha"].get<double>();
  }
  if (j.contains("lora_dropout")) {
    if (!j["lora_dropout"].is_number()) refuse("lora_dropout is not a number");
    c.dropout = j["lora_dropout"].get<double>();
  }
  if (j.contains("use_rslora")) {
    if (!j["use_rslora"].is_boolean()) refuse("use_rslora is not true or false");
    c.use_rslora = j["use_rslora"].get<bool>();
  }
  const json& t = j.value("target_modules", json());
  if (t.is_string()) {
    c.target_modules = {t.get<std::string>()};
  } else if (t.is_array() && !t.empty() &&
             std::all_of(t.begin(), t.end(), [](const json& m) { return m.is_string(); })) {
    c.target_modules = t.get<std::vector<std::string>>();
  } else {
    refuse("target_modules is not a list of module names");
  }
  try {
    c.check();
  } catch (const InvalidArgument& e) {
    refuse(e.what());
  }
  return c;
}

std::vector<std::pair<std::string, torch::Tensor>> peftTensors(
    const std::vector<std::pair<std::string, torch::Tensor>>& parameters) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& [name, tensor] : parameters) {
    if (isLoraParameter(name)) out.emplace_back(kPeftPrefix + name, tensor);
  }
  return out;
}

}  // namespace cxxlaunch::models
