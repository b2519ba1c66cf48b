#pragma once
// LoRA on the Llama family (models/llama.h) as PEFT defines it: a targeted nn.Linear computes
//   y = W x + scale · B (A (dropout(x))),   scale = alpha / r   (alpha / √r with use_rslora)
// with A [r, in] Kaiming-uniform (a = √5, as nn.Linear's weight: U(-1/√in, 1/√in)) and B
// [out, r] zeros, so that a fresh adapter changes nothing. The factors hang on the Linear as its
// children `lora_A` and `lora_B`, so the parameters are named as PEFT names them once its
// adapter name is dropped (`model.layers.0.self_attn.q_proj.lora_A.weight`; PEFT's file key is
// kPeftPrefix + that name), and every original parameter is frozen (requires_grad false): a
// strategy keeps it whole, out of its flat buffers, with no gradient and no optimizer state,
// and shards the factors like any trainable parameter.
//
//   torch::manual_seed(seed);
//   LlamaForCausalLM model{nullptr};
//   {
//     auto deferred = acc.deferredInit();
//     model = LlamaForCausalLM(config);
//     addLora(*model, lora);                             // draws its seeds after the model's
//   }
//   optimizer over trainableParameters(*model); acc.prepare(model.ptr(), optimizer);
//   acc.loadModel(base_dir);   // the base into the frozen weights; the adapters keep theirs
//
// Through Accelerator::loadModel the frozen weights land in the mixed-precision dtype and the
// checkpoints name the base by path and fingerprint instead of holding it (docs/runtime.md,
// "Frozen parameters"). loadFrozenWeights (below) fills them without an Accelerator, before
// prepare, for a program of its own; its checkpoints then hold the base too.
//
// Every factor draws its seed as it is built (as llama.h's parameters do), so a model is the
// same on every rank, in every strategy, built inside Accelerator::deferredInit() or not.
//
// Thread-safety: as any LibTorch module; addLora and the loaders on one thread.

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "models/llama.h"

namespace cxxlaunch::models {

// PEFT's LoraConfig fields that change the math or the names.
struct LoraConfig {
  int64_t r = 8;
  double alpha = 8;    // PEFT's lora_alpha
  double dropout = 0;  // PEFT's lora_dropout, on the adapter's input while training
  // Module names (a module is targeted when its name is one of them or ends in "." + one), or
  // the one entry kAllLinear: every Linear but the output head.
  std::vector<std::string> target_modules = {"q_proj", "v_proj"};  // PEFT's default for Llama
  bool use_rslora = false;

  double scale() const;
  // InvalidArgument, naming the flag (PEFT's name), for r < 1, alpha not > 0, dropout outside
  // [0, 1), no target.
  void check() const;
};

inline constexpr char kAllLinear[] = "all-linear";
// What PEFT puts before a parameter's name in adapter_model.safetensors.
inline constexpr char kPeftPrefix[] = "base_model.model.";

// One factor of an adapter, PEFT's lora_A or lora_B: weight [out, in], no bias. lora_A carries
// the term's dropout and scale, so that the Linear it hangs on needs nothing else.
class LoraFactorImpl : public torch::nn::Module {
 public:
  LoraFactorImpl(int64_t in, int64_t out);
  torch::Tensor weight;
  double dropout = 0;
  double scale = 1;
};
TORCH_MODULE(LoraFactor);

// Adds an adapter to every Linear of `model` that `config` targets and freezes every parameter
// the model had. Returns the adapted modules' names, in the model's order. Throws
// InvalidArgument, before changing anything, for a bad config, a target that matches no Linear
// (the Linear names there are listed), r larger than an adapted layer's min(in, out), or a
// model that has adapters already.
std::vector<std::string> addLora(LlamaForCausalLMImpl& model, const LoraConfig& config);

// `layer`'s output with its adapter's term when it has one: what every projection of
// llama.cc computes through. The dropout is applied in training mode only.
torch::Tensor linearForward(torch::nn::LinearImpl& layer, const torch::Tensor& x);

bool isLoraParameter(const std::string& name);  // a lora_A / lora_B weight

// The trainable parameters (the adapters, after addLora): what the optimizer is built over.
std::vector<torch::Tensor> trainableParameters(const torch::nn::Module& model);

// Gives every frozen parameter of `model` its values from the HF model folder (or safetensors
// file) `dir`, through runtime::initParameter: now, or inside a deferredInit scope when the
// strategy makes the parameter. InvalidArgument, naming them, where `dir` lacks a frozen
// parameter or holds it in another shape (a base that does not match).
void loadFrozenWeights(torch::nn::Module& model, const std::string& dir);

// The same for the adapters from PEFT's adapter_model.safetensors (`file`, PEFT's keys):
// InvalidArgument, shapes named, where it lacks an adapter of the model, holds one the model
// does not have, or one of another shape (an adapter of another base or rank).
void loadAdapterWeights(torch::nn::Module& model, const std::string& file);

// adapter_config.json as PEFT's save_pretrained writes it (LORA, CAUSAL_LM, bias "none", ...);
// target_modules the distinct module names adapted (as PEFT expands all-linear).
std::string adapterConfigJson(const LoraConfig& config, const std::vector<std::string>& adapted,
                              const std::string& base_model_name_or_path);
// Reads one; InvalidArgument naming `origin` for what is not a LoRA adapter this build runs
// (another peft_type, biases, fan_in_fan_out, modules_to_save, a bad r / alpha / dropout).
LoraConfig adapterConfigFromJson(const std::string& text, const std::string& origin);

// The adapters among `parameters` (name -> tensor) under PEFT's keys, as they are: what
// adapter_model.safetensors holds.
std::vector<std::pair<std::string, torch::Tensor>> peftTensors(
    const std::vector<std::pair<std::string, torch::Tensor>>& parameters);

}  // namespace cxxlaunch::models
