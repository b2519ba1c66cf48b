#pragma once
// finetune's output folder OUT: this run's checkpoints (checkpoint-<step>, unless the launch
// names another folder for them) and, at the end, the fine-tuned model at OUT's top level.
//
// The export is staged: the weights and the model folder's files are written into the hidden
// folder OUT/.export.partial, then moved into OUT one by one with config.json last, so that a
// loader (which needs config.json) never sees a half model, and a failure on the way removes
// what it wrote (the checkpoints stay: they are what a rerun resumes from).
//
// Thread-safety: none needed (no shared state).

#include <string>
#include <utility>
#include <vector>

#include "apps/finetune/model_folder.h"
#include "runtime/accelerator.h"

namespace cxxlaunch::finetune {

// The staging folder's name inside OUT.
inline constexpr char kExportStaging[] = ".export.partial";
// A LoRA run's export, PEFT's save_pretrained's files.
inline constexpr char kAdapterConfig[] = "adapter_config.json";
inline constexpr char kAdapterWeights[] = "adapter_model.safetensors";

// OUT given to --output_dir, lexically normal and without a trailing separator. Throws
// InvalidArgument, before any work, where the run cannot use it: it names no folder of its own
// ("." or ".."), is a symbolic link, a file, or a folder above it is not one or cannot be
// written; it holds a finished model (a config.json: fine-tuned by an earlier run) or adapter
// (an adapter_config.json); or it holds
// anything but this program's own files (checkpoint-<step> folders and their staging names, the
// export's staging folder, the weights and tokenizer files of an export cut short before its
// config.json was moved in).
std::string checkOutputDir(const std::string& value);

// A collective: writes the model (Accelerator::saveModel) and `files` of `model_dir` as the HF
// folder OUT, as said above. Throws on every rank when rank 0 could not write it.
void writeModel(runtime::Accelerator& acc, const std::string& out, const std::string& model_dir,
                const std::vector<CopiedFile>& files);

// The same for a LoRA run's adapter in PEFT's layout: `tensors` (PEFT's keys, the same on every
// rank) as adapter_model.safetensors and `adapter_config` as adapter_config.json, which is moved
// in last; the tokenizer files of `files` beside them (no config.json: PEFT writes none).
void writeAdapter(runtime::Accelerator& acc, const std::string& out, const std::string& model_dir,
                  const std::vector<CopiedFile>& files, const std::string& adapter_config,
                  const std::vector<std::pair<std::string, torch::Tensor>>& tensors);

}  // namespace cxxlaunch::finetune
