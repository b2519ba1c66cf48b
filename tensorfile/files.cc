#include "tensorfile/files.h"

#include <fcntl.h>
#include <nmmintrin.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/error.h"

namespace cxxlaunch::tensorfile {
namespace {

// CRC-32C (Castagnoli): the SSE4.2 instruction where the CPU has it (three chains: ~8 bytes a
// cycle), a table otherwise; the same values either way.
constexpr uint32_t kPolynomial = 0x82F63B78u;  // reflected: bit 31 is x^0

uint32_t crc32cTable(uint32_t crc, const unsigned char* p, size_t n) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

// The CRC instruction takes 3 cycles and can start one a cycle, so one chain of it runs at a
// third of its speed: three chains over three stretches of a block run together, and their
// registers are then joined with the CRC's linearity. raw(r, A||B) = shift(raw(r, A), |B|) ^
// raw(0, B), where shift(r, n) = raw(r, n zero bytes) multiplies r by x^(8n) modulo the
// polynomial.
constexpr size_t kStretch = 16 << 10;

// a * b modulo the polynomial, both in the reflected order.
uint32_t multiplyModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (int i = 0; i < 32; ++i) {  // b * x^i for each term x^i of a
    if (a & (0x80000000u >> i)) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPolynomial : b >> 1;
  }
  return product;
}

__attribute__((target("sse4.2"))) uint64_t rawHardware(uint64_t c, const unsigned char* p,
                                                       size_t n) {
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return c32;
}

__attribute__((target("sse4.2"))) uint32_t crc32cHardware(uint32_t crc, const unsigned char* p,
                                                          size_t n) {
  // x^(8 kStretch): what shifting a register over a stretch multiplies it by.
  static const uint32_t stretch_shift = [] {
    const std::vector<unsigned char> zeros(kStretch, 0);
    return static_cast<uint32_t>(rawHardware(0x80000000u, zeros.data(), zeros.size()));
  }();
  uint64_t c = ~crc & 0xffffffffu;
  for (; n >= 3 * kStretch; n -= 3 * kStretch, p += 3 * kStretch) {
    uint64_t a = c, b = 0, d = 0;
    for (size_t i = 0; i < kStretch; i += 8) {
      uint64_t wa, wb, wd;
      std::memcpy(&wa, p + i, 8);
      std::memcpy(&wb, p + kStretch + i, 8);
      std::memcpy(&wd, p + 2 * kStretch + i, 8);
      a = _mm_crc32_u64(a, wa);
      b = _mm_crc32_u64(b, wb);
      d = _mm_crc32_u64(d, wd);
    }
    const uint32_t ab =
        multiplyModP(stretch_shift, static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b);
    c = multiplyModP(stretch_shift, ab) ^ static_cast<uint32_t>(d);
  }
  return ~static_cast<uint32_t>(rawHardware(c, p, n));
}

// x^(8 n) modulo the polynomial: the factor that moves a register past n bytes (zeros).
uint32_t shiftFactor(uint64_t n) {
  static const auto powers = [] {  // x^(8 * 2^k)
    std::array<uint32_t, 64> p{};
    p[0] = 0x80000000u >> 8;  // x^8
    for (size_t k = 1; k < p.size(); ++k) p[k] = multiplyModP(p[k - 1], p[k - 1]);
    return p;
  }();
  uint32_t factor = 0x80000000u;  // x^0
  for (size_t k = 0; n != 0; ++k, n >>= 1) {
    if (n & 1) factor = multiplyModP(powers[k], factor);
  }
  return factor;
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

uint32_t crc32cCombine(uint32_t first, uint32_t second, size_t second_bytes) {
  // With the register inverted before and after, crc(A || B) = crc(A) x^(8 |B|) ^ crc(B): the
  // inversions' own terms cancel.
  return multiplyModP(shiftFactor(second_bytes), first) ^ second;
}

void DurableFile::append(const void* data, size_t bytes) {
  file_.append(data, bytes);
  crc_ = crc32c(crc_, data, bytes);
  size_ += bytes;
}

uint32_t DurableFile::appendChecked(const void* data, size_t bytes) {
  // Pieces of whole stretch triples (the CRC's three chains stay together) that fit in a core's
  // L2 cache with room to spare: the copy into the file's buffer reads what the CRC just read.
  // An asynchronous save's writer competes with training for cores and memory bandwidth; this
  // reads its snapshot once where append() and a separate check read it twice.
  constexpr size_t kPiece = 4 * 3 * kStretch;
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t crc = 0;
  for (size_t at = 0; at < bytes; at += kPiece) {
    const size_t n = std::min(kPiece, bytes - at);
    crc = crc32c(crc, p + at, n);
    file_.append(p + at, n);
  }
  crc_ = crc32cCombine(crc_, crc, bytes);
  size_ += bytes;
  return crc;
}

std::pair<uint64_t, uint32_t> fileSizeAndCrc(const std::string& path) {
  // A FIFO reads empty; a symbolic link is no file of a checkpoint (its files are never one).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
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
  // Not blocking on a FIFO put in the file's place: only a regular file is read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail("opening", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InvalidArgument("'" + path + "' is not a regular file");
  }
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

}  // namespace cxxlaunch::tensorfile
