// libFuzzer target for the safetensors header and index parsers
// (tensorfile/safetensors_header.h): any bytes as a header, with any data size after it,
// either parse or fail with InvalidArgument; what parses lies inside the data, matches its dtype
// and shape, and does not overlap. The same bytes as an index parse or fail alike, and every
// file they name is a plain name.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/error.h"
#include "tensorfile/safetensors_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cxxlaunch::tensorfile;
  if (size < 4) return 0;
  uint32_t data_bytes = 0;  // the first 4 bytes: how much data follows the header
  std::memcpy(&data_bytes, data, 4);
  const std::string header(reinterpret_cast<const char*>(data) + 4, size - 4);
  try {
    for (const auto& e : parseSafetensorsHeader(header, data_bytes)) {
      uint64_t elements = 1;
      for (int64_t d : e.shape) elements *= static_cast<uint64_t>(d);
      if (e.begin > e.end || e.end > data_bytes ||
          e.end - e.begin != elements * safetensorsDtypeSize(e.dtype)) {
        std::abort();
      }
    }
  } catch (const cxxlaunch::InvalidArgument&) {
  }
  try {
    for (const auto& [file, tensors] : parseSafetensorsIndex(header)) {
      if (file.find('/') != std::string::npos || tensors.empty()) std::abort();
    }
  } catch (const cxxlaunch::InvalidArgument&) {
  }
  return 0;
}
