#pragma once
// An exported model (safetensors, ours or another tool's: checkpoint/safetensors.h) as a
// checkpoint Source: parameters only, no optimizer state, no counters. What
// Accelerator::loadModel reads from. Only the headers are read up front; each read() reads its
// elements' bytes, so a rank holding shards reads those parts of the files and no more.
//
// Thread-safety: const after construction.

#include <torch/nn/module.h>

#include <optional>
#include <string>
#include <vector>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/safetensors.h"

namespace cxxlaunch::runtime::checkpoint {

class ModelSource final : public tensorfile::Source {
 public:
  // Reads `dir` (a file, or a folder with model.safetensors or an index and its shards).
  explicit ModelSource(const std::string& dir);
  void read(const std::string& param, const std::string& array, int64_t begin, int64_t end,
            const std::vector<int64_t>& shape, float* out) const override;
  bool has(const std::string& param, const std::string& array) const override;
  std::optional<std::string> counter(const std::string&) const override { return std::nullopt; }
  // The tensor `name` in its own dtype, or an undefined tensor.
  torch::Tensor tensor(const std::string& name) const;
  // What keeps the export from loading into `model`, as transformers lists it in one error:
  // the model's tensors it lacks, its tensors the model lacks, and those of another shape. Empty
  // when it fits. With `absent_trainable`, the model's trainable parameters the export lacks
  // (the adapters of a LoRA model, whose base this is) are no mismatch but listed there.
  std::string mismatch(const torch::nn::Module& model,
                       std::vector<std::string>* absent_trainable = nullptr) const;
  // The weights' fingerprint (SafetensorsReader::fingerprint): what a LoRA checkpoint records
  // of its base, to tell at resume whether the base loaded then is the same.
  std::string fingerprint() const { return files_.fingerprint(); }

 private:
  std::string dir_;
  SafetensorsReader files_;
};

}  // namespace cxxlaunch::runtime::checkpoint
