#pragma once
// Writing safetensors files (the format: checkpoint/safetensors.h) from raw bytes, without
// LibTorch: the header first, from the tensors' names, dtypes and shapes, then each tensor's data
// streamed in, so that a writer never holds more than the piece it appends. The runtime's
// SafetensorsWriter (tensors in hand) and `cxxlaunch merge-weights` (a checkpoint read piece by
// piece) both write through it, so the files are the same either way.
//
// Thread-safety: none; one writer per file.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/atomic_file.h"

namespace cxxlaunch::tensorfile {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", ... (safetensors_header.h's safetensorsDtypeSize)
  std::vector<int64_t> shape;
};

// The tensor's bytes: its dtype's size times its elements. Throws InvalidArgument for a dtype
// safetensors does not have or a negative size.
uint64_t safetensorsBytes(const SafetensorsTensor& tensor);

// What a file holding `tensors` (in this order) starts with: 8 bytes of little-endian length, then
// the JSON header, padded so that the data starts 8-byte aligned. Its data follows, each tensor's
// at the header's offsets.
std::string safetensorsHead(const std::vector<SafetensorsTensor>& tensors);

// One file at `path`, written durably (temporary name, fsync, rename, fsync of the folder): the
// header at once, then append() the tensors' data in their order, then commit(). Nothing is
// visible at `path` before commit(); destroyed uncommitted, the temporary file is removed.
class SafetensorsFileWriter {
 public:
  SafetensorsFileWriter(const std::string& path, const std::vector<SafetensorsTensor>& tensors);
  void append(const void* data, size_t bytes);
  // Throws InvalidArgument when the bytes appended are not the tensors' (nothing is written).
  void commit();

 private:
  std::string path_;
  AtomicFile file_;
  uint64_t expected_ = 0, appended_ = 0;
};

inline constexpr char kSafetensorsIndexName[] = "model.safetensors.index.json";

// File `i` of `n`: model.safetensors when n is 1, else model-0000<i+1>-of-0000<n>.safetensors.
std::string safetensorsFileName(size_t i, size_t n);

// Where tensors of these sizes, in this order, are split into files of at most `max_file_bytes`
// of data (a tensor bigger than that gets a file of its own): the index of each file's first
// tensor. Throws InvalidArgument when max_file_bytes is 0.
std::vector<size_t> safetensorsFileStarts(const std::vector<uint64_t>& bytes,
                                          uint64_t max_file_bytes);

// `dir`/model.safetensors.index.json, durably: {"metadata": {"total_size": total_bytes},
// "weight_map": {tensor: file}}.
void writeSafetensorsIndex(const std::string& dir, uint64_t total_bytes,
                           const std::vector<std::pair<std::string, std::string>>& weight_map);

}  // namespace cxxlaunch::tensorfile
