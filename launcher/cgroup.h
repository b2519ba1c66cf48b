#pragma once
// JobCgroup: one cgroup v2 per job, where the machine lets the launcher make one (a writable
// cgroup2 hierarchy: root, or a user's systemd delegation). Each worker enters it before it
// execs (spawnProcess writes to its cgroup.procs), so everything a worker starts is in it, in
// whatever process group or session it moves to; killing the cgroup (cgroup.kill, or freeze,
// SIGKILL to each member, thaw on kernels before 5.14) kills them all at once, and the launcher's
// watchdog does so when the launcher dies, even of SIGKILL (GroupWatchdog, process.h).
//
// Where there is none to make, create() returns null and confinement is process groups, a child
// subreaper and the watchdog alone (docs/reliability.md, "How processes are confined").
//
// Thread-safety: JobCgroup is used from the agent's thread. killCgroup and removeCgroup are
// async-signal-safe and allocate nothing, for the watchdog (a fork of a threaded process).

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

namespace cxxlaunch::launcher {

class JobCgroup {
 public:
  // Makes the cgroup `name` below the launcher's own in the cgroup v2 hierarchy. Null, saying
  // nothing, where that cannot be done: no cgroup2 mount, a hierarchy this user may not write, or
  // CXXLAUNCH_CGROUP=off in the environment.
  static std::unique_ptr<JobCgroup> create(const std::string& name);
  // Kills whatever is still in it and removes it (waiting a few seconds at most).
  ~JobCgroup();
  JobCgroup(const JobCgroup&) = delete;
  JobCgroup& operator=(const JobCgroup&) = delete;

  // Its folder, e.g. /sys/fs/cgroup/user.slice/.../cxxlaunch-job-42-1234.
  const std::string& path() const { return path_; }
  // Makes the cgroup the workers of attempt `attempt` start in, "attempt-N" below the job's, and
  // removes the previous attempt's (empty by now). Each attempt gets a fresh one because a
  // cgroup once killed is unusable for clone3 on some kernels: Linux 6.18 SIGKILLs every child
  // later started in it with CLONE_INTO_CGROUP (its kill sequence is compared with the parent's
  // cgroup's). Where it cannot be made, workers start in the job's cgroup itself.
  void startAttempt(int attempt);
  // Where workers start: the attempt's folder, open (clone3's CLONE_INTO_CGROUP), and its
  // cgroup.procs, open for writing: a child writes "0" to it to enter.
  int dirFd() const { return attempt_dir_fd_ != -1 ? attempt_dir_fd_ : dir_fd_; }
  int procsFd() const { return attempt_procs_fd_ != -1 ? attempt_procs_fd_ : procs_fd_; }
  // Whether any process is in it or in a cgroup below it.
  bool populated() const;
  // The processes directly in it and in the attempt's cgroup.
  std::vector<pid_t> members() const;
  // SIGKILL to everything in it and below, at once.
  void killAll() const;

 private:
  JobCgroup(std::string path, int dir_fd, int procs_fd)
      : path_(std::move(path)), dir_fd_(dir_fd), procs_fd_(procs_fd) {}
  void closeAttempt();
  std::string path_;
  int dir_fd_ = -1;
  int procs_fd_ = -1;
  std::string attempt_path_;  // empty until startAttempt
  int attempt_dir_fd_ = -1;
  int attempt_procs_fd_ = -1;
};

// SIGKILL to every process in the cgroup at `dir` and in the cgroups below it: cgroup.kill, or
// on kernels without it freeze, kill each member until none is left, thaw.
void killCgroup(const char* dir);

// The job cgroups below `parent` ("cxxlaunch-*") whose launcher and watchdog both died (killed
// together, so nobody removed it): no launcher holds its lock (flock on its folder). What is
// still in one outlived its job and is killed, and the cgroup removed, or left for the next
// launcher while its processes are dying; nothing waits. Only those at least
// `min_age_seconds` old: a younger one may not be locked yet. create() calls it.
void collectStaleCgroups(const std::string& parent, int min_age_seconds);

// killCgroup's way on kernels without cgroup.kill (before 5.14), for tests on newer ones.
void killCgroupByFreezing(const char* dir);

// Kills (killCgroup) and removes the cgroup at `dir` and the cgroups below it (a launcher
// started by a worker makes its own there), trying for at most `patience_ms` while processes are
// still dying. Returns whether it is gone.
bool removeCgroup(const char* dir, int patience_ms);

}  // namespace cxxlaunch::launcher
