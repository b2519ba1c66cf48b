#include "runtime/offload/nvme_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/error.h"

namespace cxxlaunch::runtime {
namespace {

std::string human(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char text[32];
  std::snprintf(text, sizeof(text), u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return text;
}

int openUnnamed(const std::string& dir, bool direct) {
  const int flags = O_RDWR | O_CLOEXEC | (direct ? O_DIRECT : 0);
  int fd = ::open(dir.c_str(), flags | O_TMPFILE, 0600);
  if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)) return fd;
  // No O_TMPFILE here: a named file, unlinked at once.
  std::string path = dir + "/.cxxlaunch-swap-XXXXXX";
  fd = ::mkostemp(path.data(), O_CLOEXEC);
  if (fd < 0) return fd;
  ::unlink(path.c_str());
  if (direct && ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_DIRECT) != 0) {
    ::close(fd);
    errno = EINVAL;
    return -1;
  }
  return fd;
}

}  // namespace

NvmeFile::NvmeFile(const std::string& dir, const std::string& what) : dir_(dir), what_(what) {
  struct stat st {};
  if (dir.empty()) {
    throw InvalidArgument(what + " is empty: nvme offload needs a directory on local disk");
  }
  if (::stat(dir.c_str(), &st) != 0) {
    throw InvalidArgument(what + " '" + dir + "' does not exist; create it or point " + what +
                          " at a directory on local disk");
  }
  if (!S_ISDIR(st.st_mode)) {
    throw InvalidArgument(what + " '" + dir + "' is not a directory");
  }
  fd_ = openUnnamed(dir, /*direct=*/true);
  direct_ = fd_ >= 0;
  if (fd_ < 0) fd_ = openUnnamed(dir, /*direct=*/false);
  if (fd_ < 0) {
    throw InvalidArgument(what + " '" + dir + "': cannot create a swap file there (" +
                          std::strerror(errno) + "); it must be a writable directory");
  }
}

NvmeFile::~NvmeFile() {
  // io_ outlives this body: drain it before the file closes (its queue runs in order).
  try {
    io_.submit([] {})->wait();
  } catch (...) {
  }
  if (fd_ >= 0) ::close(fd_);
}

int64_t NvmeFile::reserve(size_t bytes) {
  if (allocated_) throw InvalidArgument("NvmeFile::reserve after allocate");
  const int64_t offset = size_;
  size_ += static_cast<int64_t>(roundUp(bytes));
  return offset;
}

void NvmeFile::allocate() {
  if (allocated_ || size_ == 0) {
    allocated_ = true;
    return;
  }
  const int err = ::posix_fallocate(fd_, 0, size_);
  if (err != 0) {
    struct statvfs fs {};
    const double free = ::fstatvfs(fd_, &fs) == 0
                            ? static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize)
                            : 0;
    throw InvalidArgument(what_ + " '" + dir_ + "' cannot hold this rank's offloaded state: " +
                          human(static_cast<double>(size_)) + " needed, " + human(free) +
                          " free (" + std::strerror(err) +
                          "); free space or use another directory");
  }
  allocated_ = true;
}

WorkPtr NvmeFile::read(int64_t offset, void* to, size_t bytes) {
  return io_.submit([=, this] {
    size_t done = 0;
    while (done < bytes) {
      const ssize_t n = ::pread(fd_, static_cast<char*>(to) + done, bytes - done,
                                offset + static_cast<int64_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        throw CommunicationError(
            "nvme offload: reading " + std::to_string(bytes) + " bytes from the swap file in '" +
            dir_ + "' failed: " + (n == 0 ? std::string("end of file") : std::strerror(errno)));
      }
      done += static_cast<size_t>(n);
    }
  });
}

WorkPtr NvmeFile::write(int64_t offset, const void* from, size_t bytes) {
  return io_.submit([=, this] {
    size_t done = 0;
    while (done < bytes) {
      const ssize_t n = ::pwrite(fd_, static_cast<const char*>(from) + done, bytes - done,
                                 offset + static_cast<int64_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        throw CommunicationError("nvme offload: writing " + std::to_string(bytes) +
                                 " bytes to the swap file in '" + dir_ +
                                 "' failed: " + std::strerror(errno));
      }
      done += static_cast<size_t>(n);
    }
  });
}

AlignedBuffer alignedBuffer(size_t numel) {
  AlignedBuffer buffer;
  buffer.bytes = NvmeFile::roundUp(numel * sizeof(float));
  void* p = nullptr;
  if (::posix_memalign(&p, NvmeFile::kAlignment, std::max(buffer.bytes, NvmeFile::kAlignment)) !=
      0) {
    throw std::bad_alloc();
  }
  std::memset(p, 0, buffer.bytes);
  buffer.data = std::shared_ptr<float>(static_cast<float*>(p), [](float* f) { std::free(f); });
  return buffer;
}

}  // namespace cxxlaunch::runtime
