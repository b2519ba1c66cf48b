#include "tensorfile/safetensors_header.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/error.h"

namespace cxxlaunch::tensorfile {
namespace {

using nlohmann::json;

// The parsers below read the JSON as events (nlohmann's SAX) and keep only what they return, so
// that their memory follows what is kept, not the input: a DOM of a 95 MB header of `[{},{},...]`
// took 3.3 GB. Any structure these files cannot have stops the parse at once; what they may hold
// but we do not use (`__metadata__`, unknown fields) is skipped, nested at most kMaxDepth deep.
constexpr int kMaxDepth = 16;
constexpr size_t kMaxDims = 64;

// The common part of both parsers: the events of a value being skipped, and errors.
class Events {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  // Why the parse stopped, when a handler refused something (else empty).
  const std::string& refusal() const { return refusal_; }

  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& e) {
    throw InvalidArgument(std::string("not JSON (") + e.what() + ")");
  }

 protected:
  bool refuse(const std::string& why) {
    refusal_ = why;
    return false;
  }
  // Skipping a container's contents: `skipping_` levels deep; true while skipping.
  bool skipOpen() {
    if (++skipping_ > kMaxDepth) return refuse("nested deeper than " + std::to_string(kMaxDepth));
    return true;
  }
  bool skipClose() {
    --skipping_;
    return true;
  }
  int skipping_ = 0;

 private:
  std::string refusal_;
};

// Runs `events` over `text`; throws InvalidArgument with the reason when it refused.
template <typename Sax>
void parseWith(const std::string& text, Sax& events) {
  if (!json::sax_parse(text, &events) && !events.refusal().empty()) {
    throw InvalidArgument(events.refusal());
  }
}

struct RawEntry {
  std::string name;
  std::optional<std::string> dtype;
  std::vector<uint64_t> shape, offsets;
  bool has_shape = false, has_offsets = false;
};

class HeaderEvents final : public Events {
 public:
  static constexpr size_t kMaxTensors = size_t{1} << 18;
  std::vector<RawEntry> entries;

  bool null() { return scalar(false); }
  bool boolean(bool) { return scalar(false); }
  bool number_integer(number_integer_t) { return scalar(false); }
  bool number_unsigned(number_unsigned_t value) {
    if (skipping_ == 0 && depth_ == 3 && (field_ == kShape || field_ == kOffsets)) {
      auto& list = field_ == kShape ? entries.back().shape : entries.back().offsets;
      if (list.size() == (field_ == kShape ? kMaxDims : 2)) return refuse(tooMany());
      list.push_back(value);
      return true;
    }
    return scalar(false);
  }
  bool number_float(number_float_t, const string_t&) { return scalar(false); }
  bool binary(binary_t&) { return scalar(false); }
  bool string(string_t& value) {
    if (skipping_ == 0 && depth_ == 2 && field_ == kDtype) {
      entries.back().dtype = std::move(value);
      return true;
    }
    return scalar(false);
  }
  bool start_object(size_t) {
    if (skipping_ > 0 || metadata_ || (depth_ == 2 && field_ == kOther)) return skipOpen();
    if (depth_ == 0 || depth_ == 1) {
      ++depth_;
      return true;
    }
    return scalar(true);
  }
  bool key(string_t& name) {
    if (skipping_ > 0) return true;
    if (depth_ == 1) {
      metadata_ = name == "__metadata__";
      if (metadata_) return true;
      if (entries.size() == kMaxTensors) {
        return refuse("more than " + std::to_string(kMaxTensors) + " tensors");
      }
      entries.emplace_back().name = std::move(name);
    } else if (depth_ == 2) {
      field_ = name == "dtype"          ? kDtype
               : name == "shape"        ? kShape
               : name == "data_offsets" ? kOffsets
                                        : kOther;
    }
    return true;
  }
  bool end_object() {
    if (skipping_ > 0) return skipClose();
    if (depth_ == 1) return true;  // the header's end
    --depth_;
    field_ = kNone;
    return true;
  }
  bool start_array(size_t) {
    if (skipping_ > 0 || metadata_ || (depth_ == 2 && field_ == kOther)) return skipOpen();
    if (depth_ == 0) return refuse("not a JSON object");
    if (depth_ == 2 && (field_ == kShape || field_ == kOffsets)) {
      (field_ == kShape ? entries.back().has_shape : entries.back().has_offsets) = true;
      ++depth_;
      return true;
    }
    return scalar(true);
  }
  bool end_array() {
    if (skipping_ > 0) return skipClose();
    --depth_;
    return true;
  }

 private:
  enum Field { kNone, kDtype, kShape, kOffsets, kOther };

  // A value other than the ones kept, at the current place (`container`: it opens one).
  bool scalar(bool container) {
    if (skipping_ > 0 || metadata_) {
      if (skipping_ == 0 && depth_ == 1) metadata_ = false;  // a scalar __metadata__ ends there
      return container ? skipOpen() : true;
    }
    switch (depth_) {
      case 0:
        return refuse("not a JSON object");
      case 1:
        return refuse("tensor '" + entries.back().name + "': not an object");
      case 2:
        if (field_ == kOther) return container ? skipOpen() : true;
        return refuse("tensor '" + entries.back().name + "': " + wrongValue());
      default:
        return refuse("tensor '" + entries.back().name + "': " +
                      (field_ == kShape ? "shape holds something other than a size"
                                        : "data_offsets are not sizes"));
    }
  }
  std::string wrongValue() const {
    return field_ == kDtype   ? "no dtype"
           : field_ == kShape ? "no shape"
                              : "data_offsets is not [begin, end]";
  }
  std::string tooMany() const {
    return "tensor '" + entries.back().name + "': " +
           (field_ == kShape ? "shape has more than " + std::to_string(kMaxDims) + " dimensions"
                             : "data_offsets is not [begin, end]");
  }

  int depth_ = 0;  // 1: in the header, 2: in a tensor, 3: in its shape or offsets
  Field field_ = kNone;
  bool metadata_ = false;  // in __metadata__'s value
};

class IndexEvents final : public Events {
 public:
  static constexpr size_t kMaxTensors = size_t{1} << 20;
  std::map<std::string, std::set<std::string>> by_file;
  bool has_weight_map = false;

  bool null() { return scalar(false); }
  bool boolean(bool) { return scalar(false); }
  bool number_integer(number_integer_t) { return scalar(false); }
  bool number_unsigned(number_unsigned_t) { return scalar(false); }
  bool number_float(number_float_t, const string_t&) { return scalar(false); }
  bool binary(binary_t&) { return scalar(false); }
  bool string(string_t& file) {
    if (skipping_ > 0 || depth_ != 2) return scalar(false);
    if (file.find('/') != std::string::npos) return refuse(noFile());
    if (++tensors_ > kMaxTensors) {
      return refuse("more than " + std::to_string(kMaxTensors) + " tensors in its weight_map");
    }
    by_file[std::move(file)].insert(std::move(tensor_));
    return true;
  }
  bool start_object(size_t) {
    if (skipping_ > 0 || (depth_ == 1 && !in_map_)) return skipOpen();
    if (depth_ == 0 || depth_ == 1) {
      has_weight_map = has_weight_map || depth_ == 1;
      ++depth_;
      return true;
    }
    return refuse(noFile());
  }
  bool key(string_t& name) {
    if (skipping_ > 0) return true;
    if (depth_ == 1) in_map_ = name == "weight_map";
    if (depth_ == 2) tensor_ = std::move(name);
    return true;
  }
  bool end_object() {
    if (skipping_ > 0) return skipClose();
    --depth_;
    return true;
  }
  bool start_array(size_t) {
    if (skipping_ > 0 || (depth_ == 1 && !in_map_)) return skipOpen();
    return depth_ == 0 ? refuse("not a JSON object") : refuse(depth_ == 1 ? noMap() : noFile());
  }
  bool end_array() { return skipClose(); }

 private:
  bool scalar(bool) {
    if (skipping_ > 0 || (depth_ == 1 && !in_map_)) return true;
    return depth_ == 0 ? refuse("not a JSON object") : refuse(depth_ == 1 ? noMap() : noFile());
  }
  std::string noMap() const { return "its weight_map is not an object"; }
  std::string noFile() const { return "tensor '" + tensor_ + "' maps to no file name"; }

  int depth_ = 0;  // 1: in the index, 2: in its weight_map
  bool in_map_ = false;
  std::string tensor_;
  size_t tensors_ = 0;
};

}  // namespace

size_t safetensorsDtypeSize(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
  return 0;
}

std::vector<SafetensorsEntry> parseSafetensorsHeader(const std::string& text, uint64_t data_bytes) {
  HeaderEvents events;
  parseWith(text, events);
  std::vector<SafetensorsEntry> entries;
  entries.reserve(events.entries.size());
  for (RawEntry& raw : events.entries) {
    auto bad = [&](const std::string& why) {
      return InvalidArgument("tensor '" + raw.name + "': " + why);
    };
    if (!raw.dtype) throw bad("no dtype");
    if (!raw.has_shape) throw bad("no shape");
    if (!raw.has_offsets || raw.offsets.size() != 2) throw bad("data_offsets is not [begin, end]");
    SafetensorsEntry e;
    e.name = raw.name;  // kept in `raw` for bad()
    e.dtype = std::move(*raw.dtype);
    const uint64_t item = safetensorsDtypeSize(e.dtype);
    if (item == 0) throw bad("unknown dtype " + json(e.dtype).dump());
    uint64_t elements = 1;
    for (const uint64_t size : raw.shape) {
      if (size > (uint64_t{1} << 53)) throw bad("shape holds something other than a size");
      if (size != 0 && elements > std::numeric_limits<uint64_t>::max() / size) {
        throw bad("shape overflows");
      }
      elements *= size;
      e.shape.push_back(static_cast<int64_t>(size));
    }
    e.begin = raw.offsets[0];
    e.end = raw.offsets[1];
    if (e.begin > e.end) throw bad("data_offsets end before they begin");
    if (e.end > data_bytes) {
      throw bad("its data ends at byte " + std::to_string(e.end) + " but the file holds " +
                std::to_string(data_bytes) + " bytes of data (truncated?)");
    }
    if (elements > std::numeric_limits<uint64_t>::max() / item ||
        e.end - e.begin != elements * item) {
      throw bad("data_offsets do not match its dtype and shape");
    }
    entries.push_back(std::move(e));
  }
  // A tensor of no elements overlaps nothing, wherever its offset (and whatever its name).
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : entries) {
    if (e.end > e.begin) by_offset.push_back(&e);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      throw InvalidArgument("tensors '" + by_offset[i - 1]->name + "' and '" + by_offset[i]->name +
                            "' overlap");
    }
  }
  std::vector<const SafetensorsEntry*> by_name;
  for (const auto& e : entries) by_name.push_back(&e);
  std::sort(by_name.begin(), by_name.end(),
            [](const auto* a, const auto* b) { return a->name < b->name; });
  for (size_t i = 1; i < by_name.size(); ++i) {
    if (by_name[i]->name == by_name[i - 1]->name) {
      throw InvalidArgument("tensor '" + by_name[i]->name + "' appears twice");
    }
  }
  return entries;
}

std::map<std::string, std::set<std::string>> parseSafetensorsIndex(const std::string& text) {
  IndexEvents events;
  parseWith(text, events);
  if (!events.has_weight_map) throw InvalidArgument("it has no weight_map");
  return std::move(events.by_file);
}

}  // namespace cxxlaunch::tensorfile
