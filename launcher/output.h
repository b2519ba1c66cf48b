#pragma once
// What happens to a worker's stdout or stderr: every byte goes to its log file; whole lines,
// prefixed with the rank, go to the console when asked; the last lines are kept for the failure
// summary. Single-threaded: the node agent owns every sink and feeds it from its event loop.

#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace cxxlaunch::launcher {

// Writes all of `data` to `fd`, retrying short writes and EINTR. Returns false on error.
bool writeAll(int fd, std::string_view data);

class StreamSink {
 public:
  // A line longer than this reaches the console in pieces of this size.
  static constexpr size_t kMaxLine = 64 * 1024;

  // `console_fd` -1: not echoed. Throws SystemError when the log file cannot be created.
  StreamSink(const std::string& log_path, int console_fd, std::string prefix, size_t tail_lines);
  ~StreamSink();
  StreamSink(const StreamSink&) = delete;
  StreamSink& operator=(const StreamSink&) = delete;

  void write(std::string_view data);
  // Ends a last line that has no newline.
  void finish();
  // The last `tail_lines` lines seen, oldest first.
  std::vector<std::string> tail() const { return {tail_.begin(), tail_.end()}; }

 private:
  void emitLine(std::string_view line);

  int log_fd_ = -1;
  int console_fd_;
  std::string prefix_;
  size_t tail_lines_;
  std::string partial_;
  std::deque<std::string> tail_;
};

}  // namespace cxxlaunch::launcher
