#include "apps/finetune/model_folder.h"

#include <sys/stat.h>
#include <torch/optim/adamw.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>

#include "apps/examples/tokens.h"
#include "common/error.h"
#include "common/file.h"
#include "runtime/checkpoint/safetensors.h"
#include "tensorfile/model_folder.h"

namespace cxxlaunch::finetune {

namespace fs = std::filesystem;
using models::LlamaConfig;

bool present(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

LlamaConfig readConfig(const std::string& model_dir, int64_t seq_len) {
  struct stat st {};
  if (::stat(model_dir.c_str(), &st) != 0) {  // ELOOP, ENOENT, EACCES: said as they are
    throw InvalidArgument("--model_dir '" + model_dir + "': " + std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode))
    throw InvalidArgument("--model_dir '" + model_dir + "' is not a folder");
  const std::string path = model_dir + "/config.json";
  if (!present(path)) {
    throw InvalidArgument("--model_dir '" + model_dir + "' has no config.json (" + path +
                          "): give a Hugging Face model folder (llama_init writes one)");
  }
  LlamaConfig config = LlamaConfig::fromFile(path);
  if (seq_len > config.max_position_embeddings) {
    throw InvalidArgument("--seq_len " + std::to_string(seq_len) +
                          " is longer than the model's max_position_embeddings " +
                          std::to_string(config.max_position_embeddings) + " (" + path + ")");
  }
  return config;
}

// A vocab_size or num_hidden_layers typed with extra zeros would otherwise allocate (or, built
// deferred, grow module by module) without bound.
void requireWeightsFor(const LlamaConfig& config, const std::string& model_dir) {
  double held = 0;
  try {
    const runtime::checkpoint::SafetensorsReader reader(model_dir);
    for (const auto& [name, entry] : reader.entries()) {
      double numel = 1;
      for (const int64_t d : entry.shape) numel *= static_cast<double>(d);
      held += numel;
    }
  } catch (const fs::filesystem_error& e) {
    throw InvalidArgument("--model_dir '" + model_dir + "': " + e.code().message());
  }
  const double wanted = config.parameterCount();
  if (wanted > held) {
    char line[160];
    std::snprintf(line, sizeof(line),
                  "describes %.4g parameters, and the safetensors files hold %.4g", wanted, held);
    throw InvalidArgument(model_dir + "/config.json " + line +
                          ": the config does not fit the weights (check vocab_size, hidden_size, "
                          "intermediate_size and num_hidden_layers)");
  }
}

std::vector<CopiedFile> filesToCopy(const std::string& model_dir) {
  std::vector<CopiedFile> files;
  for (const char* name : tensorfile::kModelFolderFiles) {
    const std::string_view view(name);
    const CopiedFile file{name, view.starts_with("tokenizer.") ? examples::kMaxTokenizerBytes
                                                               : LlamaConfig::kMaxConfigBytes};
    const std::string path = model_dir + "/" + file.name;
    if (!present(path)) continue;
    (void)openRegularFile(path, "the model's " + std::string(file.name), file.max_bytes);
    files.push_back(file);
  }
  return files;
}

std::vector<torch::optim::OptimizerParamGroup> decayGroups(
    const torch::nn::Module& model, const torch::optim::AdamWOptions& options) {
  // The parameters that do not decay, by identity: a norm module's own, and every bias.
  std::set<const void*> exempt;
  for (const auto& item : model.named_modules()) {
    if (item.value()->name().find("Norm") == std::string::npos) continue;
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
      exempt.insert(p.value().unsafeGetTensorImpl());
    }
  }
  std::vector<torch::Tensor> decay, no_decay;
  std::set<const void*> seen;  // a tied weight once
  for (const auto& item : model.named_parameters()) {
    const torch::Tensor& p = item.value();
    if (!p.requires_grad()) continue;  // frozen (a LoRA run's base): not the optimizer's
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    const bool bias = item.key() == "bias" || item.key().ends_with(".bias");
    (bias || exempt.contains(p.unsafeGetTensorImpl()) ? no_decay : decay).push_back(p);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  // A group's options are all of its options (LibTorch does not merge them with the defaults).
  auto add = [&](std::vector<torch::Tensor> params, double decay_rate) {
    if (params.empty()) return;
    auto group = std::make_unique<torch::optim::AdamWOptions>(options);
    group->weight_decay(decay_rate);
    groups.emplace_back(std::move(params), std::move(group));
  };
  add(std::move(decay), options.weight_decay());
  add(std::move(no_decay), 0.0);
  return groups;
}

}  // namespace cxxlaunch::finetune
