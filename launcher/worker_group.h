#pragma once
// WorkerGroup: this node's workers as processes, torch.distributed.elastic's process context: it
// starts an attempt's workers, forwards signals to them, reaps their exits and sees to it that
// nothing they started outlives them.
//  - Each worker leads a process group of its own and dies with the agent (PR_SET_PDEATHSIG):
//    spawnProcess, process.h.
//  - The agent is a child subreaper: every process orphaned below the workers, however it
//    detached, is re-parented to it, so its exit is reaped and stopLeftovers finds it.
//  - Where the machine gives one, the job has a cgroup (cgroup.h) and each attempt a fresh one
//    below it that its workers start in: killed at once, it takes everything they started.
//  - A watchdog process (GroupWatchdog, process.h) kills the workers' groups and the cgroup when
//    the agent dies, even of SIGKILL.
//
// Not thread-safe: used from the agent's thread (PR_SET_PDEATHSIG follows the thread that
// spawns).

#include <sys/types.h>

#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "launcher/process.h"

namespace cxxlaunch::launcher {

class JobCgroup;

struct Worker {
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = -1;
  bool running = false;        // false once reaped: the pid may belong to someone else now
  std::string error_file;      // TORCHELASTIC_ERROR_FILE
  std::string heartbeat_file;  // touched by the runtime: status, --watchdog_timeout
};

struct WorkerExit {
  size_t index = 0;  // in workers()
  int status = 0;    // as waitpid reports it
};

class WorkerGroup {
 public:
  // `name` names the job's cgroup (unique on the machine). Makes the agent a child subreaper.
  // Throws SystemError.
  explicit WorkerGroup(std::string name);
  // Removes the job's cgroup and ends the watchdog (after stopLeftovers: nothing is left).
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Forgets the last attempt's workers (all reaped by now) and readies `attempt`'s cgroup.
  void beginAttempt(int attempt);
  // Starts `worker` (its ranks and files set) as `spec` says, in the attempt's cgroup. Returns
  // the read ends of its stdout and stderr. Throws SystemError when it cannot be started.
  std::array<int, 2> spawn(Worker worker, SpawnSpec spec);

  const std::vector<Worker>& workers() const { return workers_; }
  size_t running() const;
  // `sig` to each running worker's process group: only groups whose leader is unreaped, whose
  // pid cannot have been reused.
  void signal(int sig) const;
  // Reaps every exit there is; returns the workers' (anything else was an orphan below them).
  // A worker that failed may leave its shared-memory segment's name in /dev/shm: removed.
  std::vector<WorkerExit> reap();

  // Once every worker has exited, whatever they started must not outlive them:
  //  1. SIGTERM to each worker's process group, to every child of ours but the watchdog (as
  //     child subreaper we inherit every orphan below the workers), and to every process in the
  //     job's cgroup;
  //  2. wait for them to exit, reaping as they go (each exit may hand us its own children, who
  //     get the same), until `deadline`;
  //  3. SIGKILL whatever is left (the cgroup at once: cgroup.kill), until nothing is;
  //  4. tell the watchdog the groups are empty.
  // `wait(timeout)` waits for a child's exit or a stop signal and returns the stop signal or 0;
  // a stop signal cuts the grace short and is returned, else 0.
  int stopLeftovers(std::chrono::steady_clock::time_point deadline,
                    const std::function<int(std::chrono::milliseconds)>& wait);

  // How the job is confined, for run-summary.json: "cgroup PATH", "process groups", or why a
  // cgroup that was made was not used.
  const std::string& confinement() const { return confinement_; }

 private:
  std::unique_ptr<JobCgroup> cgroup_;  // null: confined by process groups alone
  bool cgroup_refused_ = false;        // a worker could not enter it; the rest do not try
  std::string confinement_;
  std::unique_ptr<GroupWatchdog> watchdog_;
  std::vector<Worker> workers_;
};

}  // namespace cxxlaunch::launcher
