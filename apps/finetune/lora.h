#pragma once
// finetune's LoRA (docs/finetune.md, "LoRA"): the adapter's settings from the flags or from
// --adapter's adapter_config.json, checked before anything is built; the adapters added to the
// model, their values loaded from --adapter, and the base's weights loaded frozen; the trained
// adapters written in PEFT's layout, which PEFT's PeftModel.from_pretrained(base, OUT), vLLM's
// --enable-lora and `cxxlaunch merge-weights --lora OUT --base MODEL MERGED` read.
//
// Thread-safety: none needed (one training thread).

#include <optional>
#include <string>
#include <vector>

#include "apps/finetune/flags.h"
#include "apps/finetune/model_folder.h"
#include "models/llama.h"
#include "models/lora.h"
#include "runtime/accelerator.h"

namespace cxxlaunch::finetune {

struct LoraRun {
  models::LoraConfig config;
  std::string adapter;               // --adapter's folder, or ""
  std::vector<std::string> adapted;  // the modules that have adapters, once added
  std::string base;                  // --model_dir, as adapter_config.json names it
};

// nullopt for a full fine-tune. InvalidArgument (exit 2) for a bad --lora_* value, or an
// --adapter folder that is not a PEFT LoRA adapter this build runs.
std::optional<LoraRun> loraRunOf(const Flags& flags);

// After the model is built, in the same deferredInit scope: adds the adapters (freezing the
// base) and gives them --adapter's values if there is one; the base's come from
// Accelerator::loadModel after prepare, which keeps the adapters' values. InvalidArgument for a
// target that matches nothing, a rank larger than a layer, an adapter that does not match the
// model (shapes named).
void addAdapters(models::LlamaForCausalLMImpl& model, LoraRun& run);

// "LoRA r 8 alpha 16 (scale 2) on q_proj, v_proj in 4 modules: 1024 trainable parameters of
// 113472 (0.902%)"
std::string describe(const LoraRun& run, const torch::nn::Module& model);

// The test hook (docs/finetune.md, "LoRA"): with it set to a file name, rank 0 writes every
// frozen parameter as it is in memory after training, by name, into that safetensors file, so
// that the tests can compare the base's bytes with the folder's.
inline constexpr char kDumpFrozenEnv[] = "CXXLAUNCH_FINETUNE_DUMP_FROZEN";
void dumpFrozenIfAsked(runtime::Accelerator& acc, const torch::nn::Module& model);

// A collective: the adapters gathered from their shards (Accelerator::fullParameters) and
// written by rank 0 as PEFT's save_pretrained writes them into OUT (output.h's writeAdapter).
void writeAdapterExport(runtime::Accelerator& acc, const LoraRun& run, const std::string& out,
                        const std::string& model_dir, const std::vector<CopiedFile>& files);

}  // namespace cxxlaunch::finetune
