#pragma once
// The header of one safetensors file (checkpoint/safetensors.h), parsed and checked without
// LibTorch, so that the fuzz target (tests/fuzz/safetensors_fuzz.cc) builds it alone.

#include <cstdint>
#include <string>
#include <vector>

namespace cxxlaunch::runtime::checkpoint {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "BF16", ... (safetensorsDtypeSize knows them)
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // from the data's start
};

// Bytes per element of a safetensors dtype name; 0 for a name it does not have.
size_t safetensorsDtypeSize(const std::string& dtype);

// A file's header (the JSON text), checked against the `data_bytes` that follow it: known
// dtypes, sizes for shapes (overflow-safe), offsets inside the data and matching each tensor's
// bytes, no two tensors overlapping. Throws InvalidArgument saying what is wrong.
std::vector<SafetensorsEntry> parseSafetensorsHeader(const std::string& json, uint64_t data_bytes);

}  // namespace cxxlaunch::runtime::checkpoint
