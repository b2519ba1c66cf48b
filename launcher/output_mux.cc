#include "launcher/output_mux.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>

#include "common/error.h"

namespace cxxlaunch::launcher {
namespace {

// Streams are tagged with their id; consoles with this + their index.
constexpr uint64_t kConsoleTag = uint64_t{1} << 62;

}  // namespace

// Console::of(2) is Console::of(1) once they are joined (the live line): served once.
OutputMux::OutputMux() : OutputMux({&Console::of(STDOUT_FILENO), &Console::of(STDERR_FILENO)}) {}

OutputMux::OutputMux(std::vector<Console*> consoles)
    : epoll_fd_(CXXLAUNCH_SYSCALL(::epoll_create1(EPOLL_CLOEXEC))) {
  for (Console* console : consoles) {
    const bool known = std::any_of(consoles_.begin(), consoles_.end(),
                                   [&](const Watched& w) { return w.console == console; });
    if (!known) consoles_.push_back({console});
  }
}

OutputMux::~OutputMux() {
  for (Stream& s : streams_) {
    if (s.fd != -1) ::close(s.fd);
  }
  ::close(epoll_fd_);
}

size_t OutputMux::add(int fd, std::unique_ptr<StreamSink> sink) {
  streams_.push_back({fd, false, std::move(sink)});
  watch(streams_.size() - 1);
  return streams_.size() - 1;
}

void OutputMux::watch(size_t id) {
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u64 = id;
  CXXLAUNCH_SYSCALL(::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, streams_[id].fd, &event));
}

void OutputMux::service() {
  std::array<epoll_event, 64> events;
  int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), 0);
  for (int i = 0; i < n; ++i) {
    const uint64_t tag = events[static_cast<size_t>(i)].data.u64;
    // A console with room: updateConsoles writes what it takes.
    if (tag < streams_.size()) read(tag, Read::kShare);
  }
  updateConsoles();
}

void OutputMux::readLastWords(size_t id) { read(id, Read::kLastWords); }

std::vector<std::string> OutputMux::tail(size_t id) const { return streams_[id].sink->tail(); }

void OutputMux::read(size_t id, Read how) {
  char buffer[65536];
  Stream& s = streams_[id];
  const Console* console = s.sink->console();
  // A few buffers per wake, none while the console is full (kShare); a few whatever the console
  // (kLastWords); or all (kAll).
  for (int reads = 0; s.fd != -1 && (how == Read::kAll || reads < 4); ++reads) {
    if (how == Read::kShare && console != nullptr && console->full()) return;
    ssize_t n = ::read(s.fd, buffer, sizeof(buffer));
    if (n > 0) {
      s.sink->write({buffer, static_cast<size_t>(n)});
    } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
      close(id);
    } else if (errno == EAGAIN) {
      return;
    }
  }
}

void OutputMux::close(size_t id) {
  Stream& s = streams_[id];
  if (s.fd == -1) return;
  if (!s.paused) ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, s.fd, nullptr);
  s.paused = false;
  ::close(s.fd);
  s.fd = -1;
  s.sink->finish();
}

void OutputMux::closeAll() {
  for (size_t id = 0; id < streams_.size(); ++id) {
    read(id, Read::kAll);
    close(id);
  }
}

void OutputMux::clear() {
  closeAll();
  streams_.clear();
}

void OutputMux::updateConsoles() {
  for (size_t c = 0; c < consoles_.size(); ++c) {
    Console& console = *consoles_[c].console;
    console.flush();
    bool& watched = consoles_[c].for_room;
    const bool want = console.pending() > 0;
    if (want != watched) {
      epoll_event event{};
      event.events = EPOLLOUT;
      event.data.u64 = kConsoleTag + c;
      // A regular file cannot be watched (EPERM) and never needs to be: it always takes all.
      if (::epoll_ctl(epoll_fd_, want ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, console.fd(), &event) == 0 ||
          !want) {
        watched = want;
      }
    }
    const bool pause = console.full();
    const bool resume = console.pending() <= Console::kMaxPending / 2;
    for (size_t id = 0; id < streams_.size(); ++id) {
      Stream& s = streams_[id];
      if (s.fd == -1 || s.sink->console() != &console) continue;
      if (pause && !s.paused) {
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, s.fd, nullptr);
        s.paused = true;
      } else if (resume && s.paused) {
        watch(id);
        s.paused = false;
      }
    }
  }
}

}  // namespace cxxlaunch::launcher
