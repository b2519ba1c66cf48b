#pragma once
// What happens to a worker's stdout or stderr: every byte goes to its log file; whole lines,
// prefixed with the rank, go to the console when asked; the last lines are kept for the failure
// summary. Single-threaded: the node agent owns every sink and feeds it from its event loop.
//
// The console never blocks that loop: a terminal or pipe that is not read (`cxxlaunch run ... |
// slow_reader`) must not delay the launcher's reaction to a failed worker or a signal. Lines wait
// in a bounded queue per console and are written only as far as the console takes them at once;
// while the queue is full the agent stops reading the workers whose lines go there (they block
// in write, as they would writing to the console themselves), so no byte is dropped and the log
// files get everything.

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace cxxlaunch::launcher {

// Writes all of `data` to `fd`, retrying short writes and EINTR. Returns false on error.
bool writeAll(int fd, std::string_view data);

// The launcher's stdout or stderr as the event loop writes it. Not thread-safe (the loop's).
class Console {
 public:
  // Past this many queued bytes the console is full(): the agent pauses its producers.
  static constexpr size_t kMaxPending = 1 << 20;

  // The console of fd 1 or 2, one per process.
  static Console& of(int fd);
  // From now on of(2) is of(1): when both are the same terminal, the live line below must see
  // every line written to it.
  static void joinStderrToStdout();
  // A console over any fd (tests).
  explicit Console(int fd) : fd_(fd) {}

  int fd() const { return fd_; }
  // Queues `text` and writes as much as the console takes without blocking.
  void write(std::string_view text);
  // Writes queued text while the console takes it, and then redraws the live line if it is not
  // on the screen; returns whether the queue is empty.
  bool flush();
  size_t pending() const { return pending_; }
  bool full() const { return pending_ > kMaxPending; }
  // Blocks up to `timeout` for the queue to be written (the launcher's exit). Returns whether
  // everything was written.
  bool drain(std::chrono::milliseconds timeout);

  // A terminal's live line (the launcher's progress, docs/observability.md): it stays at the
  // bottom while the console's other lines scroll above it (erased before they are written,
  // redrawn by the next flush() once the terminal has taken them). `text` (one line, no newline, at
  // most the terminal's width) replaces it; "" removes it. Only for a console that is a terminal.
  void setLiveLine(std::string text);
  // Leaves the live line where it is, as an ordinary line, and stops redrawing it.
  void endLiveLine();

 private:
  int fd_;
  std::deque<std::string> queue_;
  size_t offset_ = 0;  // of queue_.front() already written
  size_t pending_ = 0;
  bool broken_ = false;  // a write failed (closed pipe): the console is gone, drop its text
  // The screen as it will be once the queue is written: whether the live line is its last line
  // (the cursor at its end), with what text; whether the last text queued ended a line.
  std::string live_;
  bool live_on_screen_ = false;
  std::string live_drawn_;
  bool at_line_start_ = true;
  void enqueue(std::string_view text);
  void writeQueue();  // as much as the console takes now
};

class StreamSink {
 public:
  // A line longer than this reaches the console in pieces of this size.
  static constexpr size_t kMaxLine = 64 * 1024;

  // `console` nullptr: not echoed; it must outlive the sink. The log file is created with `mode`
  // and must not exist yet (nor be a symlink). Throws SystemError when it cannot be created.
  StreamSink(const std::string& log_path, Console* console, std::string prefix, size_t tail_lines,
             mode_t mode = 0600);
  Console* console() const { return console_; }
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
  Console* console_;
  std::string prefix_;
  size_t tail_lines_;
  std::string partial_;
  std::deque<std::string> tail_;
};

}  // namespace cxxlaunch::launcher
