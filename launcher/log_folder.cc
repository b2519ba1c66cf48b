#include "launcher/log_folder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "common/error.h"

namespace cxxlaunch::launcher {
namespace fs = std::filesystem;
namespace {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ != -1) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void reset(int fd) {
    if (fd_ != -1) ::close(fd_);
    fd_ = fd;
  }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// Empty when the open folder is ours and no one else may write it, so that no one else can put
// a name (a symlink, a folder of theirs) into it; else why not.
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

// Opens `name` in `dir` as a folder, never through a symlink (O_NOFOLLOW: ELOOP).
int openFolderAt(int dir, const std::string& name) {
  return ::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

// Why a folder that could not be opened is not to be used: a symlink or no folder (the callers
// refuse it or make their own). Any other failure (no descriptor left, no permission) is no
// judgement on the folder: a SystemError.
std::string whyNot(int err, const fs::path& path) {
  if (err != ELOOP && err != ENOTDIR) throw SystemError("open " + path.string(), err);
  return "a symlink or not a folder";
}

}  // namespace

fs::path makeSubfolders(const fs::path& parent, const std::vector<std::string>& names,
                        mode_t mode) {
  Fd dir(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() == -1) throw SystemError("open " + parent.string(), errno);
  fs::path path = parent;
  for (const std::string& name : names) {
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
      throw InvalidArgument("'" + name + "' cannot name a log folder");
    }
    path /= name;
    if (::mkdirat(dir.get(), name.c_str(), mode) != 0 && errno != EEXIST) {
      throw SystemError("mkdir " + path.string(), errno);
    }
    Fd next(openFolderAt(dir.get(), name));
    const std::string why = next.get() == -1 ? whyNot(errno, path) : whyNotPrivate(next.get());
    if (!why.empty()) {
      throw Error("the log folder " + path.string() + " is " + why +
                  ": refusing to write logs there (remove it, or choose --log_dir)");
    }
    dir.reset(next.release());
  }
  return path;
}

LogFolder makeRunFolder(const std::string& log_dir, const std::vector<std::string>& components) {
  LogFolder folder;
  fs::path base = log_dir;
  if (!log_dir.empty()) {
    // The user's own choice of place, symlinks in it included.
    folder.folder_mode = 0755;
    folder.file_mode = 0644;
    fs::create_directories(base);
  } else {
    const char* tmp = std::getenv("TMPDIR");  // NOLINT(concurrency-mt-unsafe)
    const fs::path shared = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
    const std::string name = "cxxlaunch-" + std::to_string(::geteuid());
    base = shared / name;
    if (::mkdir(base.c_str(), 0700) != 0 && errno != EEXIST) {
      throw SystemError("mkdir " + base.string(), errno);
    }
    const Fd dir(::open(base.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    const std::string why = dir.get() == -1 ? whyNot(errno, base) : whyNotPrivate(dir.get());
    if (!why.empty()) {
      std::string own = (shared / (name + "-XXXXXX")).string();
      if (::mkdtemp(own.data()) == nullptr) throw SystemError("mkdtemp " + own, errno);
      folder.note = base.string() + " is " + why + "; the logs go to " + own + " instead";
      base = own;
    }
  }
  folder.path = makeSubfolders(base, components, folder.folder_mode);
  return folder;
}

}  // namespace cxxlaunch::launcher
