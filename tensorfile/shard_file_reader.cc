#include "tensorfile/shard_file_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <new>
#include <sstream>

#include "common/error.h"
#include "common/host_memory.h"

namespace cxxlaunch::tensorfile {
namespace {

constexpr int64_t kFormat2Chunk = int64_t{1} << 20;
constexpr int64_t kMinChunk = int64_t{1} << 10, kMaxChunk = int64_t{1} << 24;  // format 3's
constexpr size_t kFooterBytes = sizeof(kChecksumsMagic) + 20 + 1;  // magic, ' ', offset, '\n'
constexpr size_t kMaxHeader = 256u << 20;
constexpr int64_t kMaxDims = 16;
constexpr size_t kBounceBytes = 2u << 20;  // a reading thread's buffer for misaligned memory

}  // namespace

ShardFileReader::ShardFileReader(std::string path) : path_(std::move(path)) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument("checkpoint file '" + path_ + "' is corrupt: " + why);
  };
  // Never through a symbolic link (a rank file lies in its checkpoint), and without blocking on a
  // FIFO put in its place: the regular-file check comes before any read.
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd_ < 0) throw InvalidArgument("checkpoint file '" + path_ + "': " + std::strerror(errno));
  struct CloseOnThrow {  // the destructor does not run when the constructor throws
    ShardFileReader& reader;
    const int unwinding = std::uncaught_exceptions();
    ~CloseOnThrow() {
      if (std::uncaught_exceptions() == unwinding) return;
      ::close(reader.fd_);
      if (reader.direct_fd_ >= 0) ::close(reader.direct_fd_);
    }
  } guard{*this};
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) throw bad("not a regular file");
  direct_fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT | O_NOFOLLOW);  // -1: refused
  size_ = static_cast<uint64_t>(st.st_size);
  char first[64] = {};
  const size_t first_len = std::strlen(kShardFileMagic) + 1 + 1 + 1 + 20 + 1;
  if (size_ < first_len) throw bad("shorter than its first line");
  pread(0, first, first_len);
  int format = 0;
  unsigned long long header_bytes = 0;
  char magic[32] = {};
  if (std::sscanf(first, "%31s %d %llu", magic, &format, &header_bytes) != 3 ||
      std::strcmp(magic, kShardFileMagic) != 0 || first[first_len - 1] != '\n') {
    throw bad("no cxxlaunch checkpoint header");
  }
  if (format < 1 || format > kShardFileFormat) {
    throw bad("format " + std::to_string(format) + " is not 1 to " +
              std::to_string(kShardFileFormat) + " (a newer cxxlaunch wrote it?)");
  }
  if (header_bytes > kMaxHeader || first_len + header_bytes > size_) {
    throw bad("header length beyond the file");
  }
  std::string text(header_bytes, '\0');
  pread(first_len, text.data(), text.size());
  const uint64_t data_start = first_len + header_bytes;
  uint64_t data_bytes = size_ - data_start;
  if (format >= 2) readChecksums(format, data_start, data_bytes);  // the data ends before them
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
  if (!checked_) return;
  // Each array and blob has its checksums, in the header's order.
  size_t next = 0;
  for (const auto& s : slices_) {
    for (const auto& [name, offset] : s.arrays) {
      if (next >= pending_.size()) throw bad("fewer checksums than arrays");
      auto& chunks = pending_[next++];
      const int64_t numel = s.end - s.begin;
      if (static_cast<int64_t>(chunks.size()) != (numel + chunk_ - 1) / chunk_) {
        throw bad("slice '" + s.param + "' array '" + name + "' has the wrong number of checksums");
      }
      array_checksums_[offset] = {numel, std::move(chunks), "'" + s.param + "' " + name};
    }
  }
  for (const auto& [name, where] : blobs_) {
    if (next >= pending_.size() || pending_[next].size() != 1)
      throw bad("blob '" + name + "' checksum");
    blob_checksums_[where.first] = pending_[next++].front();
  }
  if (next != pending_.size()) throw bad("more checksums than arrays and blobs");
  pending_.clear();
}

void ShardFileReader::readChecksums(int format, uint64_t data_start, uint64_t& data_bytes) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument("checkpoint file '" + path_ + "' is corrupt: " + why);
  };
  if (data_bytes < kFooterBytes) throw bad("no checksums at its end");
  char footer[kFooterBytes + 1] = {};
  pread(size_ - kFooterBytes, footer, kFooterBytes);
  char magic[32] = {};
  unsigned long long at = 0;
  if (std::sscanf(footer, "%31s %llu", magic, &at) != 2 ||
      std::strcmp(magic, kChecksumsMagic) != 0 || footer[kFooterBytes - 1] != '\n' ||
      at > data_bytes - kFooterBytes) {
    throw bad("no checksums at its end");
  }
  const uint64_t bytes = data_bytes - kFooterBytes - at;
  if (bytes > kMaxHeader) throw bad("checksums too long");
  std::string text(bytes, '\0');
  pread(data_start + at, text.data(), text.size());
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line)) throw bad("no checksums line");
  if (format == 2) {
    if (line != "checksums") throw bad("no checksums line");
    chunk_ = kFormat2Chunk;
  } else {
    std::istringstream words(line);
    std::string word, rest;
    long long chunk = 0;
    // Bounded both ways: a chunk is what a read that starts inside one buffers (at most 64 MiB),
    // and each needs its checksum held in memory (at least 4 KiB of the file per checksum).
    if (!(words >> word >> chunk) || word != "checksums" || (words >> rest) || chunk < kMinChunk ||
        chunk > kMaxChunk) {
      throw bad("no checksums line with a chunk size of 2^10 to 2^24 elements");
    }
    chunk_ = chunk;
  }
  while (std::getline(in, line)) {
    // "array <chunks> <crc>..." or "blob <crc>", in the header's order, CRCs as 8 hex digits.
    std::istringstream words(line);
    std::string kind, word;
    long long count = 1;
    words >> kind;
    if (kind == "array") words >> count;
    if (!words || (kind != "array" && kind != "blob") || count < 0 ||
        count > (int64_t{1} << 40) / chunk_) {
      throw bad("a checksums line is malformed");
    }
    std::vector<uint32_t> values;
    for (long long c = 0; c < count; ++c) {
      if (!(words >> word) || word.size() != 8 ||
          word.find_first_not_of("0123456789abcdef") != std::string::npos) {
        throw bad("a checksums line is malformed");
      }
      values.push_back(static_cast<uint32_t>(std::stoul(word, nullptr, 16)));
    }
    pending_.push_back(std::move(values));
  }
  data_bytes = at;
  checked_ = true;
}

void ShardFileReader::check(uint32_t expected, const void* data, size_t bytes,
                            const std::string& what) const {
  if (crc32c(0, data, bytes) == expected) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (corruption_) return;
  corruption_ = "checkpoint file '" + path_ + "': " + what + " does not match its checksum";
}

std::optional<std::string> ShardFileReader::corruption() const {
  std::lock_guard<std::mutex> lock(mu_);
  return corruption_;
}

ShardFileReader::~ShardFileReader() {
  if (fd_ >= 0) ::close(fd_);
  if (direct_fd_ >= 0) ::close(direct_fd_);
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

bool ShardFileReader::preadDirect(uint64_t offset, char* out, size_t bytes, size_t needed) const {
  size_t done = 0;
  while (done < needed) {
    const ssize_t n =
        ::pread(direct_fd_, out + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EINVAL && done == 0) {  // this file system takes O_DIRECT only in part
      direct_ = false;
      return false;
    }
    if (n <= 0) {
      throw InvalidArgument("checkpoint file '" + path_ + "': read failed (" +
                            (n == 0 ? std::string("truncated") : std::strerror(errno)) + ")");
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

void ShardFileReader::fill(uint64_t offset, void* into, size_t bytes) const {
  char* out = static_cast<char*>(into);
  if (direct_fd_ < 0 || bytes < kAlignedArrayBytes || !direct_) {
    pread(offset, out, bytes);
    return;
  }
  const uint64_t skew = (offset - reinterpret_cast<uintptr_t>(out)) % kDirectAlignment;
  if (skew == 0) {  // the aligned middle straight into `out`, the ends through the page cache
    const size_t head =
        std::min<size_t>((kDirectAlignment - offset % kDirectAlignment) % kDirectAlignment, bytes);
    const size_t body = (bytes - head) / kDirectAlignment * kDirectAlignment;
    pread(offset, out, head);
    if (!preadDirect(offset + head, out + head, body, body)) pread(offset + head, out + head, body);
    pread(offset + head + body, out + head + body, bytes - head - body);
    return;
  }
  // Misaligned memory: through an aligned buffer, a block at a time.
  thread_local std::unique_ptr<char, decltype(&std::free)> bounce(nullptr, &std::free);
  if (!bounce) {
    void* p = nullptr;
    if (::posix_memalign(&p, kDirectAlignment, kBounceBytes) != 0) throw std::bad_alloc();
    bounce.reset(static_cast<char*>(p));
  }
  for (size_t done = 0; done < bytes;) {
    const uint64_t at = offset + done, from = at / kDirectAlignment * kDirectAlignment;
    const size_t skip = at - from, want = std::min<size_t>(kBounceBytes - skip, bytes - done);
    const size_t span = (skip + want + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
    if (!preadDirect(from, bounce.get(), span, skip + want)) {
      pread(at, out + done, bytes - done);
      return;
    }
    std::memcpy(out + done, bounce.get() + skip, want);
    done += want;
  }
}

void ShardFileReader::read(uint64_t offset, int64_t slice_begin, int64_t from, int64_t to,
                           float* out) const {
  prefaultForWriting(out, static_cast<size_t>(to - from) * sizeof(float));
  const auto it = array_checksums_.find(offset);
  if (it == array_checksums_.end()) {  // format 1
    fill(offset + static_cast<uint64_t>(from - slice_begin) * sizeof(float), out,
         static_cast<size_t>(to - from) * sizeof(float));
    return;
  }
  // Straight into `out` where chunks lie inside [from, to), up to kReadBytes in one read,
  // each then checked; else through a buffer (at most the first and the last chunk).
  const ArrayChecksums& sums = it->second;
  const int64_t f = from - slice_begin, t = to - slice_begin;  // in the array
  auto what = [&](int64_t cb, int64_t ce) {
    return sums.name + ", elements " + std::to_string(slice_begin + cb) + " to " +
           std::to_string(slice_begin + ce) + ",";
  };
  auto at = [&](int64_t element) {
    return offset + static_cast<uint64_t>(element) * sizeof(float);
  };
  std::vector<float> edge;
  const int64_t per_read = chunksPerRead(chunk_);
  for (int64_t c = f / chunk_; c * chunk_ < t;) {
    const int64_t cb = c * chunk_, ce = std::min(cb + chunk_, sums.numel);
    if (f <= cb && ce <= t) {
      int64_t last = c;  // the run of whole chunks inside [from, to) read at once
      auto whole = [&](int64_t k) {
        return k * chunk_ < t && std::min((k + 1) * chunk_, sums.numel) <= t;
      };
      while (last + 1 - c < per_read && whole(last + 1)) ++last;
      const int64_t re = std::min((last + 1) * chunk_, sums.numel);
      fill(at(cb), out + (cb - f), static_cast<size_t>(re - cb) * sizeof(float));
      for (; c <= last; ++c) {
        const int64_t b = c * chunk_, e = std::min(b + chunk_, sums.numel);
        check(sums.chunks[static_cast<size_t>(c)], out + (b - f),
              static_cast<size_t>(e - b) * sizeof(float), what(b, e));
      }
      continue;
    }
    const auto bytes = static_cast<size_t>(ce - cb) * sizeof(float);
    edge.resize(static_cast<size_t>(ce - cb));
    fill(at(cb), edge.data(), bytes);
    check(sums.chunks[static_cast<size_t>(c)], edge.data(), bytes, what(cb, ce));
    const int64_t a = std::max(cb, f), b = std::min(ce, t);
    std::memcpy(out + (a - f), edge.data() + (a - cb), static_cast<size_t>(b - a) * sizeof(float));
    ++c;
  }
}

bool ShardFileReader::hasBlob(const std::string& name) const {
  for (const auto& b : blobs_) {
    if (b.first == name) return true;
  }
  return false;
}

std::vector<std::string> ShardFileReader::blobNames() const {
  std::vector<std::string> names;
  for (const auto& b : blobs_) names.push_back(b.first);
  return names;
}

std::string ShardFileReader::blob(const std::string& name) const {
  for (const auto& [n, where] : blobs_) {
    if (n != name) continue;
    if (where.second > (1u << 30)) {
      throw InvalidArgument("checkpoint file '" + path_ + "': blob '" + name + "' too large");
    }
    std::string bytes(where.second, '\0');
    pread(where.first, bytes.data(), bytes.size());
    if (const auto sum = blob_checksums_.find(where.first); sum != blob_checksums_.end()) {
      check(sum->second, bytes.data(), bytes.size(), "blob '" + name + "'");
    }
    return bytes;
  }
  throw InvalidArgument("checkpoint file '" + path_ + "' has no '" + name + "'");
}

}  // namespace cxxlaunch::tensorfile
