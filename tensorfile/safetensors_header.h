#pragma once
// The header of one safetensors file (checkpoint/safetensors.h), parsed and checked without
// LibTorch, so that the fuzz target (tests/fuzz/safetensors_fuzz.cc) builds it alone.

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace cxxlaunch::tensorfile {

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
// bytes, no two tensors overlapping or of one name. Throws InvalidArgument saying what is wrong.
// Memory follows the entries kept, not the text: `__metadata__` and unknown fields are skipped,
// anything else a header cannot hold (an array at the top, nesting past 16 levels, more than 2^18
// tensors or 64 dimensions) stops the parse where it is met.
std::vector<SafetensorsEntry> parseSafetensorsHeader(const std::string& json, uint64_t data_bytes);

// A sharded export's model.safetensors.index.json: each file's tensors, from its weight_map (the
// rest skipped, as above; at most 2^20 tensors). Throws InvalidArgument saying what is wrong.
std::map<std::string, std::set<std::string>> parseSafetensorsIndex(const std::string& json);

}  // namespace cxxlaunch::tensorfile
