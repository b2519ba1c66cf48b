#include "tensorfile/merge_lora.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <thread>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/file.h"
#include "tensorfile/lora_adapter.h"
#include "tensorfile/merge_output.h"
#include "tensorfile/merge_weights.h"
#include "tensorfile/model_folder.h"
#include "tensorfile/safetensors_file.h"
#include "tensorfile/safetensors_folder.h"

namespace cxxlaunch::tensorfile {
namespace {

namespace fs = std::filesystem;

// Bytes of a tensor copied, or of W's rows merged, at a time.
constexpr size_t kBlockBytes = 16u << 20;
constexpr int kMaxThreads = 16;

enum class Dtype { kF32, kF64, kF16, kBF16 };

Dtype dtypeOf(const std::string& name) {
  if (name == "F64") return Dtype::kF64;
  if (name == "F16") return Dtype::kF16;
  if (name == "BF16") return Dtype::kBF16;
  return Dtype::kF32;  // the only other one lora_adapter.cc lets through
}

template <Dtype D>
double load(const char* at) {
  if constexpr (D == Dtype::kF32) {
    float f;
    std::memcpy(&f, at, 4);
    return f;
  } else if constexpr (D == Dtype::kF64) {
    double d;
    std::memcpy(&d, at, 8);
    return d;
  } else {
    uint16_t h;
    std::memcpy(&h, at, 2);
    if constexpr (D == Dtype::kF16) return halfToFloat(h);
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
}

// `value` in D at `at`, rounded once (roundToOddFloat's note).
template <Dtype D>
void store(double value, char* at) {
  if constexpr (D == Dtype::kF32) {
    const float f = static_cast<float>(value);
    std::memcpy(at, &f, 4);
  } else if constexpr (D == Dtype::kF64) {
    std::memcpy(at, &value, 8);
  } else {
    const float odd = roundToOddFloat(value);
    const uint16_t h = D == Dtype::kBF16 ? floatToBFloat16(odd) : floatToHalf(odd);
    std::memcpy(at, &h, 2);
  }
}

template <Dtype D>
constexpr size_t kSize = D == Dtype::kF64   ? 8
                         : D == Dtype::kF32 ? 4
                                            : 2;

template <Dtype D>
void loadAll(const char* raw, size_t n, double* out) {
  for (size_t i = 0; i < n; ++i) out[i] = load<D>(raw + i * kSize<D>);
}

// A whole (small) adapter tensor as doubles.
std::vector<double> loadMatrix(const SafetensorsFolder& folder, const SafetensorsEntry& e) {
  std::vector<char> raw(e.end - e.begin);
  folder.read(e.name, 0, raw.size(), raw.data());
  std::vector<double> values(raw.size() / safetensorsDtypeSize(e.dtype));
  switch (dtypeOf(e.dtype)) {
    case Dtype::kF32:
      loadAll<Dtype::kF32>(raw.data(), values.size(), values.data());
      break;
    case Dtype::kF64:
      loadAll<Dtype::kF64>(raw.data(), values.size(), values.data());
      break;
    case Dtype::kF16:
      loadAll<Dtype::kF16>(raw.data(), values.size(), values.data());
      break;
    case Dtype::kBF16:
      loadAll<Dtype::kBF16>(raw.data(), values.size(), values.data());
      break;
  }
  return values;
}

// The rows of W being merged: A [r, in], B [out, r], and a block of W's rows from `row0` in
// W's dtype, replaced in place by the merged values.
struct Block {
  int64_t in = 0, r = 0;
  double scale = 0;
  const double* a = nullptr;
  const double* b = nullptr;
  int64_t row0 = 0;
  char* rows = nullptr;
};

// Rows [first, last) of the block: W + scale * B A, each row's sums over r in `acc`.
template <Dtype D>
void mergeRows(const Block& block, int64_t first, int64_t last, std::vector<double>& acc) {
  const int64_t in = block.in;
  for (int64_t row = first; row < last; ++row) {
    std::fill(acc.begin(), acc.end(), 0.0);
    const double* b_row = block.b + row * block.r;
    for (int64_t k = 0; k < block.r; ++k) {
      const double bk = b_row[k];
      if (bk == 0) continue;
      const double* a_row = block.a + k * in;
      for (int64_t i = 0; i < in; ++i) acc[i] += bk * a_row[i];
    }
    char* w = block.rows + static_cast<size_t>((row - block.row0) * in) * kSize<D>;
    for (int64_t i = 0; i < in; ++i) {
      store<D>(load<D>(w + i * kSize<D>) + block.scale * acc[i], w + i * kSize<D>);
    }
  }
}

void mergeRows(Dtype dtype, const Block& block, int64_t first, int64_t last,
               std::vector<double>& acc) {
  switch (dtype) {
    case Dtype::kF32:
      return mergeRows<Dtype::kF32>(block, first, last, acc);
    case Dtype::kF64:
      return mergeRows<Dtype::kF64>(block, first, last, acc);
    case Dtype::kF16:
      return mergeRows<Dtype::kF16>(block, first, last, acc);
    case Dtype::kBF16:
      return mergeRows<Dtype::kBF16>(block, first, last, acc);
  }
}

// Appends `target` merged with its adapter, a block of rows at a time, the rows of a block
// shared among `threads` (fewer where a thread cannot be started: the rest run here).
void appendMerged(const SafetensorsFolder& base, const SafetensorsFolder& weights,
                  const std::string& target, const LoraPair& pair, double scale, int threads,
                  SafetensorsFileWriter& file) {
  const SafetensorsEntry& w = *base.find(target);
  const Dtype dtype = dtypeOf(w.dtype);
  const int64_t out = w.shape[0], in = w.shape[1];
  const std::vector<double> a = loadMatrix(weights, *weights.find(pair.a));
  const std::vector<double> b = loadMatrix(weights, *weights.find(pair.b));
  const size_t row_bytes = static_cast<size_t>(in) * safetensorsDtypeSize(w.dtype);
  const int64_t block_rows =
      std::max<int64_t>(1, static_cast<int64_t>(kBlockBytes / std::max<size_t>(row_bytes, 1)));
  std::vector<char> rows;
  std::vector<std::vector<double>> acc(threads, std::vector<double>(in));
  Block block{in,       static_cast<int64_t>(a.size()) / std::max<int64_t>(in, 1),
              scale,    a.data(),
              b.data(), 0,
              nullptr};
  for (int64_t row0 = 0; row0 < out; row0 += block_rows) {
    const int64_t row1 = std::min(out, row0 + block_rows);
    rows.resize(static_cast<size_t>(row1 - row0) * row_bytes);
    base.read(target, static_cast<uint64_t>(row0) * row_bytes, rows.size(), rows.data());
    block.row0 = row0;
    block.rows = rows.data();
    const int64_t per = (row1 - row0 + threads - 1) / threads;
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (int64_t first = row0; first < row1; first += per) {
      spans.emplace_back(first, std::min(row1, first + per));
    }
    std::vector<std::thread> helpers;
    try {
      for (size_t t = 1; t < spans.size(); ++t) {
        helpers.emplace_back(
            [&, t] { mergeRows(dtype, block, spans[t].first, spans[t].second, acc[t]); });
      }
    } catch (const std::system_error&) {
      // no more threads: the spans not started run here
    }
    for (size_t t = 0; t < spans.size(); ++t) {
      if (t == 0 || t > helpers.size()) {
        mergeRows(dtype, block, spans[t].first, spans[t].second, acc[0]);
      }
    }
    for (auto& helper : helpers) helper.join();
    file.append(rows.data(), rows.size());
  }
}

void appendCopy(const SafetensorsFolder& base, const SafetensorsEntry& e,
                SafetensorsFileWriter& file) {
  std::vector<char> block;
  const uint64_t bytes = e.end - e.begin;
  for (uint64_t at = 0; at < bytes; at += kBlockBytes) {
    block.resize(static_cast<size_t>(std::min<uint64_t>(kBlockBytes, bytes - at)));
    base.read(e.name, at, block.size(), block.data());
    file.append(block.data(), block.size());
  }
}

// The base folder's config.json and tokenizer files, copied into `staging`; one that is missing
// or cannot be copied is a warning (config.json's: the output is no model folder without it).
void copyModelFolderFiles(const std::string& base, const std::string& staging,
                          MergeLoraResult& result) {
  std::error_code ec;
  for (const char* name : kModelFolderFiles) {
    const std::string from = base + "/" + name;
    if (!fs::exists(fs::symlink_status(from, ec))) {
      if (std::string(name) == "config.json") {
        result.warnings.push_back("the base folder '" + base +
                                  "' has no config.json: the output holds the weights only, and "
                                  "is no model folder until one is copied into it");
      }
      continue;
    }
    try {
      writeFileAtomically(staging + "/" + name,
                          readRegularFile(from, "the base folder's", kMaxModelFolderFileBytes));
      result.files.push_back(name);
    } catch (const InvalidArgument& e) {
      result.warnings.push_back(std::string(e.what()) + ": " + name + " is not written");
    }
  }
}

struct OutputFile {
  std::string name;
  std::vector<SafetensorsTensor> tensors;
};

// The files written: the base's own, or the tensors in the base's order split afresh.
std::vector<OutputFile> outputFiles(const SafetensorsFolder& base, uint64_t max_file_bytes) {
  std::vector<OutputFile> files;
  for (const auto& file : base.files()) {
    files.push_back({file.name, {}});
    for (const auto& e : file.tensors) files.back().tensors.push_back({e.name, e.dtype, e.shape});
  }
  if (max_file_bytes == 0) return files;
  std::vector<SafetensorsTensor> all;
  std::vector<uint64_t> sizes;
  for (const auto& file : files) {
    for (const auto& t : file.tensors) {
      all.push_back(t);
      sizes.push_back(safetensorsBytes(t));
    }
  }
  const std::vector<size_t> starts = safetensorsFileStarts(sizes, max_file_bytes);
  std::vector<OutputFile> split;
  for (size_t f = 0; f < starts.size(); ++f) {
    const size_t last = f + 1 < starts.size() ? starts[f + 1] : all.size();
    split.push_back({safetensorsFileName(f, starts.size()),
                     {all.begin() + static_cast<std::ptrdiff_t>(starts[f]),
                      all.begin() + static_cast<std::ptrdiff_t>(last)}});
  }
  return split;
}

}  // namespace

MergeLoraResult mergeLora(const MergeLoraOptions& options) {
  // The output first: a mistake costs no time, and nothing is read from where it would write.
  refuseOverlap(options.output, options.adapter, "adapter");
  refuseOverlap(options.output, options.base, "base model");
  StagedOutput output(options.output, options.overwrite);

  std::error_code ec;
  if (!fs::is_directory(options.adapter, ec)) {
    throw InvalidArgument("adapter '" + options.adapter + "' is not a folder: --lora takes the " +
                          "folder PEFT's save_pretrained (or finetune) writes, with " +
                          kAdapterConfigName + " and " + kAdapterWeightsName);
  }
  if (!fs::is_directory(options.base, ec)) {
    throw InvalidArgument("base model '" + options.base + "' is not a folder: --base takes a " +
                          "Hugging Face model folder (config.json and its safetensors)");
  }
  LoraAdapter adapter = readLoraConfig(options.adapter);
  const std::string weights_path = (fs::path(options.adapter) / kAdapterWeightsName).string();
  if (!fs::exists(fs::symlink_status(weights_path, ec))) {
    const bool pickle = fs::exists(fs::path(options.adapter) / "adapter_model.bin", ec);
    throw InvalidArgument("'" + weights_path + "' is missing" +
                          (pickle ? " (adapter_model.bin, a pickle, is not read: save the adapter "
                                    "with safe_serialization=True)"
                                  : ""));
  }
  const SafetensorsFolder weights(weights_path);
  pairLoraTensors(adapter, weights, weights_path);
  if (!fs::exists(fs::path(options.base) / kSafetensorsIndexName, ec) &&
      !fs::exists(fs::path(options.base) / "model.safetensors", ec)) {
    throw InvalidArgument("base model '" + options.base + "' has neither model.safetensors nor " +
                          kSafetensorsIndexName + ": only safetensors weights are read");
  }
  const SafetensorsFolder base(options.base);
  checkLoraAgainstBase(adapter, weights, base, options.base);
  const std::vector<OutputFile> files = outputFiles(base, options.max_file_bytes);

  MergeLoraResult result;
  result.rank = adapter.r;
  result.scale = adapter.scale;
  int threads =
      options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::clamp(threads, 1, kMaxThreads);
  const std::string& staging = output.begin(result.notes);
  std::vector<std::pair<std::string, std::string>> weight_map;
  for (const auto& file : files) {
    SafetensorsFileWriter writer(staging + "/" + file.name, file.tensors);
    for (const auto& t : file.tensors) {
      weight_map.emplace_back(t.name, file.name);
      const auto pair = adapter.pairs.find(t.name);
      if (pair == adapter.pairs.end()) {
        appendCopy(base, *base.find(t.name), writer);
      } else {
        appendMerged(base, weights, t.name, pair->second, adapter.scale, threads, writer);
        ++result.merged;
      }
      result.bytes += safetensorsBytes(t);
      ++result.tensors;
    }
    writer.commit();
    result.files.push_back(file.name);
  }
  if (files.size() > 1 || (base.indexed() && options.max_file_bytes == 0)) {
    writeSafetensorsIndex(staging, result.bytes, weight_map);
    result.files.push_back(kSafetensorsIndexName);
  }
  copyModelFolderFiles(options.base, staging, result);
  output.commit(result.notes);
  return result;
}

float roundToOddFloat(double value) {
  float f = static_cast<float>(value);
  if (!std::isfinite(f) || static_cast<double>(f) == value) return f;
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 1) == 0) {  // the even neighbour: take the odd one on value's side
    f = std::nextafter(f, value > f ? INFINITY : -INFINITY);
  }
  return f;
}

}  // namespace cxxlaunch::tensorfile
