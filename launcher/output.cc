#include "launcher/output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "rendezvous/error.h"

namespace cxxlaunch::launcher {

bool writeAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n == -1) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

StreamSink::StreamSink(const std::string& log_path, int console_fd, std::string prefix,
                       size_t tail_lines)
    : console_fd_(console_fd), prefix_(std::move(prefix)), tail_lines_(tail_lines) {
  log_fd_ = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd_ == -1) throw SystemError("open " + log_path, errno);
}

StreamSink::~StreamSink() {
  if (log_fd_ != -1) ::close(log_fd_);
}

void StreamSink::write(std::string_view data) {
  writeAll(log_fd_, data);  // a full disk must not stop the job; the console still shows it
  while (!data.empty()) {
    auto newline = data.find('\n');
    if (newline == std::string_view::npos) {
      partial_.append(data);
      while (partial_.size() >= kMaxLine) {
        emitLine(std::string_view(partial_).substr(0, kMaxLine));
        partial_.erase(0, kMaxLine);
      }
      return;
    }
    if (partial_.empty()) {
      emitLine(data.substr(0, newline));
    } else {
      partial_.append(data.substr(0, newline));
      emitLine(partial_);
      partial_.clear();
    }
    data.remove_prefix(newline + 1);
  }
}

void StreamSink::finish() {
  if (partial_.empty()) return;
  emitLine(partial_);
  partial_.clear();
}

void StreamSink::emitLine(std::string_view line) {
  if (tail_lines_ > 0) {
    tail_.emplace_back(line);
    if (tail_.size() > tail_lines_) tail_.pop_front();
  }
  if (console_fd_ == -1) return;
  std::string whole;
  whole.reserve(prefix_.size() + line.size() + 1);
  whole.append(prefix_).append(line).push_back('\n');
  writeAll(console_fd_, whole);  // one write per line keeps lines of different ranks whole
}

}  // namespace cxxlaunch::launcher
