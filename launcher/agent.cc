#include "launcher/agent.h"

#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <random>

#include "launcher/failure.h"
#include "launcher/output.h"
#include "launcher/process.h"
#include "rendezvous/error.h"
#include "runtime/env_names.h"

namespace cxxlaunch::launcher {
namespace fs = std::filesystem;
namespace {

// Signals the agent passes on to every worker's process group (torchrun's set plus SLURM's
// preemption signals). The first four also stop the job.
constexpr std::array<int, 6> kForwarded = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
constexpr size_t kStderrTailLines = 10;

bool stopsJob(int sig) { return sig != SIGUSR1 && sig != SIGUSR2; }

std::string hostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

std::string randomRunId() {
  std::random_device device;
  std::uniform_int_distribution<int> hex(0, 15);
  std::string id;
  for (int i = 0; i < 12; ++i) id.push_back("0123456789abcdef"[hex(device)]);
  return id;
}

int reserveFreePort() {
  int fd = CXXLAUNCH_SYSCALL(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int err = errno;
    ::close(fd);
    throw SystemError("reserve a free port", err);
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

class SingleNodeRendezvous final : public NodeRendezvous {
 public:
  explicit SingleNodeRendezvous(const LaunchOptions& options) {
    world_.world_size = options.nproc_per_node;
    world_.master_addr = options.master_addr;
    world_.master_port = options.master_port != 0 ? options.master_port : reserveFreePort();
  }
  WorldAssignment join(int) override { return world_; }

 private:
  WorldAssignment world_;
};

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
  std::array<int, 2> fds{-1, -1};  // stdout, stderr read ends
  std::array<std::unique_ptr<StreamSink>, 2> sinks;
};

enum class Outcome { kSucceeded, kFailed, kInterrupted };

struct AttemptResult {
  Outcome outcome = Outcome::kSucceeded;
  std::vector<Failure> failures;
  int signal = 0;  // for kInterrupted
};

class Agent {
 public:
  Agent(const LaunchOptions& options, NodeRendezvous& rendezvous)
      : options_(options), rendezvous_(rendezvous), host_(hostName()) {
    run_id_ = options.run_id.empty() ? randomRunId() : options.run_id;
    const char* tmp = std::getenv("TMPDIR");  // NOLINT(concurrency-mt-unsafe)
    fs::path root = options.log_dir.empty()
                        ? fs::path(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") / "cxxlaunch"
                        : fs::path(options.log_dir);
    run_dir_ = root / run_id_;
  }

  ~Agent() {
    if (epoll_fd_ != -1) ::close(epoll_fd_);
    if (signal_fd_ != -1) ::close(signal_fd_);
    if (timer_fd_ != -1) ::close(timer_fd_);
  }

  int run();

 private:
  void setUpProcess();
  void spawnWorkers(int attempt, const WorldAssignment& world);
  AttemptResult monitor();
  void onSignal(std::vector<Failure>& failures, AttemptResult& result);
  void reap(std::vector<Failure>& failures);
  void readOutput(Worker& worker, int stream);
  void closeStream(Worker& worker, int stream);
  void signalWorkers(int sig);
  void beginStop(int sig);
  size_t running() const;
  std::vector<std::string> workerEnvironment(const Worker& worker, int attempt,
                                             const WorldAssignment& world) const;

  const LaunchOptions& options_;
  NodeRendezvous& rendezvous_;
  std::string host_;
  std::string run_id_;
  fs::path run_dir_;
  std::vector<std::string> base_env_;
  std::vector<Worker> workers_;
  int epoll_fd_ = -1;
  int signal_fd_ = -1;
  int timer_fd_ = -1;
  bool stopping_ = false;
};

// Event-loop tags: pipes are tagged with worker index * 2 + stream.
constexpr uint64_t kSignalTag = ~uint64_t{0};
constexpr uint64_t kTimerTag = ~uint64_t{0} - 1;

void Agent::setUpProcess() {
  // Reparent orphaned grandchildren to us so every exit is seen and reaped.
  CXXLAUNCH_SYSCALL(::prctl(PR_SET_CHILD_SUBREAPER, 1));
  ::signal(SIGPIPE, SIG_IGN);  // a closed console must not kill the agent
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  for (int sig : kForwarded) sigaddset(&mask, sig);
  CXXLAUNCH_SYSCALL(::sigprocmask(SIG_BLOCK, &mask, nullptr));
  signal_fd_ = CXXLAUNCH_SYSCALL(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  timer_fd_ = CXXLAUNCH_SYSCALL(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  epoll_fd_ = CXXLAUNCH_SYSCALL(::epoll_create1(EPOLL_CLOEXEC));
  for (auto [fd, tag] : {std::pair{signal_fd_, kSignalTag}, std::pair{timer_fd_, kTimerTag}}) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = tag;
    CXXLAUNCH_SYSCALL(::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event));
  }
  // The contract's variables are ours to set; everything else the workers inherit.
  const std::vector<std::string> ours = {
      env::kRank,         env::kLocalRank,     env::kWorldSize,     env::kLocalWorldSize,
      env::kGroupRank,    env::kGroupWorldSize, env::kRoleName,     env::kRoleRank,
      env::kRoleWorldSize, env::kMasterAddr,   env::kMasterPort,    env::kRestartCount,
      env::kMaxRestarts,  env::kRunId,         env::kErrorFile,     env::kStoreEndpoint,
      env::kStorePrefix,  env::kToken,         env::kDevice};
  for (auto& entry : currentEnvironment()) {
    const std::string name = entry.substr(0, entry.find('='));
    if (std::find(ours.begin(), ours.end(), name) == ours.end()) base_env_.push_back(entry);
  }
  const bool omp_set = std::any_of(base_env_.begin(), base_env_.end(), [](const auto& e) {
    return e.starts_with(std::string(env::kOmpNumThreads) + "=");
  });
  if (!omp_set && options_.nproc_per_node > 1) {
    base_env_.push_back(std::string(env::kOmpNumThreads) + "=1");
  }
}

std::vector<std::string> Agent::workerEnvironment(const Worker& worker, int attempt,
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
  put(env::kRestartCount, std::to_string(attempt));
  put(env::kMaxRestarts, std::to_string(options_.max_restarts));
  put(env::kRunId, run_id_);
  put(env::kErrorFile, worker.error_file);
  if (!world.store_endpoint.empty()) {
    put(env::kStoreEndpoint, world.store_endpoint);
    put(env::kStorePrefix, world.store_prefix);
    put(env::kToken, world.token);
  }
  if (!options_.gpus.empty()) {
    put(env::kDevice, std::to_string(options_.gpus[static_cast<size_t>(worker.local_rank)]));
  }
  return envv;
}

void Agent::spawnWorkers(int attempt, const WorldAssignment& world) {
  const fs::path attempt_dir = run_dir_ / ("attempt_" + std::to_string(attempt));
  fs::remove_all(attempt_dir);
  workers_.clear();
  workers_.resize(static_cast<size_t>(options_.nproc_per_node));
  stopping_ = false;
  for (size_t i = 0; i < workers_.size(); ++i) {
    Worker& w = workers_[i];
    w.local_rank = static_cast<int>(i);
    w.global_rank = world.rank_offset + w.local_rank;
    const fs::path dir = attempt_dir / std::to_string(w.local_rank);
    fs::create_directories(dir);
    w.error_file = (dir / "error.json").string();
    const std::string prefix = world.num_nodes > 1 ? "[rank " + std::to_string(world.node_rank) +
                                                         ":" + std::to_string(w.global_rank) + "]: "
                                                   : "[rank " + std::to_string(w.global_rank) + "]: ";
    const std::array<const char*, 2> names = {"stdout.log", "stderr.log"};
    for (int s = 0; s < 2; ++s) {
      const int stream = s == 0 ? StreamSpec::kOut : StreamSpec::kErr;
      const int console = options_.onConsole(w.local_rank, stream) ? (s == 0 ? 1 : 2) : -1;
      w.sinks[static_cast<size_t>(s)] = std::make_unique<StreamSink>(
          (dir / names[static_cast<size_t>(s)]).string(), console, prefix,
          s == 1 ? kStderrTailLines : 0);
    }
    SpawnSpec spec;
    spec.program = options_.program;
    spec.argv.push_back(options_.program);
    for (const auto& arg : options_.args) spec.argv.push_back(substituteLocalRank(arg, w.local_rank));
    spec.env = workerEnvironment(w, attempt, world);
    SpawnedProcess process = spawnProcess(spec);
    w.pid = process.pid;
    w.running = true;
    w.fds = {process.stdout_fd, process.stderr_fd};
    for (int s = 0; s < 2; ++s) {
      epoll_event event{};
      event.events = EPOLLIN;
      event.data.u64 = i * 2 + static_cast<uint64_t>(s);
      CXXLAUNCH_SYSCALL(::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, w.fds[static_cast<size_t>(s)], &event));
    }
  }
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

void Agent::readOutput(Worker& worker, int stream) {
  char buffer[65536];
  int& fd = worker.fds[static_cast<size_t>(stream)];
  while (fd != -1) {
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
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  ::close(fd);
  fd = -1;
  worker.sinks[static_cast<size_t>(stream)]->finish();
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
      }
    }  // anything else is an orphaned grandchild, reaped as subreaper
  }
  const bool was_stopping = stopping_;
  bool failed = false;
  for (const Exit& e : exits) {
    if (was_stopping) continue;  // stopped by us
    const bool ok = WIFEXITED(e.status) && WEXITSTATUS(e.status) == 0;
    if (ok) continue;
    Worker& w = *e.worker;
    readOutput(w, 1);  // its last words belong in the tail
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
      if (result.signal == 0) {
        std::cerr << "cxxlaunch: received " << signalName(sig) << ", stopping "
                  << running() << " workers\n";
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
      } else {
        readOutput(workers_[tag / 2], static_cast<int>(tag % 2));
      }
    }
  }
  itimerspec off{};
  ::timerfd_settime(timer_fd_, 0, &off, nullptr);
  // Whatever a worker wrote before it exited is in the pipe now; a grandchild that still holds
  // the pipe open must not keep the agent waiting.
  for (Worker& w : workers_) {
    for (int s = 0; s < 2; ++s) {
      readOutput(w, s);
      closeStream(w, s);
    }
  }
  if (result.signal != 0) {
    result.outcome = Outcome::kInterrupted;
  } else if (!failures.empty()) {
    result.outcome = Outcome::kFailed;
    result.failures = std::move(failures);
  }
  return result;
}

int Agent::run() {
  setUpProcess();
  RunReport report;
  report.run_id = run_id_;
  report.program = options_.program;
  report.args = options_.args;
  report.max_restarts = options_.max_restarts;
  report.log_dir = run_dir_.string();
  for (int attempt = 0;; ++attempt) {
    const WorldAssignment world = rendezvous_.join(attempt);
    report.world_size = world.world_size;
    report.restarts = attempt;
    spawnWorkers(attempt, world);
    AttemptResult result = monitor();
    if (result.outcome == Outcome::kFailed && attempt < options_.max_restarts) {
      const Failure& root = rootCause(result.failures);
      std::cerr << "cxxlaunch: rank " << root.global_rank << " failed (" << root.statusText()
                << "); restarting all workers (restart " << attempt + 1 << " of "
                << options_.max_restarts << ")\n";
      continue;
    }
    switch (result.outcome) {
      case Outcome::kSucceeded:
        report.status = "succeeded";
        report.exit_code = kExitOk;
        break;
      case Outcome::kInterrupted:
        report.status = "interrupted";
        report.exit_code = 128 + result.signal;
        break;
      case Outcome::kFailed:
        report.status = "failed";
        report.failures = std::move(result.failures);
        report.exit_code = rootCause(report.failures).processExitCode();
        std::cerr << formatFailureTable(report);
        break;
    }
    writeRunSummary((run_dir_ / "run-summary.json").string(), report);
    return report.exit_code;
  }
}

}  // namespace

std::unique_ptr<NodeRendezvous> makeSingleNodeRendezvous(const LaunchOptions& options) {
  return std::make_unique<SingleNodeRendezvous>(options);
}

int runAgent(const LaunchOptions& options, NodeRendezvous& rendezvous) {
  Agent agent(options, rendezvous);
  return agent.run();
}

}  // namespace cxxlaunch::launcher
