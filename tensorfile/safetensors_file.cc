#include "tensorfile/safetensors_file.h"

#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tensorfile/safetensors_header.h"

namespace cxxlaunch::tensorfile {
namespace {

using nlohmann::json;

void writeLittleEndian64(uint64_t v, char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

}  // namespace

uint64_t safetensorsBytes(const SafetensorsTensor& tensor) {
  const size_t size = safetensorsDtypeSize(tensor.dtype);
  if (size == 0) throw InvalidArgument("safetensors has no dtype " + tensor.dtype);
  uint64_t bytes = size;
  for (int64_t d : tensor.shape) {
    if (d < 0 || (d > 0 && bytes > std::numeric_limits<uint64_t>::max() / d)) {
      throw InvalidArgument("tensor '" + tensor.name + "' has a bad shape");
    }
    bytes *= static_cast<uint64_t>(d);
  }
  return bytes;
}

std::string safetensorsHead(const std::vector<SafetensorsTensor>& tensors) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const uint64_t bytes = safetensorsBytes(t);
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string head(8, '\0');
  writeLittleEndian64(text.size(), head.data());
  return head + text;
}

// Past the page cache, as the runtime's checkpoints: a model is written once and read by another
// process, if at all, and through the page cache the writer pays for fresh pages.
SafetensorsFileWriter::SafetensorsFileWriter(const std::string& path,
                                             const std::vector<SafetensorsTensor>& tensors)
    : path_(path), file_(path, Durability::kPowerLoss, Writes::kPastPageCache) {
  for (const auto& t : tensors) expected_ += safetensorsBytes(t);
  const std::string head = safetensorsHead(tensors);
  file_.append(head.data(), head.size());
}

void SafetensorsFileWriter::append(const void* data, size_t bytes) {
  file_.append(data, bytes);
  appended_ += bytes;
}

void SafetensorsFileWriter::commit() {
  if (appended_ != expected_) {
    throw InvalidArgument("safetensors '" + path_ + "': " + std::to_string(appended_) +
                          " bytes of data given for a header of " + std::to_string(expected_));
  }
  file_.commit();
}

std::string safetensorsFileName(size_t i, size_t n) {
  if (n == 1) return "model.safetensors";
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return name;
}

std::vector<size_t> safetensorsFileStarts(const std::vector<uint64_t>& bytes,
                                          uint64_t max_file_bytes) {
  if (max_file_bytes == 0) throw InvalidArgument("a safetensors file limit must be > 0 bytes");
  std::vector<size_t> starts;
  uint64_t in_file = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (starts.empty() || (i > starts.back() && in_file + bytes[i] > max_file_bytes)) {
      starts.push_back(i);
      in_file = 0;
    }
    in_file += bytes[i];
  }
  return starts;
}

void writeSafetensorsIndex(const std::string& dir, uint64_t total_bytes,
                           const std::vector<std::pair<std::string, std::string>>& weight_map) {
  json map = json::object();
  for (const auto& [tensor, file] : weight_map) map[tensor] = file;
  const json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", map}};
  writeFileAtomically(dir + "/" + kSafetensorsIndexName, index.dump(2) + "\n");
}

}  // namespace cxxlaunch::tensorfile
