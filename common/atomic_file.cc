#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "common/error.h"

namespace cxxlaunch {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw SystemError(what + " '" + path + "'", errno);
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

void AtomicFile::FreeDeleter::operator()(void* p) const { std::free(p); }

AtomicFile::AtomicFile(std::string path, Durability durability, Writes writes)
    : path_(std::move(path)),
      temp_(path_ + ".tmp." + std::to_string(::getpid())),
      durability_(durability) {
  constexpr int kFlags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  if (writes == Writes::kPastPageCache) {
    void* buffer = nullptr;
    fd_ = ::open(temp_.c_str(), kFlags | O_DIRECT, 0644);
    if (fd_ >= 0 && ::posix_memalign(&buffer, kDirectAlignment, kDirectBufferBytes) == 0) {
      direct_.reset(static_cast<unsigned char*>(buffer));
    } else if (fd_ >= 0) {
      stopWritingDirect();
    }
  }
  if (fd_ < 0) fd_ = ::open(temp_.c_str(), kFlags, 0644);  // or O_DIRECT refused (EINVAL)
  if (fd_ < 0) fail("creating", temp_);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temp_.c_str());
  }
}

void AtomicFile::writeAll(const void* data, size_t bytes, uint64_t offset) {
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pwrite(fd_, p + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("writing", temp_);
    done += static_cast<size_t>(n);
  }
}

void AtomicFile::stopWritingDirect() {
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) != 0) fail("configuring", temp_);
  if (direct_ && buffered_ > 0) writeAll(direct_.get(), buffered_, on_disk_);
  on_disk_ += buffered_;
  buffered_ = 0;
  direct_.reset();
}

void AtomicFile::writeDirectBuffer(size_t bytes) {
  const size_t padded = (bytes + kDirectAlignment - 1) & ~(kDirectAlignment - 1);
  std::memset(direct_.get() + bytes, 0, padded - bytes);  // past the end: cut off at commit
  const ssize_t n = ::pwrite(fd_, direct_.get(), padded, static_cast<off_t>(on_disk_));
  if (n == static_cast<ssize_t>(padded)) return;
  // A file system that opened O_DIRECT but refuses its writes (EINVAL), or a short or
  // interrupted write: whatever reached the file is written again through the page cache.
  if (n < 0 && errno != EINVAL && errno != EINTR) fail("writing", temp_);
  stopWritingDirect();
}

void AtomicFile::append(const void* data, size_t bytes) {
  if (direct_) {
    const auto* p = static_cast<const unsigned char*>(data);
    while (bytes > 0 && direct_) {
      const size_t n = std::min(bytes, kDirectBufferBytes - buffered_);
      std::memcpy(direct_.get() + buffered_, p, n);
      buffered_ += n;
      p += n;
      bytes -= n;
      if (buffered_ == kDirectBufferBytes) {
        writeDirectBuffer(buffered_);
        if (direct_) {
          on_disk_ += buffered_;
          buffered_ = 0;
        }
      }
    }
    if (bytes == 0) return;
    data = p;  // O_DIRECT was refused on the way: the rest through the page cache
  }
  writeAll(data, bytes, on_disk_);
  on_disk_ += bytes;
  // Start the disk on what is written so far, without waiting for it: a large file (a checkpoint)
  // then reaches the disk while its writer prepares the next bytes, and commit()'s fsync has
  // little left to do. Without this the kernel holds it all back until fsync or until its dirty
  // limits are reached. A file system without sync_file_range leaves it all to fsync.
  if (on_disk_ - writeback_from_ >= kWritebackBytes) {
    ::sync_file_range(fd_, static_cast<off64_t>(writeback_from_),
                      static_cast<off64_t>(on_disk_ - writeback_from_), SYNC_FILE_RANGE_WRITE);
    writeback_from_ = on_disk_;
  }
}

void AtomicFile::commit() {
  if (direct_) {
    // The last block goes out padded to the alignment: the file ends where the bytes do.
    const uint64_t size = on_disk_ + buffered_;
    if (buffered_ > 0) writeDirectBuffer(buffered_);
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) fail("truncating", temp_);
  }
  const bool durable = durability_ == Durability::kPowerLoss;
  if (durable && ::fsync(fd_) != 0) fail("fsync of", temp_);
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) {
    const int saved = errno;
    ::unlink(temp_.c_str());
    errno = saved;
    fail("closing", temp_);
  }
  if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    const int saved = errno;
    ::unlink(temp_.c_str());
    errno = saved;
    fail("renaming into", path_);
  }
  if (durable) fsyncDirectory(parentOf(path_));
}

void writeFileAtomically(const std::string& path, std::string_view bytes, Durability durability) {
  AtomicFile file(path, durability);
  file.append(bytes.data(), bytes.size());
  file.commit();
}

}  // namespace cxxlaunch
