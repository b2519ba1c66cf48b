#include "launcher/stop_deadline.h"

#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <ctime>

#include "common/error.h"

namespace cxxlaunch::launcher {
namespace {

constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
constexpr char kMessage[] =
    "cxxlaunch: still running past the shutdown grace after a stop signal; exiting now\n";

// Lock-free atomics only: the handler reads and writes them.
std::atomic<int64_t> allowance_ns{0};  // the grace + kStopMargin
std::atomic<int64_t> deadline_ns{0};   // 0: no countdown
std::atomic<int> stop_signal{0};       // set after deadline_ns

int64_t nowNs() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
}

void onTick(int) {
  const int saved = errno;
  if (stop_signal.load() == 0) {
    sigset_t pending;
    if (::sigpending(&pending) == 0) {
      for (int sig : kStopSignals) {
        if (sigismember(&pending, sig) == 1) noteStopSignal(sig);
      }
    }
  } else if (nowNs() >= deadline_ns.load()) {
    ssize_t ignored = ::write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
    (void)ignored;
    ::_exit(128 + stop_signal.load());
  }
  errno = saved;
}

}  // namespace

void noteStopSignal(int signal) {
  int64_t none = 0;
  if (deadline_ns.compare_exchange_strong(none, nowNs() + allowance_ns.load())) {
    stop_signal.store(signal);
  }
}

void armStopDeadline(std::chrono::milliseconds grace) {
  static_assert(std::atomic<int64_t>::is_always_lock_free && std::atomic<int>::is_always_lock_free);
  allowance_ns.store(std::chrono::nanoseconds(grace + kStopMargin).count());
  struct sigaction action {};
  action.sa_handler = onTick;
  action.sa_flags = SA_RESTART;  // most calls go on; poll and epoll_wait say EINTR and are retried
  sigemptyset(&action.sa_mask);
  CXXLAUNCH_SYSCALL(::sigaction(SIGALRM, &action, nullptr));
  itimerval every{};
  every.it_interval.tv_usec = every.it_value.tv_usec = 100'000;
  CXXLAUNCH_SYSCALL(::setitimer(ITIMER_REAL, &every, nullptr));
}

}  // namespace cxxlaunch::launcher
