#include "common/private_folder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "common/error.h"

namespace cxxlaunch {

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string whyNotPrivate(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return std::strerror(errno);
  if (st.st_uid != ::geteuid()) return "owned by uid " + std::to_string(st.st_uid);
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return std::string("writable by others (mode ") + mode + ")";
  }
  return "";
}

PrivateFolder openPrivateFolder(int dir, const std::string& name, mode_t mode,
                                const std::string& path) {
  if (::mkdirat(dir, name.c_str(), mode) != 0 && errno != EEXIST) {
    throw SystemError("mkdir " + path, errno);
  }
  PrivateFolder folder;
  folder.fd.reset(::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!folder.fd.valid()) {
    // ELOOP: a symlink; ENOTDIR: not a folder. Anything else (no permission, no descriptor left)
    // says nothing about the folder.
    if (errno != ELOOP && errno != ENOTDIR) throw SystemError("open " + path, errno);
    folder.why = "a symlink or not a folder";
    return folder;
  }
  folder.why = whyNotPrivate(folder.fd.get());
  if (!folder.why.empty()) folder.fd.reset();
  return folder;
}

UniqueFd openFileAt(int dir, const std::string& name, int flags, mode_t mode,
                    const std::string& path) {
  // O_NONBLOCK: a FIFO without a reader fails (ENXIO) instead of waiting for one; on a regular
  // file it changes nothing.
  UniqueFd fd(::openat(dir, name.c_str(), flags | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, mode));
  struct stat st {};
  if (!fd.valid() && errno != ELOOP && errno != ENXIO) throw SystemError("open " + path, errno);
  if (!fd.valid() || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    throw InvalidArgument("'" + path +
                          "' is a symlink or not a regular file: refusing to write through it "
                          "(remove it)");
  }
  return fd;
}

void writeAll(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw SystemError("write " + path, errno);
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

void replaceFileAt(int dir, const std::string& name, std::string_view bytes, mode_t mode,
                   const std::string& path) {
  // A random name, so that no one can have put something under it beforehand; O_EXCL refuses
  // whatever is there anyway.
  static thread_local std::mt19937_64 random{std::random_device{}()};
  std::string temp;
  UniqueFd fd;
  for (int attempt = 0; attempt < 16 && !fd.valid(); ++attempt) {
    char suffix[24];
    std::snprintf(suffix, sizeof(suffix), "%016llx", static_cast<unsigned long long>(random()));
    temp = "." + name + ".tmp." + suffix;
    fd.reset(
        ::openat(dir, temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
    if (!fd.valid() && errno != EEXIST) throw SystemError("create a file beside " + path, errno);
  }
  if (!fd.valid()) throw SystemError("create a file beside " + path, EEXIST);
  try {
    writeAll(fd.get(), bytes, path);
    fd.reset();
    if (::renameat(dir, temp.c_str(), dir, name.c_str()) != 0) {
      throw SystemError("rename into " + path, errno);
    }
  } catch (...) {
    ::unlinkat(dir, temp.c_str(), 0);
    throw;
  }
}

}  // namespace cxxlaunch
