#pragma once
// Safetensors read as raw bytes, without LibTorch (the format: runtime/checkpoint/safetensors.h):
// one file, or a Hugging Face model folder (model.safetensors, or model.safetensors.index.json and
// the files it names). `cxxlaunch merge-weights --lora` reads the base model and the adapter
// through it in the launcher's binary. Every header is read and checked when it is opened (a
// truncated or corrupt file is named before anything is read); the data only as asked.
//
// Thread-safety: const after construction; read() may be called from several threads.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tensorfile/safetensors_header.h"

namespace cxxlaunch::tensorfile {

class SafetensorsFolder {
 public:
  struct File {
    std::string name;                       // as the index names it (or the file's own name)
    std::vector<SafetensorsEntry> tensors;  // in the order of their data; offsets from its start
  };

  // `path`: a .safetensors file, or a folder with an index or a model.safetensors. Throws
  // InvalidArgument naming the file for one that is missing, truncated or corrupt, and for an
  // index that names a tensor its file lacks.
  explicit SafetensorsFolder(const std::string& path);
  ~SafetensorsFolder();
  SafetensorsFolder(const SafetensorsFolder&) = delete;
  SafetensorsFolder& operator=(const SafetensorsFolder&) = delete;

  // Whether `path` was a folder with an index (several files).
  bool indexed() const { return indexed_; }
  const std::vector<File>& files() const { return files_; }
  // The tensor `name`, or nullptr.
  const SafetensorsEntry* find(const std::string& name) const;
  // `bytes` bytes of tensor `name`'s data from `offset` (both within it) into `out`. Throws
  // InvalidArgument naming the file when it is shorter than its header said.
  void read(const std::string& name, uint64_t offset, size_t bytes, void* out) const;

 private:
  struct Open;
  bool indexed_ = false;
  std::vector<File> files_;
  std::vector<std::unique_ptr<Open>> open_;                 // per file
  std::map<std::string, std::pair<size_t, size_t>> where_;  // name -> (file, tensor)
};

}  // namespace cxxlaunch::tensorfile
