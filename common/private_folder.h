#pragma once
// Folders no other local user can write, and the files written in them, for writers that must
// never be turned onto someone else's file. In a folder another user can write, that user may
// put a symlink (or a folder of theirs) under the very name the writer is about to use, and a
// job run as root would then append to whatever the link names. So a folder is opened relative
// to an open folder already checked (openat), never through a symlink (O_NOFOLLOW), and used only
// when it is ours and no one else may write it; files are made in it the same way. Once open, a
// folder is used through its descriptor, so renaming the path away later changes nothing.
// The launcher's log folder (launcher/log_folder.h) and the trackers' run folders
// (runtime/observability/trackers.h) are made this way.
//
// Free functions and a descriptor owner, no shared state: safe from any thread.

#include <sys/types.h>

#include <string>
#include <string_view>
#include <utility>

namespace cxxlaunch {

// An open file descriptor, closed when destroyed.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Empty when the open folder `fd` belongs to this process's effective user and neither its group
// nor others may write it (a sticky bit does not help: others could still take a name first);
// else why not, as "owned by uid 65534" or "writable by others (mode 1777)".
std::string whyNotPrivate(int fd);

// A folder opened by openPrivateFolder: `fd` when it may be used, else `why` not.
struct PrivateFolder {
  UniqueFd fd;
  std::string why;  // "a symlink or not a folder", or whyNotPrivate's reason; empty: usable
};

// The folder `name` of the open folder `dir` (AT_FDCWD: `name` is a path, whose last component
// only is checked), made with `mode` when missing, opened without following a symlink and
// checked by whyNotPrivate. Throws SystemError naming `path` when it cannot be made or opened for
// a reason that judges nothing about it (no permission, no descriptor left).
PrivateFolder openPrivateFolder(int dir, const std::string& name, mode_t mode,
                                const std::string& path);

// The regular file `name` of the open folder `dir`, opened with `flags` (O_WRONLY | O_APPEND |
// O_CREAT, say; `mode` for a new one) plus O_NOFOLLOW and O_CLOEXEC. Never follows a symlink,
// never blocks on a FIFO. Throws SystemError naming `path`: ELOOP for a symlink, EINVAL for
// anything that is not a regular file.
UniqueFd openFileAt(int dir, const std::string& name, int flags, mode_t mode,
                    const std::string& path);

// Writes all of `bytes` to `fd`. Throws SystemError naming `path`.
void writeAll(int fd, std::string_view bytes, const std::string& path);

// `bytes` as the whole content of `name` in the open folder `dir`: written under a fresh
// temporary name there (random, created O_EXCL without following a symlink), then renamed over
// `name`, which replaces a symlink there instead of writing through it. A reader sees the old
// content or the new; a crash may leave the temporary file, a power loss may lose both (no
// fsync: for reports that nothing reads back). Throws SystemError naming `path`.
void replaceFileAt(int dir, const std::string& name, std::string_view bytes, mode_t mode,
                   const std::string& path);

}  // namespace cxxlaunch
