#include "runtime/checkpoint/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "rendezvous/error.h"

namespace cxxlaunch::runtime::checkpoint {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw CommunicationError("checkpoint: " + what + " '" + path +
                           "' failed: " + std::strerror(errno));
}

std::string parentOf(const std::string& path) {
  const auto parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

}  // namespace

void fsyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("opening directory", dir);
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  if (rc != 0) fail("fsync of directory", dir);
}

DurableFile::DurableFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("creating", tmp_);
}

DurableFile::~DurableFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void DurableFile::append(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::write(fd_, p + done, bytes - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("writing", tmp_);
    done += static_cast<size_t>(n);
  }
  // zlib's crc32 takes uInt lengths: feed it in pieces.
  for (size_t at = 0; at < bytes;) {
    const size_t piece = std::min<size_t>(bytes - at, 1u << 30);
    crc_ = static_cast<uint32_t>(
        ::crc32(crc_, reinterpret_cast<const Bytef*>(p + at), static_cast<uInt>(piece)));
    at += piece;
  }
  size_ += bytes;
}

void DurableFile::commit() {
  if (::fsync(fd_) != 0) fail("fsync of", tmp_);
  if (::close(fd_) != 0) {
    fd_ = -1;
    fail("closing", tmp_);
  }
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("renaming into", path_);
  fsyncDirectory(parentOf(path_));
}

void writeFileDurably(const std::string& path, const std::string& bytes) {
  DurableFile file(path);
  file.append(bytes.data(), bytes.size());
  file.commit();
}

std::pair<uint64_t, uint32_t> fileSizeAndCrc(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("opening", path);
  std::vector<unsigned char> buffer(8u << 20);
  uint64_t size = 0;
  uLong crc = ::crc32(0, nullptr, 0);
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
    crc = ::crc32(crc, buffer.data(), static_cast<uInt>(n));
    size += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return {size, static_cast<uint32_t>(crc)};
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
