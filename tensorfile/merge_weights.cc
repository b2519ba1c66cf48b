#include "tensorfile/merge_weights.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string_view>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/file.h"
#include "tensorfile/checkpoint_schema.h"
#include "tensorfile/manifest.h"
#include "tensorfile/merge_output.h"
#include "tensorfile/model_folder.h"
#include "tensorfile/reader.h"
#include "tensorfile/safetensors_file.h"
#include "tensorfile/safetensors_header.h"

namespace cxxlaunch::tensorfile {
namespace {

namespace fs = std::filesystem;

// Elements read, converted and appended at a time: a whole number of checksum chunks, so that a
// block of one slice reads no chunk twice; 4 MiB of float32, a few such buffers in all.
constexpr int64_t kBlockElements = 4 * kChunkElements;

// The checkpoint directory `path` names: itself when it has a manifest (and must then be
// complete), else the newest complete checkpoint in it, as Accelerator::loadState picks (the
// incomplete ones it skipped go to `notes`).
std::string checkpointDirectory(const std::string& path, std::vector<std::string>& notes) {
  std::error_code ec;
  // A crash between a save's two renames leaves `<dir>.old` complete
  // (runtime/checkpoint/checkpoint.h).
  if (!fs::exists(path, ec) && fs::exists(path + ".old", ec) && !whyIncomplete(path + ".old")) {
    return path + ".old";
  }
  if (!fs::exists(path, ec)) throw InvalidArgument("checkpoint '" + path + "' does not exist");
  if (!fs::is_directory(path, ec)) {
    throw InvalidArgument("'" + path + "' is not a checkpoint directory (one with a manifest) " +
                          "nor a folder of them");
  }
  if (fs::exists(fs::symlink_status(fs::path(path) / kManifestName, ec))) {
    if (auto why = whyIncomplete(path)) {
      throw InvalidArgument("checkpoint '" + path + "' is incomplete or damaged: " + *why);
    }
    return path;
  }
  std::vector<std::string> skipped;
  const auto found = complete(path, /*checksums=*/false, &skipped);  // read below, checked
  if (!found.empty()) {
    notes.insert(notes.end(), skipped.begin(), skipped.end());
    return found.front();
  }
  if (holdsCheckpoints(path)) {
    std::string why;
    for (const auto& s : skipped) why += "; " + s;
    throw InvalidArgument("'" + path + "' holds no complete checkpoint" + why);
  }
  throw InvalidArgument("'" + path + "' is no checkpoint: '" +
                        (fs::path(path) / kManifestName).string() +
                        "' is missing, and it holds no checkpoint_<step> directory");
}

// Copies the model folder's config and tokenizer files (model_folder.h) the checkpoint's job
// loaded into `staging`: what makes the output a model folder. A folder that is gone, or a file
// that cannot be copied, is a warning: the weights are written all the same.
void copyModelFolderFiles(const Reader& reader, const std::string& staging,
                          MergeWeightsResult& result) {
  const auto counter = reader.counter(kModelSourceCounter);
  if (!counter) return;  // not from a model folder, or saved before checkpoints recorded it
  const auto source = decodeCounterValue(*counter);
  if (!source || source->empty()) {
    result.warnings.push_back(
        "the checkpoint's model folder counter is malformed: only the "
        "weights are written (no config.json)");
    return;
  }
  std::error_code ec;
  const std::string advice =
      ": the output holds the weights only, and is no model folder until config.json (and the "
      "tokenizer files) are copied into it from that folder or a copy of it";
  if (!fs::is_directory(*source, ec)) {
    result.warnings.push_back("the checkpoint was trained from the model folder '" + *source +
                              "', which is gone" + advice);
    return;
  }
  for (const char* name : kModelFolderFiles) {
    const std::string from = *source + "/" + name;
    if (!fs::exists(fs::symlink_status(from, ec))) {
      if (std::string(name) == "config.json") {
        result.warnings.push_back("the checkpoint's model folder '" + *source +
                                  "' has no config.json any more" + advice);
      }
      continue;
    }
    try {
      writeFileAtomically(staging + "/" + name,
                          readRegularFile(from, "the model folder's", kMaxModelFolderFileBytes));
      result.files.push_back(name);
    } catch (const InvalidArgument& e) {
      result.warnings.push_back(std::string(e.what()) + ": " + name + " is not written");
    }
  }
}

// A buffer as the checkpoint's counter bufferCounter(<name>) describes it: "<dtype>:<d0>,<d1>,...".
std::optional<SafetensorsTensor> bufferLayout(const std::string& name, const std::string& value) {
  const size_t colon = value.find(':');
  if (colon == std::string::npos) return std::nullopt;
  SafetensorsTensor t{name, value.substr(0, colon), {}};
  std::istringstream dims(value.substr(colon + 1));
  for (std::string d; std::getline(dims, d, ',');) {
    const auto n = wholeNumber(d);
    if (!n || *n < 0) return std::nullopt;
    t.shape.push_back(*n);
  }
  if (safetensorsDtypeSize(t.dtype) == 0) return std::nullopt;
  return t;
}

bool floating(const std::string& dtype) {
  return dtype == "F32" || dtype == "F16" || dtype == "BF16" || dtype == "F64";
}

// `n` values of `dtype` at `in` as float32.
void toFloat(const std::string& dtype, const char* in, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    if (dtype == "F32") {
      std::memcpy(out + i, in + 4 * i, 4);
    } else if (dtype == "F64") {
      double v;
      std::memcpy(&v, in + 8 * i, 8);
      out[i] = static_cast<float>(v);
    } else {
      uint16_t h;
      std::memcpy(&h, in + 2 * i, 2);
      if (dtype == "F16") {
        out[i] = halfToFloat(h);
      } else {
        const uint32_t bits = static_cast<uint32_t>(h) << 16;
        std::memcpy(out + i, &bits, 4);
      }
    }
  }
}

// Appends `n` floats converted to `dtype` (F32, BF16, F16).
void appendAs(const std::string& dtype, const float* values, size_t n,
              std::vector<uint16_t>& scratch, SafetensorsFileWriter& file) {
  if (dtype == "F32") return file.append(values, n * sizeof(float));
  scratch.resize(n);
  for (size_t i = 0; i < n; ++i) {
    scratch[i] = dtype == "BF16" ? floatToBFloat16(values[i]) : floatToHalf(values[i]);
  }
  file.append(scratch.data(), n * sizeof(uint16_t));
}

// What goes into the output: a parameter (read from the slices) or a buffer (a blob).
struct Item {
  SafetensorsTensor out;
  std::string buffer_dtype;  // a buffer's dtype in the checkpoint; empty for a parameter
};

void throwIfCorrupt(const Reader& reader) {
  if (auto problem = reader.corruption()) {
    throw InvalidArgument(*problem + ": the checkpoint is corrupt; nothing was written");
  }
}

}  // namespace

MergeWeightsResult mergeWeights(const MergeWeightsOptions& options) {
  if (options.dtype != "F32" && options.dtype != "BF16" && options.dtype != "F16") {
    throw InvalidArgument("dtype " + options.dtype + " is not F32, BF16 or F16");
  }
  MergeWeightsResult result;
  // The output is checked before anything is read: a mistake costs no time. It may not overlap
  // the checkpoint, nor the folder of checkpoints named (--overwrite would remove them).
  refuseOverlap(options.output, options.checkpoint);
  result.checkpoint = checkpointDirectory(options.checkpoint, result.notes);
  refuseOverlap(options.output, result.checkpoint);
  StagedOutput output(options.output, options.overwrite);

  const Reader reader(result.checkpoint);  // parses every rank file's header
  reader.checkCounters(0, 1);              // every file saved with this manifest
  if (reader.counter(kBaseFingerprintCounter)) {
    const auto source = reader.counter(kModelSourceCounter);
    const auto base = source ? decodeCounterValue(*source) : std::nullopt;
    throw InvalidArgument(
        "'" + result.checkpoint + "' is a checkpoint of a run on a frozen base model ('" +
        base.value_or("?") +
        "', LoRA): it holds the trainable parameters only, not a model. Merge the run's adapter "
        "(finetune's --output_dir) into its base with `cxxlaunch merge-weights --lora ADAPTER "
        "--base " +
        base.value_or("BASE") + " OUTPUT`");
  }
  result.world = reader.worldSize();
  // Files of format 1 have no checksums of their own: their manifest's CRC-32C, up front.
  for (const auto& file : reader.files()) {
    if (file->checksReads()) continue;
    const auto m = readManifest(result.checkpoint);
    const std::string name = fs::path(file->path()).filename().string();
    for (const auto& [listed, expected] : m->files) {
      if (listed == name && fileSizeAndCrc(file->path()) != expected) {
        throw InvalidArgument("checkpoint file '" + file->path() +
                              "' does not match its manifest's CRC-32C: the checkpoint is corrupt");
      }
    }
  }

  std::vector<Item> items;
  for (const auto& [name, shape] : reader.params(kParamArray)) {
    items.push_back({{name, options.dtype, shape}, ""});
  }
  for (const auto& blob : reader.files().front()->blobNames()) {
    if (blob.rfind(kBufferPrefix, 0) != 0) continue;
    const std::string name = blob.substr(std::string_view(kBufferPrefix).size());
    const auto value = reader.counter(bufferCounter(name));
    auto layout = value ? bufferLayout(name, *value) : std::nullopt;
    if (!layout) {
      result.notes.push_back("buffer '" + name +
                             "' left out: the checkpoint does not record its dtype and shape "
                             "(saved by a cxxlaunch before merge-weights)");
      continue;
    }
    Item item{*layout, layout->dtype};
    if (floating(item.buffer_dtype)) item.out.dtype = options.dtype;  // as model.to(dtype)
    items.push_back(std::move(item));
  }

  if (items.empty()) {
    throw InvalidArgument("checkpoint '" + result.checkpoint +
                          "' holds no parameters (saved from a model without any?)");
  }
  std::vector<uint64_t> sizes;
  for (const auto& item : items) sizes.push_back(safetensorsBytes(item.out));
  const std::vector<size_t> starts = safetensorsFileStarts(sizes, options.max_file_bytes);

  const std::string& staging = output.begin(result.notes);

  std::vector<float> block;
  std::vector<uint16_t> scratch;
  std::vector<std::pair<std::string, std::string>> weight_map;
  for (size_t f = 0; f < starts.size(); ++f) {
    const size_t first = starts[f], last = f + 1 < starts.size() ? starts[f + 1] : items.size();
    const std::string name = safetensorsFileName(f, starts.size());
    std::vector<SafetensorsTensor> layout;
    for (size_t i = first; i < last; ++i) layout.push_back(items[i].out);
    SafetensorsFileWriter file(staging + "/" + name, layout);
    for (size_t i = first; i < last; ++i) {
      const Item& item = items[i];
      weight_map.emplace_back(item.out.name, name);
      if (!item.buffer_dtype.empty()) {
        const auto bytes = reader.blob(0, bufferBlob(item.out.name));
        throwIfCorrupt(reader);
        const SafetensorsTensor saved{item.out.name, item.buffer_dtype, item.out.shape};
        if (!bytes || bytes->size() != safetensorsBytes(saved)) {
          throw InvalidArgument("checkpoint '" + result.checkpoint + "': buffer '" + item.out.name +
                                "' is not of the size its manifest says");
        }
        if (item.out.dtype == item.buffer_dtype) {
          file.append(bytes->data(), bytes->size());
        } else {  // a block at a time: memory stays at the blob and a block
          const size_t size = safetensorsDtypeSize(item.buffer_dtype);
          const size_t n = bytes->size() / size;
          for (size_t at = 0; at < n; at += kBlockElements) {
            const size_t count = std::min<size_t>(kBlockElements, n - at);
            block.resize(count);
            toFloat(item.buffer_dtype, bytes->data() + at * size, count, block.data());
            appendAs(item.out.dtype, block.data(), count, scratch, file);
          }
        }
        continue;
      }
      int64_t numel = 1;
      for (int64_t d : item.out.shape) numel *= d;
      for (int64_t begin = 0; begin < numel; begin += kBlockElements) {
        const int64_t end = std::min(numel, begin + kBlockElements);
        block.resize(static_cast<size_t>(end - begin));
        reader.read(item.out.name, kParamArray, begin, end, item.out.shape, block.data());
        throwIfCorrupt(reader);
        appendAs(item.out.dtype, block.data(), block.size(), scratch, file);
      }
    }
    file.commit();
    result.files.push_back(name);
  }
  for (uint64_t s : sizes) result.bytes += s;
  result.tensors = items.size();
  if (starts.size() > 1) {
    writeSafetensorsIndex(staging, result.bytes, weight_map);
    result.files.push_back(kSafetensorsIndexName);
  }
  copyModelFolderFiles(reader, staging, result);
  output.commit(result.notes);
  return result;
}

uint64_t parseByteSize(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.')) {
    ++digits;
  }
  std::string unit = text.substr(digits);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::pair<const char*, double> kUnits[] = {{"", 1},
                                                          {"B", 1},
                                                          {"KB", 1e3},
                                                          {"MB", 1e6},
                                                          {"GB", 1e9},
                                                          {"TB", 1e12},
                                                          {"KIB", 1024.0},
                                                          {"MIB", 1048576.0},
                                                          {"GIB", 1073741824.0},
                                                          {"TIB", 1099511627776.0}};
  auto bad = [&] {
    return InvalidArgument("'" + text +
                           "' is not a size: give bytes, or a number with KB, MB, GB, TB "
                           "(powers of 1000) or KiB, MiB, GiB, TiB, e.g. 5GB");
  };
  const std::string number = text.substr(0, digits);
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (number.empty() || end != number.c_str() + number.size()) throw bad();
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    const double bytes = std::floor(value * scale);
    if (!(bytes >= 1) || bytes > 1e18) throw bad();
    return static_cast<uint64_t>(bytes);
  }
  throw bad();
}

uint16_t floatToBFloat16(float value) {
  if (std::isnan(value)) return 0x7fc0;
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const uint32_t rounding_bias = ((bits >> 16) & 1) + 0x7fff;
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

// IEEE half by float arithmetic, as c10::Half's conversion (from the FP16 library): the
// scalings let the FPU round to nearest even, subnormals and overflow to infinity included.
uint16_t floatToHalf(float value) {
  auto bitsOf = [](float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
  };
  auto fromBits = [](uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  };
  const float scale_to_inf = 0x1.0p+112f, scale_to_zero = 0x1.0p-110f;
  float base = (std::fabs(value) * scale_to_inf) * scale_to_zero;
  const uint32_t w = bitsOf(value), shl1_w = w + w, sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xff000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = fromBits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = bitsOf(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007c00u, mantissa_bits = bits & 0x00000fffu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xff000000u ? 0x7e00u : nonsign));
}

float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int shift = 0;
      while ((mantissa & 0x400) == 0) {
        mantissa <<= 1;
        ++shift;
      }
      bits = sign | ((113u - static_cast<uint32_t>(shift)) << 23) | ((mantissa & 0x3ff) << 13);
    }
  } else {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace cxxlaunch::tensorfile
