#pragma once
// OutputMux: the workers' stdout and stderr pipes, multiplexed onto their log files and the
// launcher's console (torch.distributed.elastic's redirects and tee, and the tail of a failed
// rank's stderr). Each stream is the read end of a worker's pipe feeding a StreamSink (output.h).
//
// It owns an epoll set of its own, whose fd() the agent's event loop watches among its other
// sources: readable while a stream has output, or while a console that has a queue can take
// more. service() then reads a few buffers of each ready stream (a worker that writes as fast as
// we read must not keep the loop here; epoll is level-triggered, the rest comes next round) and
// updateConsoles() writes what the consoles take, without ever blocking: while a console's queue
// is full, the streams whose lines go there are not read (their workers block in write, as they
// would on the console itself) until it is half empty again. No byte is dropped; the log files
// get every one.
//
// Not thread-safe: the agent's thread.

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "launcher/output.h"

namespace cxxlaunch::launcher {

class OutputMux {
 public:
  // Serving the launcher's stdout and stderr consoles (Console::of). Throws SystemError when the
  // epoll set cannot be made.
  OutputMux();
  // Serving `consoles`, which the sinks added later write to (tests: consoles over pipes).
  explicit OutputMux(std::vector<Console*> consoles);
  ~OutputMux();  // closes the pipes still open
  OutputMux(const OutputMux&) = delete;
  OutputMux& operator=(const OutputMux&) = delete;

  // What the agent's loop watches for readability.
  int fd() const { return epoll_fd_; }

  // Adds a stream: the pipe's read end `fd` (non-blocking; the mux closes it) into `sink`.
  // Returns its id: 0, 1, 2, ... in the order of adding, from the last clear().
  size_t add(int fd, std::unique_ptr<StreamSink> sink);
  size_t size() const { return streams_.size(); }

  // Reads the share of each ready stream, then updateConsoles().
  void service();
  // Writes what the consoles take now, watches a console for room while it has a queue, and
  // pauses or resumes the streams whose lines go to it. The agent calls it after each round of
  // its loop: its own lines go through the consoles too.
  void updateConsoles();
  // A few buffers of stream `id` whatever its console's queue: a dead worker's last words, for
  // the failure tail.
  void readLastWords(size_t id);
  // The last lines stream `id` has seen (as many as its sink keeps), oldest first.
  std::vector<std::string> tail(size_t id) const;
  // Once the writers and everything they started are gone: reads each stream up to EOF or an
  // empty pipe (at most a pipe's worth, so the console queues stay bounded), closes it and ends
  // its last line.
  void closeAll();
  // closeAll(), then forgets the streams: ids start at 0 again.
  void clear();

 private:
  enum class Read { kShare, kLastWords, kAll };
  struct Stream {
    int fd = -1;
    bool paused = false;  // out of the epoll set while its console is full
    std::unique_ptr<StreamSink> sink;
  };
  void read(size_t id, Read how);
  void close(size_t id);
  void watch(size_t id);  // back into the epoll set

  struct Watched {
    Console* console;
    bool for_room = false;  // EPOLLOUT registered: it has a queue
  };
  int epoll_fd_ = -1;
  std::vector<Watched> consoles_;
  std::vector<Stream> streams_;
};

}  // namespace cxxlaunch::launcher
