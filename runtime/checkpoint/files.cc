#include "runtime/checkpoint/files.h"

#include <fcntl.h>
#include <nmmintrin.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/error.h"

namespace cxxlaunch::runtime::checkpoint {
namespace {

// CRC-32C (Castagnoli): the SSE4.2 instruction where the CPU has it (~8 bytes a cycle and a
// half), a table otherwise; the same values either way.
uint32_t crc32cTable(uint32_t crc, const unsigned char* p, size_t n) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

__attribute__((target("sse4.2"))) uint32_t crc32cHardware(uint32_t crc, const unsigned char* p,
                                                          size_t n) {
  uint64_t c = ~crc & 0xffffffffu;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw CommunicationError("checkpoint: " + what + " '" + path +
                           "' failed: " + std::strerror(errno));
}

}  // namespace

uint32_t crc32c(uint32_t crc, const void* data, size_t bytes) {
  static const bool hardware = __builtin_cpu_supports("sse4.2");
  const auto* p = static_cast<const unsigned char*>(data);
  return hardware ? crc32cHardware(crc, p, bytes) : crc32cTable(crc, p, bytes);
}

void DurableFile::append(const void* data, size_t bytes) {
  file_.append(data, bytes);
  crc_ = crc32c(crc_, data, bytes);
  size_ += bytes;
}

std::pair<uint64_t, uint32_t> fileSizeAndCrc(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("opening", path);
  std::vector<unsigned char> buffer(8u << 20);
  uint64_t size = 0;
  uint32_t crc = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int saved = errno;
      ::close(fd);
      errno = saved;
      fail("reading", path);
    }
    if (n == 0) break;
    crc = crc32c(crc, buffer.data(), static_cast<size_t>(n));
    size += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return {size, crc};
}

std::string readWholeFile(const std::string& path, size_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("opening", path);
  std::string out;
  char buffer[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buffer, static_cast<size_t>(n));
    if (out.size() > max_bytes) {
      ::close(fd);
      throw InvalidArgument("checkpoint: '" + path + "' is larger than a manifest can be");
    }
  }
  ::close(fd);
  return out;
}

}  // namespace cxxlaunch::runtime::checkpoint
