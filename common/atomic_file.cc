#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

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

// One write of an aligned block past the page cache: 0 once all of it is written; EINVAL where
// the file system opened the file O_DIRECT but refuses its writes, or the write was short or
// interrupted (the caller writes the block again through the page cache); else the error.
int pwriteDirect(int fd, const unsigned char* block, size_t bytes, uint64_t offset) {
  const ssize_t n = ::pwrite(fd, block, bytes, static_cast<off_t>(offset));
  if (n == static_cast<ssize_t>(bytes)) return 0;
  if (n >= 0 || errno == EINVAL || errno == EINTR) return EINVAL;
  return errno;
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

AtomicFile::AtomicFile(std::string path, Durability durability, Writes writes, mode_t mode)
    : path_(std::move(path)),
      temp_(path_ + ".tmp." + std::to_string(::getpid())),
      durability_(durability) {
  constexpr int kFlags = O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC;
  if (writes == Writes::kPastPageCache) {
    fd_ = ::open(temp_.c_str(), kFlags | O_DIRECT, mode);
    for (auto* buffer : {&direct_, &behind_}) {
      void* memory = nullptr;
      if (fd_ >= 0 && ::posix_memalign(&memory, kDirectAlignment, kDirectBufferBytes) == 0) {
        buffer->reset(static_cast<unsigned char*>(memory));
      }
    }
    if (fd_ >= 0 && !(direct_ && behind_)) stopWritingDirect();
  }
  if (fd_ < 0) fd_ = ::open(temp_.c_str(), kFlags, mode);  // or O_DIRECT refused (EINVAL)
  if (fd_ < 0) fail("creating", temp_);
}

AtomicFile::~AtomicFile() {
  stopWritingThread();
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
  behind_.reset();
}

void AtomicFile::writeBehindLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return writing_ || stopping_; });
    if (!writing_) return;
    const uint64_t offset = behind_offset_;
    lock.unlock();
    const int result = pwriteDirect(fd_, behind_.get(), kDirectBufferBytes, offset);
    lock.lock();
    behind_result_ = result;
    writing_ = false;
    cv_.notify_all();
  }
}

void AtomicFile::awaitWriteBehind() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !writing_; });
  const int result = std::exchange(behind_result_, 0);
  lock.unlock();
  if (result == 0) return;
  if (result != EINVAL) {
    errno = result;
    fail("writing", temp_);
  }
  const auto refused = std::move(behind_);
  stopWritingDirect();
  writeAll(refused.get(), kDirectBufferBytes, behind_offset_);
}

void AtomicFile::writeFullBufferBehind() {
  awaitWriteBehind();
  if (!direct_) return;  // O_DIRECT was refused: the full buffer went through the page cache
  std::swap(direct_, behind_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    behind_offset_ = on_disk_;
    writing_ = true;
  }
  on_disk_ += kDirectBufferBytes;
  buffered_ = 0;
  if (writer_.joinable()) {
    cv_.notify_all();
  } else {
    writer_ = std::thread([this] { writeBehindLoop(); });
  }
}

void AtomicFile::stopWritingThread() {
  if (!writer_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  writer_.join();  // after the write in flight, if any
}

void AtomicFile::writeLastBuffer() {
  const size_t padded = (buffered_ + kDirectAlignment - 1) & ~(kDirectAlignment - 1);
  std::memset(direct_.get() + buffered_, 0, padded - buffered_);
  const int result = pwriteDirect(fd_, direct_.get(), padded, on_disk_);
  if (result == EINVAL) return stopWritingDirect();
  if (result != 0) {
    errno = result;
    fail("writing", temp_);
  }
  on_disk_ += buffered_;
  buffered_ = 0;
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
      if (buffered_ == kDirectBufferBytes) writeFullBufferBehind();
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
  awaitWriteBehind();
  stopWritingThread();
  if (direct_) {
    // The last block goes out padded to the alignment: the file ends where the bytes do.
    const uint64_t size = on_disk_ + buffered_;
    if (buffered_ > 0) writeLastBuffer();
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

void writeFileAtomically(const std::string& path, std::string_view bytes, Durability durability,
                         mode_t mode) {
  AtomicFile file(path, durability, Writes::kThroughPageCache, mode);
  file.append(bytes.data(), bytes.size());
  file.commit();
}

}  // namespace cxxlaunch
