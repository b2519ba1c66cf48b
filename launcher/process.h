#pragma once
// Spawning one worker process the way the node agent needs it:
//  - its own process group (so a stop signal reaches everything it started),
//  - PR_SET_PDEATHSIG=SIGKILL (so a killed agent leaves no orphan), re-checked after setting it,
//  - stdin from /dev/null, stdout and stderr into pipes the agent reads,
//  - default signal dispositions and an empty signal mask (the agent blocks signals for signalfd).
//  - in the job's cgroup, when there is one (cgroup.h): it starts there (clone3's
//    CLONE_INTO_CGROUP) or, where that cannot be had, enters before it execs.
// Everything the child needs is prepared before it exists, so spawning is safe with threads
// running; the child borrows the agent's memory until it execs (clone with CLONE_VFORK).

#include <sys/types.h>

#include <string>
#include <vector>

namespace cxxlaunch::launcher {

struct SpawnSpec {
  std::string program;            // path to execute
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // complete environment, "NAME=value"
  int cgroup_dir_fd = -1;         // the cgroup to start in (its folder, open); -1: none
  int cgroup_procs_fd = -1;  // its cgroup.procs, to enter by where clone3 cannot start it there
};

struct SpawnedProcess {
  pid_t pid = -1;
  int stdout_fd = -1;  // read ends, non-blocking, close-on-exec
  int stderr_fd = -1;
  int cgroup_error = 0;  // errno when it could not enter the cgroup (it runs outside it)
};

// Throws SystemError when fork or exec fails (exec errors are reported back through a pipe).
SpawnedProcess spawnProcess(const SpawnSpec& spec);

// The live children of `parent` (read from /proc). With the agent a child subreaper, its
// children are its workers and every orphaned process below them, however they detached.
std::vector<pid_t> childrenOf(pid_t parent);

// What /proc says `pid` is doing, as a word: "running", "sleeping", "disk-wait", "stopped"
// (SIGSTOP), "traced", "zombie", "idle", or "gone" when there is no such process.
std::string processState(pid_t pid);

// A helper process that outlives a SIGKILLed agent for one purpose: when the agent is gone (its
// end of a pipe closes) it sends SIGKILL to every process group the agent registered, so that
// grandchildren of the workers do not live on under PID 1, and kills and removes the job's
// cgroup when there is one. (The workers themselves die of PR_SET_PDEATHSIG; without a cgroup,
// a process that left its worker's group with setsid escapes the watchdog, see
// docs/reliability.md.) The agent unregisters a group once it is empty, so the watchdog never
// signals a reused id. It ignores terminal signals, lives in its own process group, and stays
// out of the job's cgroup.
//
// It runs in the agent's memory (clone with CLONE_VM, not CLONE_THREAD: a process of its own,
// on a stack of its own), so that starting it copies no page tables and costs the agent no
// copy-on-write faults afterwards (process.cc says what it may and may not do there). Under the
// sanitizers it is forked.
class GroupWatchdog {
 public:
  // Starts the helper; it does only async-signal-safe work, so a threaded agent may start it.
  // `cgroup_dir`: the job's cgroup (JobCgroup::path), or "" (watchCgroup may say it later).
  // Throws SystemError.
  explicit GroupWatchdog(const std::string& cgroup_dir = "");
  // Closes the pipe: the helper kills what is still registered (and the cgroup), removes the
  // cgroup and exits; waits for that. (Waiting is what lets the helper share the errno of the
  // thread that started it, process.cc.)
  ~GroupWatchdog();
  GroupWatchdog(const GroupWatchdog&) = delete;
  GroupWatchdog& operator=(const GroupWatchdog&) = delete;

  void add(pid_t group);
  void remove(pid_t group);
  // From now on the helper also kills and removes the cgroup at `dir` when the agent is gone.
  // Throws InvalidArgument for a path too long to pass in one message.
  void watchCgroup(const std::string& dir);
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;            // write end
  void* state_ = nullptr;  // the helper's stack and lists (process.cc), unmapped once it is reaped
};

// "SIGSEGV" for 11; "SIG42" for a signal without a name.
std::string signalName(int signal);

// `digits` random hexadecimal digits, for run and node ids.
std::string randomHex(int digits);

// The current environment as "NAME=value" strings.
std::vector<std::string> currentEnvironment();

}  // namespace cxxlaunch::launcher
