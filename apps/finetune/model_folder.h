#pragma once
// finetune's model folder: its config and weights checked before anything is allocated, the
// files OUT gets besides the weights, and the parameters as Trainer groups them for weight decay.
//
// Thread-safety: none needed (no shared state).

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>

#include <cstddef>
#include <string>
#include <vector>

#include "models/llama.h"

namespace cxxlaunch::finetune {

// A file of the model folder that OUT gets besides the weights, at most `max_bytes`.
struct CopiedFile {
  const char* name;
  size_t max_bytes;
};

// Whether `path` names anything, a dangling or looping link included (which then fails loudly
// when opened, rather than being skipped).
bool present(const std::string& path);

// The folder's config.json; InvalidArgument for a folder that is none, has no config.json, or a
// --seq_len beyond max_position_embeddings.
models::LlamaConfig readConfig(const std::string& model_dir, int64_t seq_len);

// Refuses a config whose sizes describe more parameters than the folder's safetensors files
// hold, before anything is allocated.
void requireWeightsFor(const models::LlamaConfig& config, const std::string& model_dir);

// The folder's config.json and tokenizer files (checkpoint/model_folder.h) there are, each
// opened once now (a FIFO or a directory in a file's place is refused before training).
std::vector<CopiedFile> filesToCopy(const std::string& model_dir);

// Trainer's weight-decay grouping (get_decay_parameter_names): AdamW `options` for every
// parameter except biases and the weights of normalisation modules (a module whose type name
// holds "Norm", such as LlamaRMSNorm), which form a second group with weight decay 0. Empty
// groups are left out, and so are frozen parameters (requires_grad false: a LoRA run's base).
std::vector<torch::optim::OptimizerParamGroup> decayGroups(
    const torch::nn::Module& model, const torch::optim::AdamWOptions& options);

}  // namespace cxxlaunch::finetune
