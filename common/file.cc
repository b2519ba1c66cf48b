#include "common/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace cxxlaunch {

OpenFile::~OpenFile() {
  if (fd_ >= 0) ::close(fd_);
}

OpenFile openRegularFile(const std::string& path, const std::string& what, uint64_t max_bytes) {
  auto refuse = [&](const std::string& why) {
    throw InvalidArgument(what + " '" + path + "': " + why);
  };
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) refuse(std::string("cannot open it: ") + std::strerror(errno));
  OpenFile file(fd, 0);
  struct stat st {};
  if (::fstat(fd, &st) != 0) refuse(std::string("cannot stat it: ") + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) refuse("is a directory, not a file");
  if (!S_ISREG(st.st_mode)) refuse("is not a regular file (a FIFO, socket or device)");
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    refuse("is " + std::to_string(st.st_size) + " bytes, more than the " +
           std::to_string(max_bytes) + " such a file may have");
  }
  return OpenFile(file.release(), static_cast<uint64_t>(st.st_size));
}

std::string readRegularFile(const std::string& path, const std::string& what, size_t max_bytes) {
  const OpenFile file = openRegularFile(path, what, max_bytes);
  std::string text;
  text.reserve(static_cast<size_t>(file.size()));
  char buffer[65536];
  for (;;) {
    const ssize_t n = ::read(file.fd(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw InvalidArgument(what + " '" + path + "': cannot read it: " + std::strerror(errno));
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
    // A file that grows while we read (a log someone appends to) is still bounded.
    if (text.size() > max_bytes) {
      throw InvalidArgument(what + " '" + path + "': grew past " + std::to_string(max_bytes) +
                            " bytes");
    }
  }
  return text;
}

std::string readTokenFile(const std::string& path, const std::string& what) {
  const std::string text = readRegularFile(path, what, 64 << 10);
  std::string token = text.substr(0, text.find('\n'));
  if (token.empty()) {
    throw InvalidArgument(what + ": '" + path + "' has no token on its first line");
  }
  return token;
}

}  // namespace cxxlaunch
