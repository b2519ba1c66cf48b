#pragma once
// safetensors, the weights format other tools read (Hugging Face's): 8 bytes of little-endian
// header length N, N bytes of JSON — {"<name>": {"dtype": "F32", "shape": [..],
// "data_offsets": [begin, end]}, ..., "__metadata__": {"format": "pt"}} — then the raw data,
// offsets counted from the header's end. A model bigger than a file's limit is split into
// model-00001-of-0000N.safetensors ... with model.safetensors.index.json ({"metadata":
// {"total_size": bytes}, "weight_map": {"<name>": "<file>"}}); a model that fits is
// model.safetensors.
//
// Reading checks everything before it touches the data: the header's length against the file,
// the JSON's shape, each dtype, shape and offset range (overflow-safe), that each tensor's bytes
// match its shape, and that no two tensors overlap. A bad file gets one InvalidArgument naming
// it, never a crash or an out-of-bounds read.
//
// Thread-safety: none.

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tensorfile/safetensors_header.h"

namespace cxxlaunch::tensorfile {
class SafetensorsFolder;
}  // namespace cxxlaunch::tensorfile

namespace cxxlaunch::runtime::checkpoint {

// The safetensors dtype of a LibTorch type ("F32", "BF16", ...); InvalidArgument for one it lacks.
const char* safetensorsDtypeName(c10::ScalarType type);

// A model's tensors, known in advance, written in any order as they come (a sharded model
// gathers one unit at a time): the files' layout and headers follow from the plan, each tensor
// goes straight to its place, and nothing is held beyond the tensor in hand.
class SafetensorsWriter {
 public:
  struct Planned {
    std::string name;
    std::vector<int64_t> shape;
    c10::ScalarType dtype;
  };
  // Files go into `dir` (created), the plan's tensors in the plan's order, each file holding at
  // most `max_file_bytes` of tensor data (a bigger tensor gets a file of its own), under
  // temporary names until finish().
  SafetensorsWriter(std::string dir, uint64_t max_file_bytes, std::vector<Planned> plan);
  ~SafetensorsWriter();  // unfinished: removes what it wrote
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Writes the planned tensor `name` (its shape and dtype as planned) into its place.
  void add(const std::string& name, const torch::Tensor& tensor);
  // Once every planned tensor was added: makes the files durable, gives them their final names
  // (model.safetensors, or model-0000k-of-0000n.safetensors and the index). Returns them.
  std::vector<std::string> finish();

 private:
  struct Place {
    size_t file;
    uint64_t offset;  // in the file
    Planned planned;
    bool written = false;
  };
  std::string dir_;
  std::vector<std::string> temporary_;           // per file
  std::vector<int> fds_;                         // per file
  std::vector<std::vector<std::string>> names_;  // per file
  std::map<std::string, Place> places_;
  uint64_t total_bytes_ = 0;
  bool finished_ = false;
};

// One safetensors file at `path`, written durably (temporary name, fsync, rename).
void writeSafetensorsFile(const std::string& path,
                          const std::vector<std::pair<std::string, torch::Tensor>>& tensors);

// A safetensors file or folder (its index and the files it names, or its model.safetensors),
// opened for reading by parts: every header is read and checked at once (a truncated or corrupt
// file is named before anything is read), the data only as asked, so a rank that loads its
// shards reads their bytes and no others.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  // Every tensor's dtype and shape, by name (the index's names, where there is one).
  const std::map<std::string, tensorfile::SafetensorsEntry>& entries() const { return entries_; }
  // Elements [begin, end) of tensor `name` in row-major order, as float32 (from F32, BF16, F16
  // or F64). Throws InvalidArgument naming the file for one that is shorter than its header said.
  void readFloat(const std::string& name, int64_t begin, int64_t end, float* out) const;
  // The whole tensor, in its own dtype.
  torch::Tensor tensor(const std::string& name) const;
  // What names these weights (a LoRA checkpoint's reference to its base): "sha256:" and the
  // SHA-256 of every tensor's name, dtype, shape and three samples of its bytes (up to 4 KiB at
  // its start, middle and end), in name order. Cheap at any size (12 KiB a tensor read), the same
  // however the model is split into files, and another for another model or another fine-tune
  // of the same one (every tensor changes); a change confined to bytes between the samples goes
  // unseen.
  std::string fingerprint() const;

 private:
  std::string path_;
  std::unique_ptr<tensorfile::SafetensorsFolder> folder_;  // the files, read without LibTorch
  std::map<std::string, tensorfile::SafetensorsEntry>
      entries_;  // by name; `begin`/`end` as in its file
};

// Every tensor of a safetensors file, or of a folder (its index, or its model.safetensors).
void readSafetensors(const std::string& path,
                     const std::function<void(const std::string&, const torch::Tensor&)>& visit);

}  // namespace cxxlaunch::runtime::checkpoint
