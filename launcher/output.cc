#include "launcher/output.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <memory>

#include "common/error.h"

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

Console& Console::of(int fd) {
  static Console out(STDOUT_FILENO), err(STDERR_FILENO);
  if (fd == STDOUT_FILENO) return out;
  if (fd == STDERR_FILENO) return err;
  throw InvalidArgument("Console::of: fd " + std::to_string(fd) + " is not stdout or stderr");
}

void Console::write(std::string_view text) {
  if (broken_ || text.empty()) return;
  queue_.emplace_back(text);
  pending_ += text.size();
  flush();
}

bool Console::flush() {
  while (!queue_.empty() && !broken_) {
    // A pipe that polls writable has room for PIPE_BUF bytes, so a write of at most that never
    // blocks; files and terminals always poll writable.
    pollfd p{fd_, POLLOUT, 0};
    const int ready = ::poll(&p, 1, 0);
    if (ready == -1 && errno == EINTR) continue;
    if (ready == 0) return false;
    if (ready == -1 || (p.revents & (POLLERR | POLLNVAL)) != 0) {
      broken_ = true;
      break;
    }
    const std::string& front = queue_.front();
    const size_t size = std::min<size_t>(front.size() - offset_, PIPE_BUF);
    const ssize_t n = ::write(fd_, front.data() + offset_, size);
    if (n == -1) {
      if (errno == EINTR || errno == EAGAIN) continue;
      broken_ = true;  // EPIPE and the like: nobody reads this console any more
      break;
    }
    offset_ += static_cast<size_t>(n);
    pending_ -= static_cast<size_t>(n);
    if (offset_ == front.size()) {
      queue_.pop_front();
      offset_ = 0;
    }
  }
  if (broken_) {
    queue_.clear();
    pending_ = 0;
    offset_ = 0;
  }
  return queue_.empty();
}

bool Console::drain(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!flush()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd_, POLLOUT, 0};
    ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 100)));
  }
  return true;
}

StreamSink::StreamSink(const std::string& log_path, Console* console, std::string prefix,
                       size_t tail_lines, mode_t mode)
    : console_(console), prefix_(std::move(prefix)), tail_lines_(tail_lines) {
  // A fresh file, never a name someone else prepared (log_folder.h).
  log_fd_ = ::open(log_path.c_str(),
                   O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_APPEND | O_CLOEXEC, mode);
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
  if (console_ == nullptr) return;
  std::string whole;
  whole.reserve(prefix_.size() + line.size() + 1);
  whole.append(prefix_).append(line).push_back('\n');
  // One queue per console keeps lines of different ranks whole and in order.
  console_->write(whole);
}

}  // namespace cxxlaunch::launcher
