#include "runtime/checkpoint/shard_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <new>
#include <sstream>

#include "common/error.h"

namespace cxxlaunch::runtime::checkpoint {
namespace {

std::string hex(uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof(text), "%08x", v);
  return text;
}

bool plainName(const std::string& name) {
  if (name.empty() || name.size() > 4096) return false;
  for (unsigned char c : name) {
    if (c <= ' ' || c == 0x7f) return false;
  }
  return true;
}

}  // namespace

namespace {
// Arrays of at least kAlignedArrayBytes start at file offsets that are multiples of
// kDirectAlignment (the header is padded to one, the data between arrays with zeros), so that a
// load reads them with O_DIRECT straight into page-aligned memory (see ShardFileReader::fill).
// A load reads into such memory (load_memory.h).
uint64_t alignedOffset(uint64_t offset, uint64_t bytes) {
  constexpr uint64_t kAlignment = tensorfile::kDirectAlignment;
  if (bytes < tensorfile::kAlignedArrayBytes) return offset;
  return (offset + kAlignment - 1) / kAlignment * kAlignment;
}

// The header, and in `offsets` each array's offset from the data's start, in the layout's order.
std::string headerOf(const std::vector<StateLayout>& layout,
                     const std::vector<std::pair<std::string, std::string>>& blobs,
                     std::vector<uint64_t>& offsets) {
  std::ostringstream header;
  uint64_t offset = 0;
  for (const auto& s : layout) {
    if (!plainName(s.param)) {
      throw InvalidArgument("checkpoint: parameter name '" + s.param +
                            "' has spaces or control characters; rename it");
    }
    header << "slice " << s.param << ' ' << s.begin << ' ' << s.end << ' ' << s.shape.size();
    for (int64_t d : s.shape) header << ' ' << d;
    header << ' ' << s.arrays.size();
    const uint64_t bytes = static_cast<uint64_t>(s.end - s.begin) * sizeof(float);
    for (const auto& name : s.arrays) {
      offset = alignedOffset(offset, bytes);
      offsets.push_back(offset);
      header << ' ' << name << ' ' << offset;
      offset += bytes;
    }
    header << '\n';
  }
  for (const auto& [name, bytes] : blobs) {
    header << "blob " << name << ' ' << offset << ' ' << bytes.size() << '\n';
    offset += bytes.size();
  }
  std::string text = header.str();
  char first[64];
  const int first_len =
      std::snprintf(first, sizeof(first), "%s %d %020zu\n", tensorfile::kShardFileMagic,
                    tensorfile::kShardFileFormat, size_t{0});
  // Empty lines pad the header (readers skip them) so that the data starts aligned.
  text.append(
      (tensorfile::kDirectAlignment - (first_len + text.size()) % tensorfile::kDirectAlignment) %
          tensorfile::kDirectAlignment,
      '\n');
  std::snprintf(first, sizeof(first), "%s %d %020zu\n", tensorfile::kShardFileMagic,
                tensorfile::kShardFileFormat, text.size());
  return first + text;
}
}  // namespace

ShardFileWriter::ShardFileWriter(const std::string& path, std::vector<StateLayout> layout,
                                 const std::vector<std::pair<std::string, std::string>>& blobs)
    : layout_(std::move(layout)), blobs_(blobs), file_(path) {
  const std::string header = headerOf(layout_, blobs_, offsets_);
  file_.append(header.data(), header.size());
  data_start_ = header.size();
  while (slice_ < layout_.size() && layout_[slice_].arrays.empty()) ++slice_;
}

void ShardFileWriter::append(const torch::Tensor& array) {
  if (slice_ >= layout_.size()) throw InvalidArgument("checkpoint: more arrays than the layout");
  const StateLayout& s = layout_[slice_];
  // A GPU worker's arrays come through host memory, one array at a time.
  const torch::Tensor t = array.to(torch::kCPU, torch::kFloat).contiguous();
  if (t.numel() != s.end - s.begin) {
    throw InvalidArgument("checkpoint: slice of '" + s.param + "' array " + s.arrays[array_] +
                          " has the wrong size");
  }
  static const char kZeros[tensorfile::kDirectAlignment] = {};
  file_.append(kZeros, data_start_ + offsets_[next_array_++] - file_.size());  // the alignment
  const float* data = t.data_ptr<float>();
  const int64_t chunks = (t.numel() + tensorfile::kChunkElements - 1) / tensorfile::kChunkElements;
  checksums_ += "array " + std::to_string(chunks);
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t n =
        std::min(tensorfile::kChunkElements, t.numel() - c * tensorfile::kChunkElements);
    const uint32_t crc =
        file_.appendChecked(data + c * tensorfile::kChunkElements, static_cast<size_t>(n) * 4);
    checksums_ += ' ' + hex(crc);
  }
  checksums_ += '\n';
  if (++array_ == s.arrays.size()) {
    array_ = 0;
    do {
      ++slice_;
    } while (slice_ < layout_.size() && layout_[slice_].arrays.empty());
  }
}

std::pair<uint64_t, uint32_t> ShardFileWriter::commit() {
  if (slice_ < layout_.size()) {
    throw InvalidArgument("checkpoint: the arrays of '" + layout_[slice_].param +
                          "' never came; the file is not written");
  }
  for (const auto& [name, bytes] : blobs_) {
    file_.append(bytes.data(), bytes.size());
    checksums_ += "blob " + hex(tensorfile::crc32c(0, bytes.data(), bytes.size())) + '\n';
  }
  const uint64_t at = file_.size() - data_start_;
  const std::string text =
      "checksums " + std::to_string(tensorfile::kChunkElements) + '\n' + checksums_;
  file_.append(text.data(), text.size());
  char footer[64];
  std::snprintf(footer, sizeof(footer), "%s %020llu\n", tensorfile::kChecksumsMagic,
                static_cast<unsigned long long>(at));
  file_.append(footer, std::strlen(footer));
  file_.commit();
  return {file_.size(), file_.crc()};
}

std::pair<uint64_t, uint32_t> writeShardFile(
    const std::string& path, const std::vector<StateView>& slices,
    const std::vector<std::pair<std::string, std::string>>& blobs) {
  std::vector<StateLayout> layout;
  for (const auto& s : slices) {
    StateLayout l{s.param, s.shape, s.begin, s.end, {}};
    for (const auto& [name, tensor] : s.arrays) l.arrays.push_back(name);
    layout.push_back(std::move(l));
  }
  ShardFileWriter writer(path, std::move(layout), blobs);
  for (const auto& s : slices) {
    for (const auto& [name, tensor] : s.arrays) writer.append(tensor);
  }
  return writer.commit();
}

}  // namespace cxxlaunch::runtime::checkpoint
