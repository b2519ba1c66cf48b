#include "runtime/checkpoint/shard_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>

#include "common/error.h"

namespace cxxlaunch::runtime::checkpoint {
namespace {

constexpr const char kMagic[] = "cxxlaunch-checkpoint";
constexpr int kFormat = 1;
constexpr size_t kMaxHeader = 256u << 20;
constexpr int64_t kMaxDims = 16;

bool plainName(const std::string& name) {
  if (name.empty() || name.size() > 4096) return false;
  for (unsigned char c : name) {
    if (c <= ' ' || c == 0x7f) return false;
  }
  return true;
}

}  // namespace

std::pair<uint64_t, uint32_t> writeShardFile(
    const std::string& path, const std::vector<Slice>& slices,
    const std::vector<std::pair<std::string, std::string>>& blobs) {
  std::ostringstream header;
  uint64_t offset = 0;
  for (const auto& s : slices) {
    if (!plainName(s.param)) {
      throw InvalidArgument("checkpoint: parameter name '" + s.param +
                            "' has spaces or control characters; rename it");
    }
    header << "slice " << s.param << ' ' << s.begin << ' ' << s.end << ' ' << s.shape.size();
    for (int64_t d : s.shape) header << ' ' << d;
    header << ' ' << s.arrays.size();
    for (const auto& [name, tensor] : s.arrays) {
      header << ' ' << name << ' ' << offset;
      offset += static_cast<uint64_t>(s.end - s.begin) * sizeof(float);
    }
    header << '\n';
  }
  for (const auto& [name, bytes] : blobs) {
    header << "blob " << name << ' ' << offset << ' ' << bytes.size() << '\n';
    offset += bytes.size();
  }
  const std::string text = header.str();
  char first[64];
  std::snprintf(first, sizeof(first), "%s %d %020zu\n", kMagic, kFormat, text.size());
  DurableFile file(path);
  file.append(first, std::strlen(first));
  file.append(text.data(), text.size());
  for (const auto& s : slices) {
    for (const auto& [name, tensor] : s.arrays) {
      const torch::Tensor t = tensor.to(torch::kFloat).contiguous();
      if (t.numel() != s.end - s.begin) {
        throw InvalidArgument("checkpoint: slice of '" + s.param + "' array " + name +
                              " has the wrong size");
      }
      file.append(t.data_ptr<float>(), static_cast<size_t>(t.numel()) * sizeof(float));
    }
  }
  for (const auto& [name, bytes] : blobs) file.append(bytes.data(), bytes.size());
  file.commit();
  return {file.size(), file.crc()};
}

ShardFileReader::ShardFileReader(std::string path) : path_(std::move(path)) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument("checkpoint file '" + path_ + "' is corrupt: " + why);
  };
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw InvalidArgument("checkpoint file '" + path_ + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) throw bad("not a regular file");
  size_ = static_cast<uint64_t>(st.st_size);
  char first[64] = {};
  const size_t first_len = std::strlen(kMagic) + 1 + 1 + 1 + 20 + 1;
  if (size_ < first_len) throw bad("shorter than its first line");
  pread(0, first, first_len);
  int format = 0;
  unsigned long long header_bytes = 0;
  char magic[32] = {};
  if (std::sscanf(first, "%31s %d %llu", magic, &format, &header_bytes) != 3 ||
      std::strcmp(magic, kMagic) != 0 || first[first_len - 1] != '\n') {
    throw bad("no cxxlaunch checkpoint header");
  }
  if (format != kFormat) throw bad("format " + std::to_string(format) + " is not 1");
  if (header_bytes > kMaxHeader || first_len + header_bytes > size_) {
    throw bad("header length beyond the file");
  }
  std::string text(header_bytes, '\0');
  pread(first_len, text.data(), text.size());
  const uint64_t data_start = first_len + header_bytes;
  const uint64_t data_bytes = size_ - data_start;
  std::istringstream in(text);
  std::string line;
  auto inData = [&](uint64_t offset, uint64_t bytes) {
    return offset <= data_bytes && bytes <= data_bytes - offset;
  };
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string kind;
    words >> kind;
    if (kind == "slice") {
      SliceInfo s;
      int64_t ndim = 0, arrays = 0;
      words >> s.param >> s.begin >> s.end >> ndim;
      if (!words || ndim < 0 || ndim > kMaxDims) throw bad("a slice line is malformed");
      int64_t numel = 1;
      for (int64_t d = 0; d < ndim; ++d) {
        int64_t size = -1;
        words >> size;
        if (!words || size < 0 ||
            (size > 0 && numel > std::numeric_limits<int64_t>::max() / size)) {
          throw bad("slice '" + s.param + "' has a bad shape");
        }
        numel *= size;
        s.shape.push_back(size);
      }
      if (s.begin < 0 || s.end < s.begin || s.end > numel) {
        throw bad("slice '" + s.param + "' has a range outside its parameter");
      }
      words >> arrays;
      if (!words || arrays < 0 || arrays > 16) throw bad("slice '" + s.param + "' arrays");
      const uint64_t bytes = static_cast<uint64_t>(s.end - s.begin) * sizeof(float);
      for (int64_t a = 0; a < arrays; ++a) {
        std::string name;
        uint64_t offset = 0;
        words >> name >> offset;
        if (!words || !inData(offset, bytes)) {
          throw bad("slice '" + s.param + "' array '" + name + "' lies outside the file");
        }
        s.arrays.emplace_back(name, data_start + offset);
      }
      slices_.push_back(std::move(s));
    } else if (kind == "blob") {
      std::string name;
      uint64_t offset = 0, bytes = 0;
      words >> name >> offset >> bytes;
      if (!words || !inData(offset, bytes)) throw bad("blob '" + name + "' lies outside the file");
      blobs_.push_back({name, {data_start + offset, bytes}});
    } else if (!kind.empty()) {
      throw bad("unknown header line '" + kind + "'");
    }
  }
}

ShardFileReader::~ShardFileReader() {
  if (fd_ >= 0) ::close(fd_);
}

void ShardFileReader::pread(uint64_t offset, void* out, size_t bytes) const {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd_, static_cast<char*>(out) + done, bytes - done,
                              static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw InvalidArgument("checkpoint file '" + path_ + "': read failed (" +
                            (n == 0 ? std::string("truncated") : std::strerror(errno)) + ")");
    }
    done += static_cast<size_t>(n);
  }
}

void ShardFileReader::read(uint64_t offset, int64_t slice_begin, int64_t from, int64_t to,
                           float* out) const {
  pread(offset + static_cast<uint64_t>(from - slice_begin) * sizeof(float), out,
        static_cast<size_t>(to - from) * sizeof(float));
}

bool ShardFileReader::hasBlob(const std::string& name) const {
  for (const auto& b : blobs_) {
    if (b.first == name) return true;
  }
  return false;
}

std::string ShardFileReader::blob(const std::string& name) const {
  for (const auto& [n, where] : blobs_) {
    if (n != name) continue;
    if (where.second > (1u << 30)) {
      throw InvalidArgument("checkpoint file '" + path_ + "': blob '" + name + "' too large");
    }
    std::string bytes(where.second, '\0');
    pread(where.first, bytes.data(), bytes.size());
    return bytes;
  }
  throw InvalidArgument("checkpoint file '" + path_ + "' has no '" + name + "'");
}

}  // namespace cxxlaunch::runtime::checkpoint
