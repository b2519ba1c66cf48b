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

namespace {

bool stderr_joins_stdout = false;

// ANSI: carriage return, then erase to the end of the line.
constexpr std::string_view kEraseLine = "\r\x1b[K";

}  // namespace

Console& Console::of(int fd) {
  static Console out(STDOUT_FILENO), err(STDERR_FILENO);
  if (fd == STDOUT_FILENO || (fd == STDERR_FILENO && stderr_joins_stdout)) return out;
  if (fd == STDERR_FILENO) return err;
  throw InvalidArgument("Console::of: fd " + std::to_string(fd) + " is not stdout or stderr");
}

void Console::joinStderrToStdout() { stderr_joins_stdout = true; }

void Console::enqueue(std::string_view text) {
  queue_.emplace_back(text);
  pending_ += text.size();
}

void Console::write(std::string_view text) {
  if (broken_ || text.empty()) return;
  if (live_on_screen_) {
    enqueue(kEraseLine);
    live_on_screen_ = false;
  }
  enqueue(text);
  at_line_start_ = text.back() == '\n';
  writeQueue();  // the live line comes back at the next flush(): once for a burst of lines
}

void Console::setLiveLine(std::string text) {
  if (broken_ || text == live_) return;
  live_ = std::move(text);
  if (live_.empty() && live_on_screen_) {
    enqueue(kEraseLine);
    live_on_screen_ = false;
  }
  flush();
}

void Console::endLiveLine() {
  if (live_on_screen_ && !broken_) enqueue("\n");
  live_on_screen_ = false;
  live_.clear();
  flush();
}

bool Console::flush() {
  for (;;) {
    writeQueue();
    // Redrawn only once the terminal took everything before it: lines pouring out cost one
    // redraw per burst, not one per line.
    const bool redraw = live_on_screen_ ? live_drawn_ != live_ : at_line_start_;
    if (!queue_.empty() || broken_ || live_.empty() || !redraw) break;
    enqueue("\r" + live_ + "\x1b[K");
    live_on_screen_ = true;
    live_drawn_ = live_;
  }
  return queue_.empty();
}

void Console::writeQueue() {
  while (!queue_.empty() && !broken_) {
    // A pipe that polls writable has room for PIPE_BUF bytes, so a write of at most that never
    // blocks; files and terminals always poll writable.
    pollfd p{fd_, POLLOUT, 0};
    const int ready = ::poll(&p, 1, 0);
    if (ready == -1 && errno == EINTR) continue;
    if (ready == 0) return;
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
