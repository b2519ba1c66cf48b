#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
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

AtomicFile::AtomicFile(std::string path, Durability durability)
    : path_(std::move(path)),
      temp_(path_ + ".tmp." + std::to_string(::getpid())),
      durability_(durability) {
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("creating", temp_);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temp_.c_str());
  }
}

void AtomicFile::append(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::write(fd_, p + done, bytes - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("writing", temp_);
    done += static_cast<size_t>(n);
  }
  // Start the disk on what is written so far, without waiting for it: a large file (a checkpoint)
  // then reaches the disk while its writer prepares the next bytes, and commit()'s fsync has
  // little left to do. Without this the kernel holds it all back until fsync or until its dirty
  // limits are reached. A file system without sync_file_range leaves it all to fsync.
  written_ += bytes;
  if (written_ - writeback_from_ >= kWritebackBytes) {
    ::sync_file_range(fd_, static_cast<off64_t>(writeback_from_),
                      static_cast<off64_t>(written_ - writeback_from_), SYNC_FILE_RANGE_WRITE);
    writeback_from_ = written_;
  }
}

void AtomicFile::commit() {
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
