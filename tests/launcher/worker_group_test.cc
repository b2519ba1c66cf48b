#include "launcher/worker_group.h"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "agent_parts.h"
#include "support/subprocess.h"

using namespace cxxlaunch::launcher;
using cxxlaunch::testing::alive;
using cxxlaunch::testing::eventually;
using cxxlaunch::testing::readFile;
using cxxlaunch::testing::startShell;

namespace {

using std::chrono::milliseconds;

// What a worker printed on its stdout up to EOF (its pipe's read end is blocking-free: poll).
std::string readAll(int fd) {
  std::string out;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      out.append(buffer, n);
    } else if (n == 0) {
      break;
    } else if (errno == EAGAIN) {
      std::this_thread::sleep_for(milliseconds(5));
    } else {
      break;
    }
  }
  ::close(fd);
  return out;
}

// Reaps until every worker of `group` has exited; the exits in the order seen.
std::vector<WorkerExit> reapAll(WorkerGroup& group) {
  std::vector<WorkerExit> all;
  REQUIRE(eventually(
      [&] {
        for (const WorkerExit& e : group.reap()) all.push_back(e);
        return group.running() == 0;
      },
      std::chrono::seconds(30)));
  return all;
}

// A wait for stopLeftovers that only sleeps: no stop signal comes.
int sleepOnly(milliseconds timeout) {
  std::this_thread::sleep_for(timeout);
  return 0;
}

std::string groupName() { return "cxxlaunch-test-" + std::to_string(::getpid()); }

}  // namespace

TEST_CASE("Workers are reaped with their status, each leading its own process group",
          "[worker_group]") {
  WorkerGroup group(groupName());
  group.beginAttempt(0);
  auto a = startShell(group, 0, "echo $$ $(cut -d' ' -f5 /proc/$$/stat); exit 3");
  auto b = startShell(group, 1, "kill -SEGV $$");
  CHECK(group.running() == 2);
  const std::string said = readAll(a[0]);
  ::close(a[1]);
  ::close(b[0]);
  ::close(b[1]);
  const std::vector<WorkerExit> exits = reapAll(group);
  REQUIRE(exits.size() == 2);
  for (const WorkerExit& e : exits) {
    const Worker& w = group.workers()[e.index];
    CHECK_FALSE(w.running);
    if (w.local_rank == 0) {
      CHECK((WIFEXITED(e.status) && WEXITSTATUS(e.status) == 3));
      // "PID PGID": the worker leads its group.
      const auto pid = std::to_string(w.pid);
      CHECK(said.substr(0, said.find(' ')) == pid);
      CHECK(std::stol(said.substr(said.find(' '))) == w.pid);
    } else {
      CHECK((WIFSIGNALED(e.status) && WTERMSIG(e.status) == SIGSEGV));
    }
  }
  CHECK(group.stopLeftovers(std::chrono::steady_clock::now(), sleepOnly) == 0);
}

TEST_CASE("A signal reaches everything in each running worker's process group", "[worker_group]") {
  WorkerGroup group(groupName());
  group.beginAttempt(0);
  auto fds = startShell(group, 0, "sleep 100 & echo $!; wait");
  std::string line;
  REQUIRE(eventually(
      [&] {
        char buffer[64];
        const ssize_t n = ::read(fds[0], buffer, sizeof(buffer));
        if (n > 0) line.append(buffer, n);
        return line.find('\n') != std::string::npos;
      },
      std::chrono::seconds(10)));
  const pid_t grandchild = std::stoi(line);
  group.signal(SIGTERM);
  const std::vector<WorkerExit> exits = reapAll(group);
  REQUIRE(exits.size() == 1);
  CHECK((WIFSIGNALED(exits[0].status) && WTERMSIG(exits[0].status) == SIGTERM));
  // The grandchild had the same group: it got SIGTERM too (and was reaped by us, subreaper).
  CHECK(eventually(
      [&] {
        group.reap();
        return !alive(grandchild);
      },
      std::chrono::seconds(10)));
  ::close(fds[0]);
  ::close(fds[1]);
  CHECK(group.stopLeftovers(std::chrono::steady_clock::now(), sleepOnly) == 0);
}

TEST_CASE("What a worker left behind gets SIGTERM, then SIGKILL when the grace ends",
          "[worker_group]") {
  WorkerGroup group(groupName());
  group.beginAttempt(0);
  // The grandchild leaves the worker's group and session, and ignores SIGTERM.
  auto fds =
      startShell(group, 0, "trap '' TERM; setsid sleep 100 >/dev/null 2>&1 & echo $!; exit 0");
  const pid_t leftover = std::stoi(readAll(fds[0]));
  ::close(fds[1]);
  reapAll(group);
  CHECK(alive(leftover));
  CHECK(group.stopLeftovers(std::chrono::steady_clock::now() + milliseconds(200), sleepOnly) == 0);
  CHECK_FALSE(alive(leftover));
}

TEST_CASE("A stop signal during the leftovers' grace ends it at once and is returned",
          "[worker_group]") {
  WorkerGroup group(groupName());
  group.beginAttempt(0);
  auto fds =
      startShell(group, 0, "trap '' TERM; setsid sleep 100 >/dev/null 2>&1 & echo $!; exit 0");
  const pid_t leftover = std::stoi(readAll(fds[0]));
  ::close(fds[1]);
  reapAll(group);
  int waits = 0;
  const int sig = group.stopLeftovers(std::chrono::steady_clock::now() + std::chrono::hours(1),
                                      [&](milliseconds) { return ++waits == 1 ? SIGINT : 0; });
  CHECK(sig == SIGINT);
  CHECK_FALSE(alive(leftover));
}

TEST_CASE("Workers start in the attempt's cgroup, which goes with the group", "[worker_group]") {
  std::string job_cgroup;
  {
    WorkerGroup group(groupName());
    if (!group.confinement().starts_with("cgroup ")) {
      WARN("no cgroup here (" << group.confinement() << "): confined by process groups alone");
      return;
    }
    job_cgroup = group.confinement().substr(7);
    for (int attempt = 0; attempt < 2; ++attempt) {
      group.beginAttempt(attempt);
      auto fds = startShell(group, 0, "cat /proc/self/cgroup");
      const std::string cgroups = readAll(fds[0]);
      ::close(fds[1]);
      reapAll(group);
      const std::string attempt_dir = "/cxxlaunch-test-" + std::to_string(::getpid()) +
                                      "/attempt-" + std::to_string(attempt) + "\n";
      CHECK(cgroups.find(attempt_dir) != std::string::npos);
      CHECK(group.stopLeftovers(std::chrono::steady_clock::now(), sleepOnly) == 0);
    }
    CHECK(std::filesystem::exists(job_cgroup));
  }
  CHECK_FALSE(std::filesystem::exists(job_cgroup));
}

TEST_CASE("CXXLAUNCH_CGROUP=off confines by process groups", "[worker_group]") {
  ::setenv("CXXLAUNCH_CGROUP", "off", 1);
  WorkerGroup group(groupName());
  ::unsetenv("CXXLAUNCH_CGROUP");
  CHECK(group.confinement() == "process groups");
}
