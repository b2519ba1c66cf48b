#include "launcher/agent.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
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
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "common/env_names.h"
#include "common/error.h"
#include "common/host.h"
#include "launcher/cgroup.h"
#include "launcher/failure.h"
#include "launcher/log_folder.h"
#include "launcher/output.h"
#include "launcher/process.h"
#include "launcher/progress.h"
#include "launcher/stop_deadline.h"

namespace cxxlaunch::launcher {
namespace fs = std::filesystem;
namespace {

// Signals the agent passes on to every worker's process group (torchrun's set plus SLURM's
// preemption signals). The first four also stop the job.
constexpr std::array<int, 6> kForwarded = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
constexpr size_t kStderrTailLines = 10;

bool stopsJob(int sig) { return sig != SIGUSR1 && sig != SIGUSR2; }

sigset_t agentSignals() {
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  for (int sig : kForwarded) sigaddset(&mask, sig);
  return mask;
}

std::string substituteLocalRank(std::string arg, int local_rank) {
  static const std::string kMacro = "${local_rank}";
  for (size_t at = arg.find(kMacro); at != std::string::npos; at = arg.find(kMacro, at)) {
    arg.replace(at, kMacro.size(), std::to_string(local_rank));
  }
  return arg;
}

struct Worker {
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = -1;
  bool running = false;
  std::string error_file;
  std::string heartbeat_file;                // touched by the runtime: status, --watchdog_timeout
  std::array<int, 2> fds{-1, -1};            // stdout, stderr read ends
  std::array<bool, 2> paused{false, false};  // not read while its console is full
  std::array<std::unique_ptr<StreamSink>, 2> sinks;
};

// The agent's own lines go through the same console queue as the workers' stderr: they keep
// their order and never block the loop.
void say(const std::string& text) { Console::of(STDERR_FILENO).write(text); }

// How long a finishing launcher waits for a console that does not take its last lines (the log
// files have them all).
constexpr std::chrono::seconds kConsoleDrain{5};

enum class Outcome { kSucceeded, kFailed, kInterrupted, kNews };

struct AttemptResult {
  Outcome outcome = Outcome::kSucceeded;
  std::vector<Failure> failures;
  int signal = 0;  // for kInterrupted
  Decision news;   // for kNews: what the rendezvous said
};

class Agent {
 public:
  Agent(const LaunchOptions& options, NodeRendezvous& rendezvous)
      : options_(options), rendezvous_(rendezvous), host_(hostName()), run_id_(options.run_id) {}

  ~Agent() {
    for (int fd : {epoll_fd_, signal_fd_, timer_fd_, news_fd_, tick_fd_, progress_fd_}) {
      if (fd != -1) ::close(fd);
    }
  }

  int run();

 private:
  void setUpProcess();
  void makeLogFolder();
  std::optional<WorldAssignment> joinInterruptibly(int& signal);
  std::optional<Decision> waitForPeers(int& signal);
  int waitForStopSignal(int extra_fd, std::chrono::milliseconds timeout);
  void notifyNews();
  int finish(RunReport& report, const std::string& status, int exit_code);
  void spawnWorkers(int attempt, const WorldAssignment& world);
  AttemptResult monitor();
  void onSignal(std::vector<Failure>& failures, AttemptResult& result);
  void reap(std::vector<Failure>& failures);
  void checkProgress(std::vector<Failure>& failures);  // --watchdog_timeout
  void publishWorkers();                               // for the keep-alives (cxxlaunch status)
  void showProgress();                                 // --progress: the heartbeats' records
  void recordStepTimes(RunReport& report) const;       // for run-summary.json
  // How much readOutput takes: a few buffers unless the console is full (the loop's share), a few
  // buffers whatever the console (a dead worker's last words, for the failure tail), or all up
  // to EOF or an empty pipe (once the worker and everything it started are gone).
  enum class Read { kShare, kLastWords, kAll };
  void readOutput(Worker& worker, int stream, Read how = Read::kShare);
  void closeStream(Worker& worker, int stream);
  void signalWorkers(int sig);
  void beginStop(int sig);
  void updateConsoles();
  void stopLeftovers();
  size_t running() const;
  // Whether the user gave workers `name` (their own environment, or the config's worker env).
  bool userSets(const char* name) const;
  std::vector<std::string> workerEnvironment(const Worker& worker,
                                             const WorldAssignment& world) const;

  const LaunchOptions& options_;
  NodeRendezvous& rendezvous_;
  std::string host_;
  std::string run_id_;
  LogFolder log_;
  std::vector<std::string> base_env_;
  std::vector<Worker> workers_;
  int epoll_fd_ = -1;
  int signal_fd_ = -1;
  int timer_fd_ = -1;
  int news_fd_ = -1;  // eventfd: the rendezvous has news, or a join finished
  int tick_fd_ = -1;  // with --watchdog_timeout: a periodic timer to look at the heartbeats
  // With a progress display: a periodic timer to read the heartbeats' records.
  int progress_fd_ = -1;
  enum class ProgressDisplay { kNone, kLiveLine, kPlainLines };
  ProgressDisplay progress_display_ = ProgressDisplay::kNone;
  ProgressMeter progress_;
  bool stopping_ = false;
  std::optional<std::chrono::steady_clock::time_point> kill_at_;  // when the grace ends
  std::array<bool, 2> console_watched_{false, false};             // EPOLLOUT registered for fd 1, 2
  std::unique_ptr<JobCgroup> cgroup_;  // null: confined by process groups alone
  bool cgroup_refused_ = false;        // a worker could not enter it; the rest do not try
  std::string confinement_;            // which mechanism, for run-summary.json
  std::unique_ptr<GroupWatchdog> watchdog_;
  int late_signal_ = 0;  // a stop signal that came while stopLeftovers waited
};

// Event-loop tags: pipes are tagged with worker index * 2 + stream.
constexpr uint64_t kSignalTag = ~uint64_t{0};
constexpr uint64_t kTimerTag = ~uint64_t{0} - 1;
constexpr uint64_t kNewsTag = ~uint64_t{0} - 2;
constexpr uint64_t kTickTag = ~uint64_t{0} - 3;
constexpr uint64_t kProgressTag = ~uint64_t{0} - 4;
// + 1 for stdout, + 2 for stderr: clear of the tags above (a writable console is not news).
constexpr uint64_t kConsoleTag = ~uint64_t{0} - 8;

// How often the progress display reads the heartbeats (which change at most every 100 ms).
constexpr std::chrono::milliseconds kProgressEvery{250};

// Whether fd is a terminal that understands the live line's control sequences.
bool isCapableTerminal(int fd) {
  const char* term = std::getenv("TERM");
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

void Agent::setUpProcess() {
  // Reparent orphaned grandchildren to us so every exit is seen and reaped, and so that
  // stopLeftovers finds every process the workers left behind.
  CXXLAUNCH_SYSCALL(::prctl(PR_SET_CHILD_SUBREAPER, 1));
  // A cgroup per job where the machine gives one (cgroup.h); process groups in any case.
  cgroup_ = JobCgroup::create("cxxlaunch-" + run_id_ + "-" + std::to_string(::getpid()));
  confinement_ = cgroup_ ? "cgroup " + cgroup_->path() : "process groups";
  watchdog_ = std::make_unique<GroupWatchdog>(cgroup_ ? cgroup_->path() : "");
  ::signal(SIGPIPE, SIG_IGN);  // a closed console must not kill the agent
  blockAgentSignals();
  const sigset_t mask = agentSignals();
  signal_fd_ = CXXLAUNCH_SYSCALL(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  timer_fd_ = CXXLAUNCH_SYSCALL(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  news_fd_ = CXXLAUNCH_SYSCALL(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  epoll_fd_ = CXXLAUNCH_SYSCALL(::epoll_create1(EPOLL_CLOEXEC));
  for (auto [fd, tag] : {std::pair{signal_fd_, kSignalTag}, std::pair{timer_fd_, kTimerTag},
                         std::pair{news_fd_, kNewsTag}}) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = tag;
    CXXLAUNCH_SYSCALL(::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event));
  }
  if (options_.watchdog_timeout.count() > 0) {
    // Looks at the heartbeats four times per timeout (at most once a second): a stall is seen
    // within 1.25 timeouts.
    tick_fd_ = CXXLAUNCH_SYSCALL(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
    const auto ms =
        std::min<int64_t>(1000, std::max<int64_t>(1, options_.watchdog_timeout.count() / 4));
    itimerspec every{};
    every.it_value.tv_sec = every.it_interval.tv_sec = ms / 1000;
    every.it_value.tv_nsec = every.it_interval.tv_nsec = (ms % 1000) * 1'000'000;
    CXXLAUNCH_SYSCALL(::timerfd_settime(tick_fd_, 0, &every, nullptr));
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = kTickTag;
    CXXLAUNCH_SYSCALL(::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, tick_fd_, &event));
  }
  // The progress display (docs/observability.md): the live line needs a terminal; plain lines
  // are for anything else, when asked for.
  const bool terminal = isCapableTerminal(STDOUT_FILENO);
  if (options_.progress != ProgressMode::kOff && terminal) {
    progress_display_ = ProgressDisplay::kLiveLine;
    // Lines on stderr must scroll above the live line too.
    if (sameTerminal(STDOUT_FILENO, STDERR_FILENO)) Console::joinStderrToStdout();
  } else if (options_.progress == ProgressMode::kOn) {
    progress_display_ = ProgressDisplay::kPlainLines;
  }
  if (progress_display_ != ProgressDisplay::kNone) {
    progress_fd_ = CXXLAUNCH_SYSCALL(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
    itimerspec every{};
    every.it_value = every.it_interval = timespecOf(kProgressEvery);
    CXXLAUNCH_SYSCALL(::timerfd_settime(progress_fd_, 0, &every, nullptr));
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = kProgressTag;
    CXXLAUNCH_SYSCALL(::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, progress_fd_, &event));
  }
  // The contract's variables are ours to set; everything else the workers inherit.
  const std::vector<std::string> ours = {
      env::kRank,          env::kLocalRank,      env::kWorldSize,  env::kLocalWorldSize,
      env::kGroupRank,     env::kGroupWorldSize, env::kRoleName,   env::kRoleRank,
      env::kRoleWorldSize, env::kMasterAddr,     env::kMasterPort, env::kRestartCount,
      env::kMaxRestarts,   env::kRunId,          env::kErrorFile,  env::kStoreEndpoint,
      env::kStorePrefix,   env::kToken,          env::kDevice,     env::kTlsCa,
      env::kTlsCert,       env::kTlsKey,         env::kNodeAddr,   env::kStoreUser};
  for (auto& entry : currentEnvironment()) {
    const std::string name = entry.substr(0, entry.find('='));
    if (std::find(ours.begin(), ours.end(), name) == ours.end() &&
        options_.worker_env.count(name) == 0) {
      base_env_.push_back(entry);
    }
  }
  const bool omp_set = std::any_of(base_env_.begin(), base_env_.end(), [](const auto& e) {
    return e.starts_with(std::string(env::kOmpNumThreads) + "=");
  });
  if (!omp_set && options_.nproc_per_node > 1) {
    base_env_.push_back(std::string(env::kOmpNumThreads) + "=1");
  }
}

void Agent::makeLogFolder() {
  std::vector<std::string> components = {run_id_};
  // Nodes of one job may share a machine (and a log folder): each gets its own below the job's.
  if (options_.rdzv.multiNode()) components.push_back(host_ + "_" + std::to_string(::getpid()));
  log_ = makeRunFolder(options_.log_dir, components);
  if (!log_.note.empty()) say("cxxlaunch: note: " + log_.note + "\n");
}

bool Agent::userSets(const char* name) const {
  const std::string prefix = std::string(name) + "=";
  return options_.worker_env.count(name) > 0 ||
         std::any_of(base_env_.begin(), base_env_.end(),
                     [&](const std::string& e) { return e.starts_with(prefix); });
}

std::vector<std::string> Agent::workerEnvironment(const Worker& worker,
                                                  const WorldAssignment& world) const {
  std::vector<std::string> envv = base_env_;
  auto put = [&](const char* name, const std::string& value) {
    envv.push_back(std::string(name) + "=" + value);
  };
  const std::string local_world = std::to_string(options_.nproc_per_node);
  put(env::kRank, std::to_string(worker.global_rank));
  put(env::kLocalRank, std::to_string(worker.local_rank));
  put(env::kWorldSize, std::to_string(world.world_size));
  put(env::kLocalWorldSize, local_world);
  put(env::kGroupRank, std::to_string(world.node_rank));
  put(env::kGroupWorldSize, std::to_string(world.num_nodes));
  put(env::kRoleName, options_.role);
  put(env::kRoleRank, std::to_string(worker.global_rank));
  put(env::kRoleWorldSize, std::to_string(world.world_size));
  put(env::kMasterAddr, world.master_addr);
  put(env::kMasterPort, std::to_string(world.master_port));
  if (!world.node_addr.empty()) put(env::kNodeAddr, world.node_addr);
  // Across nodes, PyTorch's Gloo binds to what the host name resolves to, often a loopback
  // address, and NCCL picks an interface of its own: both are told the one that holds this
  // node's address, unless the user chose (docs/env.md).
  if (world.num_nodes > 1 && !world.node_addr.empty()) {
    const std::string interface = interfaceHolding(world.node_addr);
    for (const char* name : {env::kGlooSocketIfname, env::kNcclSocketIfname}) {
      if (!interface.empty() && !userSets(name)) put(name, interface);
    }
  }
  put(env::kRestartCount, std::to_string(world.restart_count));
  put(env::kMaxRestarts, std::to_string(options_.max_restarts));
  put(env::kRunId, run_id_);
  put(env::kErrorFile, worker.error_file);
  if (!world.store_endpoint.empty()) {
    put(env::kStoreEndpoint, world.store_endpoint);
    put(env::kStorePrefix, world.store_prefix);
    if (!world.token.empty()) put(env::kToken, world.token);
    if (!world.store_user.empty()) put(env::kStoreUser, world.store_user);
    if (!world.tls_ca.empty()) put(env::kTlsCa, world.tls_ca);
    if (!world.tls_cert.empty()) put(env::kTlsCert, world.tls_cert);
    if (!world.tls_key.empty()) put(env::kTlsKey, world.tls_key);
  }
  // Every worker sees the chosen GPUs (CUDA_VISIBLE_DEVICES, in worker_env) and uses the one at
  // its local rank.
  if (!options_.gpus.empty()) put(env::kDevice, std::to_string(worker.local_rank));
  if (!worker.heartbeat_file.empty()) put(env::kHeartbeatFile, worker.heartbeat_file);
  for (const auto& [name, value] : options_.worker_env) put(name.c_str(), value);
  return envv;
}

void Agent::spawnWorkers(int attempt, const WorldAssignment& world) {
  const std::string attempt_name = "attempt_" + std::to_string(attempt);
  fs::remove_all(log_.path / attempt_name);
  workers_.clear();
  workers_.resize(static_cast<size_t>(options_.nproc_per_node));
  stopping_ = false;
  kill_at_.reset();
  if (cgroup_) cgroup_->startAttempt(attempt);
  progress_.restart();
  for (size_t i = 0; i < workers_.size(); ++i) {
    Worker& w = workers_[i];
    w.local_rank = static_cast<int>(i);
    w.global_rank = world.rank_offset + w.local_rank;
    const fs::path dir =
        makeSubfolders(log_.path, {attempt_name, std::to_string(w.local_rank)}, log_.folder_mode);
    w.error_file = (dir / "error.json").string();
    // Always: a touch per micro-step costs about a microsecond, and `cxxlaunch status` shows
    // its age with or without --watchdog_timeout (docs/reliability.md).
    w.heartbeat_file = (dir / "heartbeat").string();
    const std::string prefix = world.num_nodes > 1
                                   ? "[rank " + std::to_string(world.node_rank) + ":" +
                                         std::to_string(w.global_rank) + "]: "
                                   : "[rank " + std::to_string(w.global_rank) + "]: ";
    const std::array<const char*, 2> names = {"stdout.log", "stderr.log"};
    for (int s = 0; s < 2; ++s) {
      const int stream = s == 0 ? StreamSpec::kOut : StreamSpec::kErr;
      Console* console = options_.onConsole(w.local_rank, stream)
                             ? &Console::of(s == 0 ? STDOUT_FILENO : STDERR_FILENO)
                             : nullptr;
      w.sinks[static_cast<size_t>(s)] =
          std::make_unique<StreamSink>((dir / names[static_cast<size_t>(s)]).string(), console,
                                       prefix, s == 1 ? kStderrTailLines : 0, log_.file_mode);
    }
    SpawnSpec spec;
    spec.program = options_.program;
    spec.argv.push_back(options_.program);
    for (const auto& arg : options_.args)
      spec.argv.push_back(substituteLocalRank(arg, w.local_rank));
    spec.env = workerEnvironment(w, world);
    if (cgroup_ && !cgroup_refused_) {
      spec.cgroup_dir_fd = cgroup_->dirFd();
      spec.cgroup_procs_fd = cgroup_->procsFd();
    }
    SpawnedProcess process = spawnProcess(spec);
    w.pid = process.pid;
    w.running = true;
    if (process.cgroup_error != 0) {
      cgroup_refused_ = true;
      confinement_ = "process groups (cgroup " + cgroup_->path() +
                     " refused a worker: " + std::strerror(process.cgroup_error) + ")";
      say("cxxlaunch: confining by " + confinement_ + "\n");
    }
    watchdog_->add(w.pid);  // its process group, in case we are SIGKILLed
    w.fds = {process.stdout_fd, process.stderr_fd};
    for (int s = 0; s < 2; ++s) {
      epoll_event event{};
      event.events = EPOLLIN;
      event.data.u64 = i * 2 + static_cast<uint64_t>(s);
      CXXLAUNCH_SYSCALL(
          ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, w.fds[static_cast<size_t>(s)], &event));
    }
  }
  publishWorkers();
}

// Reads the local workers' heartbeat records and shows what they say: the live line, or a plain
// line when one is due.
void Agent::showProgress() {
  std::vector<RankRecord> records;
  for (const Worker& w : workers_) {
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

// Each local worker's last heartbeat record: its steps and step times (docs/observability.md).
void Agent::recordStepTimes(RunReport& report) const {
  for (const Worker& w : workers_) {
    if (auto r = readHeartbeatRecord(w.heartbeat_file)) {
      report.step_times.push_back({w.global_rank, r->steps, r->step_us, r->work_us});
    }
  }
}

void Agent::publishWorkers() {
  std::vector<LocalWorker> workers;
  workers.reserve(workers_.size());
  for (const Worker& w : workers_) {
    workers.push_back({w.local_rank, w.global_rank, w.pid, w.running, w.heartbeat_file});
  }
  rendezvous_.publishWorkers(std::move(workers));
}

size_t Agent::running() const {
  return static_cast<size_t>(
      std::count_if(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; }));
}

void Agent::signalWorkers(int sig) {
  // Only groups whose leader is unreaped: its pid cannot have been reused yet.
  for (const Worker& w : workers_) {
    if (w.running) ::kill(-w.pid, sig);
  }
}

void Agent::beginStop(int sig) {
  if (!stopping_) {
    stopping_ = true;
    itimerspec grace{};
    const auto ms = options_.shutdown_grace.count();
    grace.it_value.tv_sec = ms / 1000;
    grace.it_value.tv_nsec = (ms % 1000) * 1'000'000;
    kill_at_ = std::chrono::steady_clock::now() + options_.shutdown_grace;
    if (ms == 0) {
      sig = SIGKILL;
    } else {
      CXXLAUNCH_SYSCALL(::timerfd_settime(timer_fd_, 0, &grace, nullptr));
    }
  } else {
    sig = SIGKILL;  // asked twice: no more grace
  }
  signalWorkers(sig);
}

void Agent::readOutput(Worker& worker, int stream, Read how) {
  char buffer[65536];
  int& fd = worker.fds[static_cast<size_t>(stream)];
  const Console* console = worker.sinks[static_cast<size_t>(stream)]->console();
  // A worker that writes as fast as we read would keep us here for ever: a few buffers per wake,
  // then back to the loop (epoll is level-triggered), and none while its console is full.
  for (int reads = 0; fd != -1 && (how == Read::kAll || reads < 4); ++reads) {
    if (how == Read::kShare && console != nullptr && console->full()) return;
    ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      worker.sinks[static_cast<size_t>(stream)]->write({buffer, static_cast<size_t>(n)});
    } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
      closeStream(worker, stream);
    } else if (errno == EAGAIN) {
      return;
    }
  }
}

void Agent::closeStream(Worker& worker, int stream) {
  int& fd = worker.fds[static_cast<size_t>(stream)];
  if (fd == -1) return;
  if (!worker.paused[static_cast<size_t>(stream)])
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  worker.paused[static_cast<size_t>(stream)] = false;
  ::close(fd);
  fd = -1;
  worker.sinks[static_cast<size_t>(stream)]->finish();
}

// Writes what the consoles take now, watches a console for room while it has a queue, and
// pauses reading the workers whose lines go to a full console (resumed at half full).
void Agent::updateConsoles() {
  for (int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    Console& console = Console::of(fd);
    if (fd == STDERR_FILENO && &console == &Console::of(STDOUT_FILENO)) continue;  // joined
    console.flush();
    bool& watched = console_watched_[static_cast<size_t>(fd - 1)];
    const bool want = console.pending() > 0;
    if (want != watched) {
      epoll_event event{};
      event.events = EPOLLOUT;
      event.data.u64 = kConsoleTag + static_cast<uint64_t>(fd);
      // A regular file cannot be watched (EPERM) and never needs to be: it always takes all.
      if (::epoll_ctl(epoll_fd_, want ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, fd, &event) == 0 || !want) {
        watched = want;
      }
    }
    const bool pause = console.full();
    const bool resume = console.pending() <= Console::kMaxPending / 2;
    for (size_t i = 0; i < workers_.size(); ++i) {
      Worker& w = workers_[i];
      for (size_t s = 0; s < 2; ++s) {
        if (w.fds[s] == -1 || w.sinks[s] == nullptr || w.sinks[s]->console() != &console) continue;
        if (pause && !w.paused[s]) {
          ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, w.fds[s], nullptr);
          w.paused[s] = true;
        } else if (resume && w.paused[s]) {
          epoll_event event{};
          event.events = EPOLLIN;
          event.data.u64 = i * 2 + s;
          CXXLAUNCH_SYSCALL(::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, w.fds[s], &event));
          w.paused[s] = false;
        }
      }
    }
  }
}

// Every worker has exited; whatever they started must not outlive them.
//  1. SIGTERM to each worker's process group, to every child of ours (as child subreaper we
//     inherit every orphan below the workers, however it detached), but for the watchdog, and
//     to every process in the job's cgroup, if there is one.
//  2. Wait for them to exit, reaping as they go (each exit may hand us its own children, which
//     get the same), until the stop's grace ends: the one already running when the workers were
//     stopped, else a fresh shutdown_grace.
//  3. SIGKILL whatever is left (the cgroup at once: cgroup.kill), until nothing is.
//  4. Tell the watchdog the groups are empty.
void Agent::stopLeftovers() {
  const auto deadline =
      kill_at_.value_or(std::chrono::steady_clock::now() + options_.shutdown_grace);
  std::set<pid_t> termed;
  for (;;) {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    const bool kill = std::chrono::steady_clock::now() >= deadline;
    bool any = false;
    for (const Worker& w : workers_) {
      if (w.pid > 0 && ::kill(-w.pid, 0) == 0) {
        any = true;
        if (kill || termed.insert(-w.pid).second) ::kill(-w.pid, kill ? SIGKILL : SIGTERM);
      }
    }
    for (pid_t child : childrenOf(::getpid())) {
      if (child == watchdog_->pid()) continue;
      any = true;
      if (kill || termed.insert(child).second) ::kill(child, kill ? SIGKILL : SIGTERM);
    }
    if (cgroup_ && cgroup_->populated()) {
      any = true;
      if (kill) {
        cgroup_->killAll();
      } else {
        for (pid_t member : cgroup_->members()) {
          if (termed.insert(member).second) ::kill(member, SIGTERM);
        }
      }
    }
    if (!any) break;
    // A stop signal now cuts the grace short (and ends the job as interrupted); SIGCHLD wakes
    // us to look again.
    if (int sig = waitForStopSignal(-1, std::chrono::milliseconds(20)); sig != 0) {
      late_signal_ = sig;
      kill_at_ = std::chrono::steady_clock::now();
      return stopLeftovers();
    }
  }
  for (const Worker& w : workers_) {
    if (w.pid > 0) watchdog_->remove(w.pid);
  }
}

namespace {

// A worker killed while it set up shared-memory collectives may leave the segment's name in
// /dev/shm (the runtime unlinks it once every rank has it mapped); the name carries its pid.
void removeSharedMemoryOf(pid_t pid) {
  const std::string prefix = std::string(env::kShmNamePrefix) + std::to_string(pid) + "-";
  try {
    for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
      if (entry.path().filename().string().starts_with(prefix)) {
        std::error_code ignored;
        std::filesystem::remove(entry.path(), ignored);
      }
    }
  } catch (const std::filesystem::filesystem_error&) {
    // No /dev/shm: nothing can have been left there.
  }
}

}  // namespace

// A worker whose heartbeat (created by the runtime at its start, touched at every micro-step) is
// older than --watchdog_timeout has stopped making progress (SIGSTOP, a deadlock, a hang outside
// collectives): it is the job's failure, named with how long it was silent, and the job stops
// (SIGTERM, then SIGKILL after the grace: a stopped process dies of SIGKILL only). Workers that
// never created the file (no runtime) are not watched.
void Agent::checkProgress(std::vector<Failure>& failures) {
  if (stopping_) return;
  // The rank silent the longest is the culprit: the others stopped beating later, in a
  // collective waiting for it.
  const auto now = std::chrono::system_clock::now();
  Worker* stalled = nullptr;
  std::chrono::milliseconds longest{0};
  for (Worker& w : workers_) {
    struct stat st {};
    if (!w.running || ::stat(w.heartbeat_file.c_str(), &st) != 0) continue;
    const auto beat = std::chrono::system_clock::time_point(
        std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec));
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - beat);
    if (silent >= options_.watchdog_timeout && silent > longest) {
      stalled = &w;
      longest = silent;
    }
  }
  if (stalled == nullptr) return;
  Worker& w = *stalled;
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
  readOutput(w, 1, Read::kLastWords);
  f.stderr_tail = w.sinks[1]->tail();
  failures.push_back(std::move(f));
  say("cxxlaunch: rank " + std::to_string(w.global_rank) + " (pid " + std::to_string(w.pid) + ") " +
      text + "; stopping " + std::to_string(running()) + " workers\n");
  beginStop(SIGTERM);
}

void Agent::reap(std::vector<Failure>& failures) {
  // Collect every exit first: exits seen together count as failures together, before the stop.
  struct Exit {
    Worker* worker;
    int status;
  };
  std::vector<Exit> exits;
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    for (Worker& w : workers_) {
      if (w.running && w.pid == pid) {
        w.running = false;
        exits.push_back({&w, status});
        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) removeSharedMemoryOf(pid);
      }
    }  // anything else is an orphaned grandchild, reaped as subreaper
  }
  if (!exits.empty()) publishWorkers();
  const bool was_stopping = stopping_;
  bool failed = false;
  for (const Exit& e : exits) {
    if (was_stopping) continue;  // stopped by us
    const bool ok = WIFEXITED(e.status) && WEXITSTATUS(e.status) == 0;
    if (ok) continue;
    Worker& w = *e.worker;
    readOutput(w, 1, Read::kLastWords);  // its last words belong in the tail
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
    f.stderr_tail = w.sinks[1]->tail();
    failures.push_back(std::move(f));
    failed = true;
  }
  if (failed) beginStop(SIGTERM);
}

void Agent::onSignal(std::vector<Failure>& failures, AttemptResult& result) {
  signalfd_siginfo info{};
  while (::read(signal_fd_, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
    const int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGCHLD) {
      reap(failures);
    } else if (stopsJob(sig)) {
      noteStopSignal(sig);
      if (result.signal == 0) {
        say("cxxlaunch: received " + signalName(sig) + ", stopping " + std::to_string(running()) +
            " workers\n");
      }
      result.signal = sig;
      beginStop(sig);
    } else {
      signalWorkers(sig);
    }
  }
}

AttemptResult Agent::monitor() {
  AttemptResult result;
  std::vector<Failure> failures;
  std::array<epoll_event, 64> events;
  while (running() > 0) {
    int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), -1);
    if (n == -1) {
      if (errno == EINTR) continue;
      throw SystemError("epoll_wait", errno);
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[static_cast<size_t>(i)].data.u64;
      if (tag == kSignalTag) {
        onSignal(failures, result);
      } else if (tag == kTimerTag) {
        uint64_t expirations = 0;
        ssize_t ignored = ::read(timer_fd_, &expirations, sizeof(expirations));
        (void)ignored;
        signalWorkers(SIGKILL);
      } else if (tag == kTickTag) {
        uint64_t expirations = 0;
        ssize_t ignored = ::read(tick_fd_, &expirations, sizeof(expirations));
        (void)ignored;
        checkProgress(failures);
      } else if (tag == kNewsTag) {
        uint64_t count = 0;
        ssize_t ignored = ::read(news_fd_, &count, sizeof(count));
        (void)ignored;
        if (!stopping_ && result.signal == 0) {
          result.outcome = Outcome::kNews;
          result.news = rendezvous_.news();
          beginStop(SIGTERM);
        }
      } else if (tag == kProgressTag) {
        uint64_t expirations = 0;
        ssize_t ignored = ::read(progress_fd_, &expirations, sizeof(expirations));
        (void)ignored;
        showProgress();
      } else if (tag == kConsoleTag + STDOUT_FILENO || tag == kConsoleTag + STDERR_FILENO) {
        // Writable again: updateConsoles writes what it takes.
      } else {
        readOutput(workers_[tag / 2], static_cast<int>(tag % 2));
      }
    }
    updateConsoles();
  }
  // The workers are gone; what they started is not allowed to outlive them.
  late_signal_ = 0;
  stopLeftovers();
  if (late_signal_ != 0 && result.signal == 0) result.signal = late_signal_;
  itimerspec off{};
  ::timerfd_settime(timer_fd_, 0, &off, nullptr);
  // Whatever a worker wrote before it exited is in the pipe now (at most a pipe's worth each, so
  // the console queues stay bounded).
  for (Worker& w : workers_) {
    for (int s = 0; s < 2; ++s) {
      readOutput(w, s, Read::kAll);
      closeStream(w, s);
    }
  }
  if (progress_display_ != ProgressDisplay::kNone) showProgress();  // the last steps
  // The attempt's last progress stays on the screen, above what follows (a failure table, a
  // restart's lines).
  if (progress_display_ == ProgressDisplay::kLiveLine) Console::of(STDOUT_FILENO).endLiveLine();
  updateConsoles();
  if (result.signal != 0) {
    result.outcome = Outcome::kInterrupted;
  } else if (result.outcome == Outcome::kNews) {
    // Stopped for the rendezvous; exits caused by the stop are not failures.
  } else if (!failures.empty()) {
    result.outcome = Outcome::kFailed;
    result.failures = std::move(failures);
  }
  return result;
}

void Agent::notifyNews() {
  const uint64_t one = 1;
  ssize_t ignored = ::write(news_fd_, &one, sizeof(one));
  (void)ignored;
}

// Waits for a stop signal, for `extra_fd` to become readable, or for `timeout`. Returns the stop
// signal, or 0. Forwarded-only signals (USR1/2) have no workers to reach here and are dropped.
int Agent::waitForStopSignal(int extra_fd, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    pollfd fds[2] = {{signal_fd_, POLLIN, 0}, {extra_fd, POLLIN, 0}};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return 0;
    int n = ::poll(fds, 2, static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
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

// Joins on a helper thread so that a stop signal can cancel a join that waits for other nodes.
std::optional<WorldAssignment> Agent::joinInterruptibly(int& signal) {
  signal = 0;
  if (auto at_once = rendezvous_.joinAtOnce()) return at_once;
  std::optional<WorldAssignment> world;
  std::exception_ptr error;
  std::thread joiner([&] {
    try {
      world = rendezvous_.join();
    } catch (...) {
      error = std::current_exception();
    }
    notifyNews();
  });
  for (;;) {
    signal = waitForStopSignal(news_fd_, std::chrono::hours(24 * 365));
    if (signal == 0) break;
    say("cxxlaunch: received " + signalName(signal) + " while joining\n");
    rendezvous_.cancelJoin();
    break;
  }
  joiner.join();
  uint64_t count = 0;
  ssize_t ignored = ::read(news_fd_, &count, sizeof(count));
  (void)ignored;
  if (signal != 0) return std::nullopt;
  if (error) std::rethrow_exception(error);
  return world;
}

// After this node's workers succeeded, while others still run: keep-alives go on until the run
// closes (kDone) or pulls this node into a restart.
std::optional<Decision> Agent::waitForPeers(int& signal) {
  rendezvous_.watch([this] { notifyNews(); });
  signal = waitForStopSignal(news_fd_, rendezvous_.exitBarrier());
  rendezvous_.unwatch();
  uint64_t count = 0;
  const bool news = ::read(news_fd_, &count, sizeof(count)) == static_cast<ssize_t>(sizeof(count));
  if (signal != 0) return std::nullopt;
  if (!news) {
    return Decision{Decision::Kind::kDone,
                    "other nodes did not finish within the exit barrier; leaving",
                    {},
                    {}};
  }
  return rendezvous_.news();
}

int Agent::finish(RunReport& report, const std::string& status, int exit_code) {
  report.status = status;
  report.exit_code = exit_code;
  report.confinement = confinement_;
  recordStepTimes(report);
  writeRunSummary((log_.path / "run-summary.json").string(), report, log_.file_mode);
  rendezvous_.finish();
  // The job is over; a console that does not take its last lines within the bound only loses
  // them from the screen.
  Console& out = Console::of(STDOUT_FILENO);
  Console& err = Console::of(STDERR_FILENO);
  const size_t unwritten = out.drain(kConsoleDrain) ? 0 : out.pending();
  if (unwritten > 0) {
    say("cxxlaunch: the console did not take the last " + std::to_string(unwritten) +
        " bytes of output within " + std::to_string(kConsoleDrain.count()) +
        " s; every byte is in the logs under " + log_.path.string() + "\n");
  }
  err.drain(kConsoleDrain);
  return exit_code;
}

int Agent::run() {
  makeLogFolder();
  setUpProcess();
  RunReport report;
  report.run_id = run_id_;
  report.program = options_.program;
  report.args = options_.args;
  report.max_restarts = options_.max_restarts;
  report.log_dir = log_.path.string();
  for (int attempt = 0;; ++attempt) {
    int signal = 0;
    const auto world = joinInterruptibly(signal);
    if (!world) return finish(report, "interrupted", 128 + signal);
    report.world_size = world->world_size;
    report.restarts = world->restart_count;
    spawnWorkers(attempt, *world);
    rendezvous_.watch([this] { notifyNews(); });
    AttemptResult result = monitor();
    rendezvous_.unwatch();

    Decision decision;
    switch (result.outcome) {
      case Outcome::kInterrupted:
        return finish(report, "interrupted", 128 + result.signal);
      case Outcome::kNews:
        decision = result.news;
        break;
      case Outcome::kFailed: {
        const Failure& root = rootCause(result.failures);
        decision = rendezvous_.workersFailed(
            root.global_rank, root.processExitCode(),
            "rank " + std::to_string(root.global_rank) + " " + root.statusText());
        if (decision.kind == Decision::Kind::kRestart) {
          decision.reason = "rank " + std::to_string(root.global_rank) + " failed (" +
                            root.statusText() + "); restarting all workers (restart " +
                            std::to_string(world->restart_count + 1) + " of " +
                            std::to_string(options_.max_restarts) + ")";
        }
        break;
      }
      case Outcome::kSucceeded:
        decision = rendezvous_.workersSucceeded();
        if (decision.kind == Decision::Kind::kWait) {
          auto after = waitForPeers(signal);
          if (!after) return finish(report, "interrupted", 128 + signal);
          decision = *after;
        }
        break;
    }

    switch (decision.kind) {
      case Decision::Kind::kRestart:
        say("cxxlaunch: " + decision.reason + "\n");
        continue;
      case Decision::Kind::kDone:
      case Decision::Kind::kWait:
        if (!decision.reason.empty() && result.outcome == Outcome::kSucceeded &&
            decision.reason != "every node finished") {
          say("cxxlaunch: " + decision.reason + "\n");
        }
        return finish(report, "succeeded", kExitOk);
      case Decision::Kind::kFail: {
        report.failures = std::move(result.failures);
        int exit_code = decision.remote_exit_code.value_or(
            report.failures.empty() ? kExitInternal : rootCause(report.failures).processExitCode());
        if (exit_code == 0) exit_code = kExitInternal;
        if (!report.failures.empty()) say(formatFailureTable(report));
        if (!decision.remote_description.empty()) {
          say("cxxlaunch: the job failed: " + decision.remote_description + "\n");
        } else if (report.failures.empty()) {
          say("cxxlaunch: the job failed: " + decision.reason + "\n");
        }
        return finish(report, "failed", exit_code);
      }
    }
  }
}

}  // namespace

void blockAgentSignals() {
  const sigset_t mask = agentSignals();
  CXXLAUNCH_SYSCALL(::pthread_sigmask(SIG_BLOCK, &mask, nullptr));
}

int runAgent(const LaunchOptions& options, NodeRendezvous& rendezvous) {
  Agent agent(options, rendezvous);
  return agent.run();
}

}  // namespace cxxlaunch::launcher
