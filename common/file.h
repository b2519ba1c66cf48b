#pragma once
// Opening and reading the files a user names (config, data, tokenizer, token, TLS certificates)
// without trusting the name: a directory, a FIFO, a device such as /dev/zero or a file larger
// than its kind may be is refused before anything is read, with a message naming what the file
// is for and its path, instead of hanging on a FIFO or exhausting memory.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

namespace cxxlaunch {

// An open file descriptor, closed when destroyed (release() hands it over). Move-only.
class OpenFile {
 public:
  OpenFile(int fd, uint64_t size) : fd_(fd), size_(size) {}
  ~OpenFile();
  OpenFile(OpenFile&& other) noexcept : fd_(other.release()), size_(other.size_) {}
  OpenFile& operator=(OpenFile&&) = delete;
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;
  int fd() const { return fd_; }
  uint64_t size() const { return size_; }  // when opened
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
  uint64_t size_;
};

// The one way to open a file a user named, for reading. The open never blocks (O_NONBLOCK: a
// FIFO with no writer is refused, not waited on) and follows symlinks as any open does; then
// only a regular file of at most `max_bytes` is accepted. Throws InvalidArgument
// "<what> '<path>': <why>" (`what` says what the file is for: "config file", "--data") when it
// cannot be opened (the system's reason: no such file, a symlink loop, permission), is a
// directory, is not a regular file (a FIFO, socket or device), or is larger than `max_bytes`.
// Reads from the descriptor block as usual (O_NONBLOCK has no effect on a regular file).
OpenFile openRegularFile(const std::string& path, const std::string& what,
                         uint64_t max_bytes = std::numeric_limits<uint64_t>::max());

// The whole contents of the regular file `path`, opened by openRegularFile. Throws
// InvalidArgument as it does, and when the file grows past `max_bytes` while being read.
std::string readRegularFile(const std::string& path, const std::string& what, size_t max_bytes);

// A job token: the first line of the file `path` (at most 64 KiB, read as above). `what` names
// where the path came from ("--token-file"). Throws InvalidArgument when the file cannot be read
// or its first line is empty.
std::string readTokenFile(const std::string& path, const std::string& what);

}  // namespace cxxlaunch
