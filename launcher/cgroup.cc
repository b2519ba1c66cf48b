#include "launcher/cgroup.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/limits.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <optional>
#include <sstream>

namespace cxxlaunch::launcher {
namespace {

// ---- async-signal-safe helpers: fixed buffers, system calls and string functions only --------

// `dir` + "/" + `name` into `out`; false when it does not fit.
bool joinPath(char* out, size_t capacity, const char* dir, const char* name) {
  const size_t a = std::strlen(dir);
  const size_t b = std::strlen(name);
  if (a + 1 + b + 1 > capacity) return false;
  std::memcpy(out, dir, a);
  out[a] = '/';
  std::memcpy(out + a + 1, name, b + 1);
  return true;
}

bool writeFileIn(const char* dir, const char* name, const char* text) {
  char path[PATH_MAX];
  if (!joinPath(path, sizeof(path), dir, name)) return false;
  const int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd == -1) return false;
  const size_t n = std::strlen(text);
  const bool ok = ::write(fd, text, n) == static_cast<ssize_t>(n);
  ::close(fd);
  return ok;
}

// "populated 1" in cgroup.events: a process is in the cgroup or below it. A cgroup that cannot
// be read (gone) counts as empty.
bool populatedAt(const char* dir) {
  char path[PATH_MAX];
  if (!joinPath(path, sizeof(path), dir, "cgroup.events")) return false;
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd == -1) return false;
  char text[512];
  const ssize_t n = ::read(fd, text, sizeof(text) - 1);
  ::close(fd);
  if (n <= 0) return false;
  text[n] = '\0';
  const char* at = std::strstr(text, "populated ");
  return at != nullptr && at[10] == '1';
}

// Sends `sig` to each process listed in dir/cgroup.procs; returns how many it listed.
int signalMembers(const char* dir, int sig) {
  char path[PATH_MAX];
  if (!joinPath(path, sizeof(path), dir, "cgroup.procs")) return 0;
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd == -1) return 0;
  char buffer[4096];
  int count = 0;
  long pid = 0;
  bool in_number = false;
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n == -1 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) {  // numbers may straddle two reads
      const char c = buffer[i];
      if (c >= '0' && c <= '9') {
        pid = pid * 10 + (c - '0');
        in_number = true;
      } else if (in_number) {
        if (pid > 0) ::kill(static_cast<pid_t>(pid), sig);
        ++count;
        pid = 0;
        in_number = false;
      }
    }
  }
  if (in_number && pid > 0) {
    ::kill(static_cast<pid_t>(pid), sig);
    ++count;
  }
  ::close(fd);
  return count;
}

// Calls `visit(child_dir)` for each cgroup directly below `dir` (its sub-folders).
template <typename Visit>
void forEachChild(const char* dir, Visit&& visit) {
  const int fd = ::open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd == -1) return;
  struct Dirent64 {
    uint64_t ino;
    int64_t off;
    unsigned short reclen;
    unsigned char type;
    char name[1];
  };
  alignas(8) char buffer[2048];
  for (;;) {
    const long n = ::syscall(SYS_getdents64, fd, buffer, sizeof(buffer));
    if (n <= 0) break;
    for (long at = 0; at < n;) {
      const auto* entry = reinterpret_cast<const Dirent64*>(buffer + at);
      at += entry->reclen;
      if (entry->type != DT_DIR || std::strcmp(entry->name, ".") == 0 ||
          std::strcmp(entry->name, "..") == 0) {
        continue;
      }
      char child[PATH_MAX];
      if (joinPath(child, sizeof(child), dir, entry->name)) visit(child);
    }
  }
  ::close(fd);
}

// The fallback without cgroup.kill: frozen, nothing in the cgroup can fork, so killing each
// member until none is listed gets them all (a frozen process still dies of SIGKILL).
constexpr int kMaxDepth = 16;  // cgroups below a job's: launchers started by its workers

int killMembersBelow(const char* dir, int depth) {
  int listed = signalMembers(dir, SIGKILL);
  if (depth < kMaxDepth) {
    forEachChild(dir, [&](const char* child) { listed += killMembersBelow(child, depth + 1); });
  }
  return listed;
}

void pause(int ms) {
  timespec t{ms / 1000, static_cast<long>(ms % 1000) * 1'000'000L};
  while (::nanosleep(&t, &t) == -1 && errno == EINTR) {
  }
}

int64_t nowMs() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000 + t.tv_nsec / 1'000'000;
}

void removeChildren(const char* dir, int depth) {
  if (depth >= kMaxDepth) return;
  forEachChild(dir, [&](const char* child) {
    removeChildren(child, depth + 1);
    ::rmdir(child);
  });
}

// ---- finding our place in the hierarchy ---------------------------------------------------

// The mount point and root of the cgroup2 hierarchy in /proc/self/mountinfo:
// "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS".
std::optional<std::pair<std::string, std::string>> cgroup2Mount() {
  std::ifstream in("/proc/self/mountinfo");
  for (std::string line; std::getline(in, line);) {
    const auto dash = line.find(" - ");
    if (dash == std::string::npos || line.compare(dash + 3, 8, "cgroup2 ") != 0) continue;
    std::istringstream fields(line.substr(0, dash));
    std::string id, parent, device, root, mount_point;
    if (!(fields >> id >> parent >> device >> root >> mount_point)) continue;
    if (mount_point.find('\\') != std::string::npos) continue;  // an escaped name: not ours
    return std::pair{mount_point, root};
  }
  return std::nullopt;
}

// A cgroup younger than this may be one its launcher has made but not locked yet.
constexpr int kStaleAfterSeconds = 10;

}  // namespace

void collectStaleCgroups(const std::string& parent, int min_age_seconds) {
  const std::time_t now = std::time(nullptr);
  forEachChild(parent.c_str(), [&](const char* dir) {
    const char* name = std::strrchr(dir, '/') + 1;
    if (std::strncmp(name, "cxxlaunch-", 10) != 0) return;
    const int fd = ::open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd == -1) return;
    struct stat st {};
    if (::fstat(fd, &st) == 0 && now - st.st_ctime >= min_age_seconds &&
        ::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      removeCgroup(dir, 0);
    }
    ::close(fd);
  });
}

namespace {

// Our cgroup in the v2 hierarchy: the "0::PATH" line of /proc/self/cgroup.
std::optional<std::string> ownCgroup() {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("0::/")) return line.substr(3);
  }
  return std::nullopt;
}

}  // namespace

void killCgroup(const char* dir) {
  if (writeFileIn(dir, "cgroup.kill", "1")) return;  // Linux 5.14: the kernel does it all
  killCgroupByFreezing(dir);
}

void killCgroupByFreezing(const char* dir) {
  const bool frozen = writeFileIn(dir, "cgroup.freeze", "1");
  for (int round = 0; round < 1000 && killMembersBelow(dir, 0) > 0; ++round) {
    pause(1);
  }
  if (frozen) writeFileIn(dir, "cgroup.freeze", "0");
}

bool removeCgroup(const char* dir, int patience_ms) {
  const int64_t deadline = nowMs() + patience_ms;
  int wait_ms = 1;
  for (;;) {
    if (populatedAt(dir)) killCgroup(dir);
    removeChildren(dir, 0);
    if (::rmdir(dir) == 0 || errno == ENOENT) return true;
    if (nowMs() >= deadline) return false;
    pause(wait_ms);  // killed processes take a moment to leave it
    wait_ms = wait_ms < 50 ? wait_ms * 2 : 50;
  }
}

std::unique_ptr<JobCgroup> JobCgroup::create(const std::string& name) {
  const char* knob = std::getenv("CXXLAUNCH_CGROUP");  // NOLINT(concurrency-mt-unsafe)
  if (knob != nullptr && std::strcmp(knob, "off") == 0) return nullptr;
  const auto mount = cgroup2Mount();
  const auto own = ownCgroup();
  if (!mount || !own) return nullptr;
  // Our path is relative to the hierarchy's root as this mount shows it (a container's cgroup
  // namespace: both "/"); a mount of some other part of the tree does not contain us.
  const auto& [mount_point, root] = *mount;
  std::string relative = *own;
  if (root != "/") {
    if (!relative.starts_with(root + "/") && relative != root) return nullptr;
    relative = relative.substr(root.size());
  }
  if (relative == "/") relative.clear();
  const std::string parent = mount_point + relative;
  const std::string path = parent + "/" + name;
  if (path.size() >= PATH_MAX || ::mkdir(path.c_str(), 0755) != 0) return nullptr;
  collectStaleCgroups(parent, kStaleAfterSeconds);
  // Held while the launcher lives: a cgroup nobody holds is stale (collectStaleCgroups).
  const int dir_fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd != -1) ::flock(dir_fd, LOCK_SH | LOCK_NB);
  const int procs_fd = ::open((path + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
  if (dir_fd == -1 || procs_fd == -1) {
    if (dir_fd != -1) ::close(dir_fd);
    if (procs_fd != -1) ::close(procs_fd);
    ::rmdir(path.c_str());
    return nullptr;
  }
  return std::unique_ptr<JobCgroup>(new JobCgroup(path, dir_fd, procs_fd));
}

JobCgroup::~JobCgroup() {
  closeAttempt();
  ::close(dir_fd_);
  ::close(procs_fd_);
  removeCgroup(path_.c_str(), 5000);
}

void JobCgroup::startAttempt(int attempt) {
  const std::string previous = attempt_path_;
  closeAttempt();
  if (!previous.empty()) ::rmdir(previous.c_str());  // what is left goes with the job's
  const std::string path = path_ + "/attempt-" + std::to_string(attempt);
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) return;
  const int dir_fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const int procs_fd = ::open((path + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
  if (dir_fd == -1 || procs_fd == -1) {
    if (dir_fd != -1) ::close(dir_fd);
    if (procs_fd != -1) ::close(procs_fd);
    ::rmdir(path.c_str());
    return;
  }
  attempt_path_ = path;
  attempt_dir_fd_ = dir_fd;
  attempt_procs_fd_ = procs_fd;
}

void JobCgroup::closeAttempt() {
  if (attempt_dir_fd_ != -1) ::close(attempt_dir_fd_);
  if (attempt_procs_fd_ != -1) ::close(attempt_procs_fd_);
  attempt_dir_fd_ = attempt_procs_fd_ = -1;
  attempt_path_.clear();
}

bool JobCgroup::populated() const { return populatedAt(path_.c_str()); }

std::vector<pid_t> JobCgroup::members() const {
  std::vector<pid_t> pids;
  for (const std::string& dir : {path_, attempt_path_}) {
    if (dir.empty()) continue;
    std::ifstream in(dir + "/cgroup.procs");
    for (long pid = 0; in >> pid;) pids.push_back(static_cast<pid_t>(pid));
  }
  return pids;
}

void JobCgroup::killAll() const { killCgroup(path_.c_str()); }

}  // namespace cxxlaunch::launcher
