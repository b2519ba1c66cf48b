#include "launcher/worker_group.h"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <set>

#include "common/env_names.h"
#include "common/error.h"
#include "launcher/cgroup.h"
#include "launcher/output.h"

namespace cxxlaunch::launcher {
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

// Whether we have a child (alive or unreaped) that waitid sees: every one but the watchdog, a
// clone child (process.cc; forked under the sanitizers, where this is always true). Cheaper than
// reading /proc, and nearly always the answer at a job's end: none.
bool hasChildren() {
  siginfo_t info{};
  return ::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) == 0;
}

}  // namespace

WorkerGroup::WorkerGroup(std::string name) {
  CXXLAUNCH_SYSCALL(::prctl(PR_SET_CHILD_SUBREAPER, 1));
  cgroup_ = JobCgroup::create(name);
  confinement_ = cgroup_ ? "cgroup " + cgroup_->path() : "process groups";
  watchdog_ = std::make_unique<GroupWatchdog>(cgroup_ ? cgroup_->path() : "");
}

WorkerGroup::~WorkerGroup() = default;

void WorkerGroup::beginAttempt(int attempt) {
  workers_.clear();
  if (cgroup_) cgroup_->startAttempt(attempt);
}

std::array<int, 2> WorkerGroup::spawn(Worker worker, SpawnSpec spec) {
  if (cgroup_ && !cgroup_refused_) {
    spec.cgroup_dir_fd = cgroup_->dirFd();
    spec.cgroup_procs_fd = cgroup_->procsFd();
  }
  SpawnedProcess process = spawnProcess(spec);
  worker.pid = process.pid;
  worker.running = true;
  if (process.cgroup_error != 0) {
    cgroup_refused_ = true;
    confinement_ = "process groups (cgroup " + cgroup_->path() +
                   " refused a worker: " + std::strerror(process.cgroup_error) + ")";
    Console::of(STDERR_FILENO).write("cxxlaunch: confining by " + confinement_ + "\n");
  }
  watchdog_->add(worker.pid);  // its process group, in case we are SIGKILLed
  workers_.push_back(std::move(worker));
  return {process.stdout_fd, process.stderr_fd};
}

size_t WorkerGroup::running() const {
  return static_cast<size_t>(
      std::count_if(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; }));
}

void WorkerGroup::signal(int sig) const {
  for (const Worker& w : workers_) {
    if (w.running) ::kill(-w.pid, sig);
  }
}

std::vector<WorkerExit> WorkerGroup::reap() {
  std::vector<WorkerExit> exits;
  for (;;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    for (size_t i = 0; i < workers_.size(); ++i) {
      Worker& w = workers_[i];
      if (w.running && w.pid == pid) {
        w.running = false;
        exits.push_back({i, status});
        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) removeSharedMemoryOf(pid);
      }
    }
  }
  return exits;
}

int WorkerGroup::stopLeftovers(std::chrono::steady_clock::time_point deadline,
                               const std::function<int(std::chrono::milliseconds)>& wait) {
  int stop_signal = 0;
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
    for (pid_t child : hasChildren() ? childrenOf(::getpid()) : std::vector<pid_t>()) {
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
    // A stop signal now cuts the grace short; SIGCHLD wakes us to look again.
    if (const int sig = wait(std::chrono::milliseconds(20)); sig != 0) {
      stop_signal = sig;
      deadline = std::chrono::steady_clock::now();
    }
  }
  for (const Worker& w : workers_) {
    if (w.pid > 0) watchdog_->remove(w.pid);
  }
  return stop_signal;
}

}  // namespace cxxlaunch::launcher
