#include "launcher/monitor.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "common/host.h"
#include "launcher/stop_deadline.h"

namespace cxxlaunch::launcher {
namespace {

// Signals the agent passes on to every worker's process group (torchrun's set plus SLURM's
// preemption signals). The first four also stop the job.
constexpr std::array<int, 6> kForwarded = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

bool stopsJob(int sig) { return sig != SIGUSR1 && sig != SIGUSR2; }

sigset_t monitoredSignals() {
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  for (int sig : kForwarded) sigaddset(&mask, sig);
  return mask;
}

// Event-loop tags.
enum Tag : uint64_t { kSignalTag, kGraceTag, kNewsTag, kHeartbeatTag, kProgressTag, kOutputTag };

// How often the progress display reads the heartbeats (which change at most every 100 ms).
constexpr std::chrono::milliseconds kProgressEvery{250};

// The agent's own lines go through the same console queue as the workers' stderr: they keep
// their order and never block the loop.
void say(const std::string& text) { Console::of(STDERR_FILENO).write(text); }

// Whether fd is a terminal that understands the live line's control sequences.
bool isCapableTerminal(int fd) {
  const char* term = std::getenv("TERM");  // NOLINT(concurrency-mt-unsafe)
  return ::isatty(fd) == 1 && !(term != nullptr && std::strcmp(term, "dumb") == 0);
}

// The columns of the terminal at fd; 80 when it does not say.
size_t terminalWidth(int fd) {
  winsize size{};
  if (::ioctl(fd, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 80;
}

bool sameTerminal(int a, int b) {
  struct stat sa {
  }, sb{};
  return ::isatty(a) == 1 && ::isatty(b) == 1 && ::fstat(a, &sa) == 0 && ::fstat(b, &sb) == 0 &&
         sa.st_rdev == sb.st_rdev;
}

timespec timespecOf(std::chrono::milliseconds ms) {
  timespec t{};
  t.tv_sec = ms.count() / 1000;
  t.tv_nsec = (ms.count() % 1000) * 1'000'000;
  return t;
}

// A timerfd that fires every `period`.
int periodicTimer(std::chrono::milliseconds period) {
  const int fd = CXXLAUNCH_SYSCALL(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  itimerspec every{};
  every.it_value = every.it_interval = timespecOf(period);
  CXXLAUNCH_SYSCALL(::timerfd_settime(fd, 0, &every, nullptr));
  return fd;
}

// Empties a timerfd or eventfd; whether it had a count.
bool drainCounter(int fd) {
  uint64_t count = 0;
  return ::read(fd, &count, sizeof(count)) == static_cast<ssize_t>(sizeof(count));
}

}  // namespace

void blockMonitoredSignals() {
  const sigset_t mask = monitoredSignals();
  CXXLAUNCH_SYSCALL(::pthread_sigmask(SIG_BLOCK, &mask, nullptr));
}

Monitor::Monitor(const LaunchOptions& options, NodeRendezvous& rendezvous)
    : options_(options), rendezvous_(rendezvous), host_(hostName()) {
  blockMonitoredSignals();
  const sigset_t mask = monitoredSignals();
  signal_fd_ = CXXLAUNCH_SYSCALL(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  grace_fd_ = CXXLAUNCH_SYSCALL(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  news_fd_ = CXXLAUNCH_SYSCALL(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  epoll_fd_ = CXXLAUNCH_SYSCALL(::epoll_create1(EPOLL_CLOEXEC));
  auto watch = [this](int fd, Tag tag) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = tag;
    CXXLAUNCH_SYSCALL(::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event));
  };
  watch(signal_fd_, kSignalTag);
  watch(grace_fd_, kGraceTag);
  watch(news_fd_, kNewsTag);
  if (options_.watchdog_timeout.count() > 0) {
    // Four looks per timeout (at most one a second): a stall is seen within 1.25 timeouts.
    heartbeat_fd_ = periodicTimer(std::chrono::milliseconds(
        std::clamp<int64_t>(options_.watchdog_timeout.count() / 4, 1, 1000)));
    watch(heartbeat_fd_, kHeartbeatTag);
  }
  // The progress display (docs/observability.md): the live line needs a terminal; plain lines
  // are for anything else, when asked for.
  if (options_.progress != ProgressMode::kOff && isCapableTerminal(STDOUT_FILENO)) {
    progress_display_ = ProgressDisplay::kLiveLine;
    // Lines on stderr must scroll above the live line too.
    if (sameTerminal(STDOUT_FILENO, STDERR_FILENO)) Console::joinStderrToStdout();
  } else if (options_.progress == ProgressMode::kOn) {
    progress_display_ = ProgressDisplay::kPlainLines;
  }
  if (progress_display_ != ProgressDisplay::kNone) {
    progress_fd_ = periodicTimer(kProgressEvery);
    watch(progress_fd_, kProgressTag);
  }
}

Monitor::~Monitor() {
  for (int fd : {epoll_fd_, signal_fd_, grace_fd_, news_fd_, heartbeat_fd_, progress_fd_}) {
    if (fd != -1) ::close(fd);
  }
}

void Monitor::notify() {
  const uint64_t one = 1;
  ssize_t ignored = ::write(news_fd_, &one, sizeof(one));
  (void)ignored;
}

bool Monitor::takeNews() { return drainCounter(news_fd_); }

void Monitor::publish(const WorkerGroup& group) {
  std::vector<LocalWorker> workers;
  workers.reserve(group.workers().size());
  for (const Worker& w : group.workers()) {
    workers.push_back({w.local_rank, w.global_rank, w.pid, w.running, w.heartbeat_file});
  }
  rendezvous_.publishWorkers(std::move(workers));
}

// SIGTERM (or `sig`) to the workers and the grace's timer started; SIGKILL when the grace is 0
// or the stop was already under way.
void Monitor::stop(WorkerGroup& group, int sig) {
  if (!stopping_) {
    stopping_ = true;
    kill_at_ = std::chrono::steady_clock::now() + options_.shutdown_grace;
    if (options_.shutdown_grace.count() == 0) {
      sig = SIGKILL;
    } else {
      itimerspec grace{};
      grace.it_value = timespecOf(options_.shutdown_grace);
      CXXLAUNCH_SYSCALL(::timerfd_settime(grace_fd_, 0, &grace, nullptr));
    }
  } else {
    sig = SIGKILL;  // asked twice: no more grace
  }
  group.signal(sig);
}

AttemptResult Monitor::run(WorkerGroup& group, OutputMux& output) {
  using Outcome = AttemptResult::Outcome;
  AttemptResult result;
  stopping_ = false;
  kill_at_.reset();
  progress_.restart();
  publish(group);
  epoll_event mux{};
  mux.events = EPOLLIN;
  mux.data.u64 = kOutputTag;
  CXXLAUNCH_SYSCALL(::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, output.fd(), &mux));
  std::array<epoll_event, 16> events;
  while (group.running() > 0) {
    const int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), -1);
    if (n == -1) {
      if (errno == EINTR) continue;
      throw SystemError("epoll_wait", errno);
    }
    for (int i = 0; i < n; ++i) {
      switch (events[static_cast<size_t>(i)].data.u64) {
        case kSignalTag:
          onSignal(group, output, result);
          break;
        case kGraceTag:
          drainCounter(grace_fd_);
          group.signal(SIGKILL);
          break;
        case kHeartbeatTag:
          drainCounter(heartbeat_fd_);
          checkHeartbeats(group, output, result);
          break;
        case kNewsTag:
          drainCounter(news_fd_);
          if (!stopping_ && result.signal == 0) {
            result.outcome = Outcome::kNews;
            result.news = rendezvous_.news();
            stop(group, SIGTERM);
          }
          break;
        case kProgressTag:
          drainCounter(progress_fd_);
          showProgress(group);
          break;
        case kOutputTag:
          output.service();
          break;
      }
    }
    output.updateConsoles();
  }
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, output.fd(), nullptr);
  // The workers are gone; what they started is not allowed to outlive them.
  const int late_signal = group.stopLeftovers(
      kill_at_.value_or(std::chrono::steady_clock::now() + options_.shutdown_grace),
      [this](std::chrono::milliseconds timeout) { return waitForStop(timeout, false); });
  if (late_signal != 0 && result.signal == 0) result.signal = late_signal;
  itimerspec off{};
  ::timerfd_settime(grace_fd_, 0, &off, nullptr);
  // Whatever a worker wrote before it exited is in its pipes now.
  output.closeAll();
  if (progress_display_ != ProgressDisplay::kNone) showProgress(group);  // the last steps
  // The attempt's last progress stays on the screen, above what follows (a failure table, a
  // restart's lines).
  if (progress_display_ == ProgressDisplay::kLiveLine) Console::of(STDOUT_FILENO).endLiveLine();
  output.updateConsoles();
  if (result.signal != 0) {
    result.outcome = Outcome::kInterrupted;
    result.failures.clear();
  } else if (result.outcome == Outcome::kNews) {
    result.failures
        .clear();  // stopped for the rendezvous: exits caused by the stop are not failures
  } else if (!result.failures.empty()) {
    result.outcome = Outcome::kFailed;
  }
  return result;
}

void Monitor::onSignal(WorkerGroup& group, OutputMux& output, AttemptResult& result) {
  signalfd_siginfo info{};
  while (::read(signal_fd_, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
    const int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGCHLD) {
      onExits(group, output, group.reap(), result);
    } else if (stopsJob(sig)) {
      noteStopSignal(sig);
      if (result.signal == 0) {
        say("cxxlaunch: received " + signalName(sig) + ", stopping " +
            std::to_string(group.running()) + " workers\n");
      }
      result.signal = sig;
      stop(group, sig);
    } else {
      group.signal(sig);
    }
  }
}

// Exits seen together count as failures together, before the stop; exits after the stop was
// begun were caused by it.
void Monitor::onExits(WorkerGroup& group, OutputMux& output, const std::vector<WorkerExit>& exits,
                      AttemptResult& result) {
  if (exits.empty()) return;
  publish(group);
  if (stopping_) return;
  bool failed = false;
  for (const WorkerExit& e : exits) {
    if (WIFEXITED(e.status) && WEXITSTATUS(e.status) == 0) continue;
    const Worker& w = group.workers()[e.index];
    output.readLastWords(e.index * 2 + 1);  // its last words belong in the tail
    Failure f;
    f.global_rank = w.global_rank;
    f.local_rank = w.local_rank;
    f.host = host_;
    f.pid = w.pid;
    f.time = std::chrono::system_clock::now();
    if (WIFSIGNALED(e.status)) {
      f.signal = WTERMSIG(e.status);
    } else {
      f.exit_code = WEXITSTATUS(e.status);
    }
    if (auto report = readErrorFile(w.error_file)) {
      f.error_message = report->message;
      if (report->time) f.time = *report->time;
    }
    f.stderr_tail = output.tail(e.index * 2 + 1);
    result.failures.push_back(std::move(f));
    failed = true;
  }
  if (failed) stop(group, SIGTERM);
}

// A worker whose heartbeat (created by the runtime at its start, touched at every micro-step) is
// older than --watchdog_timeout has stopped making progress (SIGSTOP, a deadlock, a hang outside
// collectives): it is the job's failure, named with how long it was silent, and the job stops
// (SIGTERM, then SIGKILL after the grace: a stopped process dies of SIGKILL only). Workers that
// never created the file (no runtime) are not watched.
void Monitor::checkHeartbeats(WorkerGroup& group, OutputMux& output, AttemptResult& result) {
  if (stopping_) return;
  // The rank silent the longest is the culprit: the others stopped beating later, in a
  // collective waiting for it.
  const auto now = std::chrono::system_clock::now();
  const std::vector<Worker>& workers = group.workers();
  std::optional<size_t> stalled;
  std::chrono::milliseconds longest{0};
  for (size_t i = 0; i < workers.size(); ++i) {
    struct stat st {};
    if (!workers[i].running || ::stat(workers[i].heartbeat_file.c_str(), &st) != 0) continue;
    const auto beat = std::chrono::system_clock::time_point(
        std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec));
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - beat);
    if (silent >= options_.watchdog_timeout && silent > longest) {
      stalled = i;
      longest = silent;
    }
  }
  if (!stalled) return;
  const Worker& w = workers[*stalled];
  Failure f;
  f.global_rank = w.global_rank;
  f.local_rank = w.local_rank;
  f.host = host_;
  f.pid = w.pid;
  f.time = now;
  f.signal = SIGKILL;  // what ends it, if SIGTERM does not
  char text[160];
  std::snprintf(text, sizeof(text),
                "made no progress for %.1f s (--watchdog_timeout %.1f s): stopped by the launcher",
                static_cast<double>(longest.count()) / 1000,
                static_cast<double>(options_.watchdog_timeout.count()) / 1000);
  f.error_message = text;
  output.readLastWords(*stalled * 2 + 1);
  f.stderr_tail = output.tail(*stalled * 2 + 1);
  result.failures.push_back(std::move(f));
  say("cxxlaunch: rank " + std::to_string(w.global_rank) + " (pid " + std::to_string(w.pid) + ") " +
      text + "; stopping " + std::to_string(group.running()) + " workers\n");
  stop(group, SIGTERM);
}

// Reads the local workers' heartbeat records and shows what they say: the live line, or a plain
// line when one is due.
void Monitor::showProgress(const WorkerGroup& group) {
  std::vector<RankRecord> records;
  for (const Worker& w : group.workers()) {
    if (auto r = readHeartbeatRecord(w.heartbeat_file)) records.push_back({w.global_rank, *r});
  }
  const auto now = std::chrono::steady_clock::now();
  progress_.update(records, now);
  if (!progress_.started()) return;
  Console& console = Console::of(STDOUT_FILENO);
  if (progress_display_ == ProgressDisplay::kLiveLine) {
    // One column short of the width: a line that fills the last column wraps on some terminals.
    console.setLiveLine(progress_.line(terminalWidth(STDOUT_FILENO) - 1));
  } else if (progress_display_ == ProgressDisplay::kPlainLines) {
    console.write(progress_.plainLine(now));
  }
}

int Monitor::waitForStop(std::chrono::milliseconds timeout, bool news_too) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    pollfd fds[2] = {{signal_fd_, POLLIN, 0}, {news_too ? news_fd_ : -1, POLLIN, 0}};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return 0;
    const int n = ::poll(fds, 2, static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
    if (n == -1 && errno == EINTR) continue;
    if (n == -1) throw SystemError("poll", errno);
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo info{};
      while (::read(signal_fd_, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
        const int sig = static_cast<int>(info.ssi_signo);
        if (sig != SIGCHLD && stopsJob(sig)) {
          noteStopSignal(sig);
          return sig;
        }
        if (sig == SIGCHLD) {
          while (::waitpid(-1, nullptr, WNOHANG) > 0) {
          }
        }
      }
    }
    if (fds[1].revents & POLLIN) return 0;
  }
}

}  // namespace cxxlaunch::launcher
