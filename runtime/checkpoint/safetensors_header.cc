#include "runtime/checkpoint/safetensors_header.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace cxxlaunch::runtime::checkpoint {

using nlohmann::json;

size_t safetensorsDtypeSize(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
  return 0;
}

std::vector<SafetensorsEntry> parseSafetensorsHeader(const std::string& text, uint64_t data_bytes) {
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    throw InvalidArgument(std::string("its header is not JSON (") + e.what() + ")");
  }
  if (!header.is_object()) throw InvalidArgument("its header is not a JSON object");
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string tensor = name;  // (clang 14 cannot capture a structured binding)
    auto bad = [&](const std::string& why) {
      return InvalidArgument("tensor '" + tensor + "': " + why);
    };
    if (!value.is_object()) throw bad("not an object");
    const auto dtype = value.find("dtype");
    const auto shape = value.find("shape");
    const auto offsets = value.find("data_offsets");
    if (dtype == value.end() || !dtype->is_string()) throw bad("no dtype");
    if (shape == value.end() || !shape->is_array()) throw bad("no shape");
    if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2) {
      throw bad("data_offsets is not [begin, end]");
    }
    SafetensorsEntry e;
    e.name = name;
    e.dtype = dtype->get<std::string>();
    const uint64_t item = safetensorsDtypeSize(e.dtype);
    if (item == 0) throw bad("unknown dtype " + dtype->dump());
    uint64_t elements = 1;
    for (const auto& d : *shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 53)) {
        throw bad("shape holds something other than a size");
      }
      const uint64_t size = d.get<uint64_t>();
      if (size != 0 && elements > std::numeric_limits<uint64_t>::max() / size) {
        throw bad("shape overflows");
      }
      elements *= size;
      e.shape.push_back(static_cast<int64_t>(size));
    }
    if (!(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      throw bad("data_offsets are not sizes");
    }
    e.begin = (*offsets)[0].get<uint64_t>();
    e.end = (*offsets)[1].get<uint64_t>();
    if (e.begin > e.end || e.end > data_bytes) throw bad("data_offsets outside the file");
    if (elements > std::numeric_limits<uint64_t>::max() / item ||
        e.end - e.begin != elements * item) {
      throw bad("data_offsets do not match its dtype and shape");
    }
    entries.push_back(std::move(e));
  }
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      throw InvalidArgument("tensors '" + by_offset[i - 1]->name + "' and '" + by_offset[i]->name +
                            "' overlap");
    }
  }
  return entries;
}

}  // namespace cxxlaunch::runtime::checkpoint
