// A cgroup per job (launcher/cgroup.h), end to end with real processes: workers and whatever
// they start are in the job's cgroup, and nothing in it outlives the job, not even after a
// SIGKILL of the launcher a process that left its worker's session (setsid) and ignores SIGTERM.
//
// Only where the launcher can make a cgroup on this machine (a writable cgroup v2 hierarchy):
// elsewhere the program exits with 77 before any test, and ctest (SKIP_RETURN_CODE 77) reports
// each test as skipped, never as passed. Listing the tests works anywhere.

#define CATCH_CONFIG_RUNNER
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "launcher/cgroup.h"
#include "launcher/process.h"
#include "support/skip_main.h"
#include "support/subprocess.h"

using namespace cxxlaunch::testing;
using namespace std::chrono_literals;
using Args = std::vector<std::string>;
namespace fs = std::filesystem;

namespace {

// What run-summary.json says of the confinement of a job run with these flags and program.
std::string confinementOf(const std::string& log_dir, const std::string& run_id) {
  return nlohmann::json::parse(readFile(log_dir + "/" + run_id + "/run-summary.json"))
      .value("confinement", "");
}

// The cgroup folder in "cgroup PATH".
std::string cgroupDir(const std::string& confinement) {
  return confinement.starts_with("cgroup ") ? confinement.substr(7) : "";
}

// The job's cgroup as the worker `pid` sees it: the "0::PATH" line of its /proc/PID/cgroup.
std::string cgroupOf(pid_t pid) {
  const std::string text = readFile("/proc/" + std::to_string(pid) + "/cgroup");
  const auto at = text.find("0::");
  return at == std::string::npos ? "" : text.substr(at + 3, text.find('\n', at) - at - 3);
}

pid_t sessionOf(pid_t pid) {
  const std::string stat = readFile("/proc/" + std::to_string(pid) + "/stat");
  int ppid = 0, pgrp = 0, session = 0;
  char state = 0;
  std::sscanf(stat.c_str() + stat.rfind(')') + 1, " %c %d %d %d", &state, &ppid, &pgrp, &session);
  return session;
}

// A worker (/bin/sh) that starts a grandchild in a session of its own (setsid) which ignores
// SIGTERM and sleeps, waits until the grandchild wrote its pid to DIR/gc.LOCAL_RANK, then waits.
Args detachedGrandparent(const std::string& dir, const Args& launcher_flags = {}) {
  const std::string gc = dir + "/gc.$LOCAL_RANK";
  Args argv = {CXXLAUNCH_BIN, "run", "--nproc_per_node=2", "--shutdown_grace=1"};
  argv.insert(argv.end(), launcher_flags.begin(), launcher_flags.end());
  argv.insert(argv.end(), {"/bin/sh", "-c",
                           "setsid /bin/sh -c 'trap \"\" TERM; echo $$ > " + gc + ".tmp; mv " + gc +
                               ".tmp " + gc + "; exec sleep 523' & while [ ! -e " + gc +
                               " ]; do sleep 0.01; done; sleep 600"});
  return argv;
}

std::vector<pid_t> grandchildren(const std::string& dir) {
  std::vector<pid_t> pids;
  REQUIRE(eventually([&] { return fs::exists(dir + "/gc.0") && fs::exists(dir + "/gc.1"); }, 20s));
  for (int r = 0; r < 2; ++r) {
    pids.push_back(static_cast<pid_t>(std::stol(readFile(dir + "/gc." + std::to_string(r)))));
  }
  return pids;
}

// Where the cgroup2 hierarchy is mounted ("" if nowhere): the cgroup paths of /proc/PID/cgroup
// are below it.
std::string cgroup2Mount() {
  std::istringstream in(readFile("/proc/self/mountinfo"));
  for (std::string line; std::getline(in, line);) {
    if (line.find(" - cgroup2 ") == std::string::npos) continue;
    std::istringstream fields(line);
    std::string id, parent, device, root, mount_point;
    fields >> id >> parent >> device >> root >> mount_point;
    return mount_point;
  }
  return "";
}

bool noneAlive(const std::vector<pid_t>& pids) {
  return std::none_of(pids.begin(), pids.end(), [](pid_t p) { return alive(p); });
}

}  // namespace

TEST_CASE("Workers and what they start run in the job's cgroup, removed at the end",
          "[confinement][integration]") {
  TempDir logs;
  auto r = run({CXXLAUNCH_BIN, "run", "--log_dir", logs.path(), "--run_id", "incg",
                "--nproc_per_node=2", "/bin/sh", "-c", "/bin/cat /proc/self/cgroup"});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const std::string dir = cgroupDir(confinementOf(logs.path(), "incg"));
  REQUIRE(!dir.empty());
  CHECK(fs::path(dir).filename().string().starts_with("cxxlaunch-incg-"));
  // Both ranks' grandchild (cat) saw the job's cgroup as its own.
  CHECK_THAT(r.out, Catch::Contains("[rank 0]: 0::") && Catch::Contains("[rank 1]: 0::"));
  CHECK_THAT(r.out, Catch::Contains(fs::path(dir).filename().string() + "/attempt-0\n"));
  CHECK_FALSE(fs::exists(dir));
}

TEST_CASE("Workers of a restart start, after the cgroup killed what the failed attempt left",
          "[confinement][integration][reliability]") {
  // Attempt 0 fails and leaves a grandchild that ignores SIGTERM, so its end takes cgroup.kill;
  // attempt 1 must run. (Linux 6.18 SIGKILLs every process later cloned into a cgroup that was
  // killed once: restarts used to fail at once, "rank 0 SIGKILL (9)".)
  TempDir logs;
  auto r = run({CXXLAUNCH_BIN, "run", "--log_dir", logs.path(), "--run_id", "rekill",
                "--nproc_per_node=2", "--max_restarts=1", "--shutdown_grace=0.2", "/bin/sh", "-c",
                "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then"
                " /bin/sh -c 'trap \"\" TERM; exec sleep 60' & exit 3; fi; echo second attempt"});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("[rank 0]: second attempt") &&
                        Catch::Contains("[rank 1]: second attempt"));
  CHECK_FALSE(fs::exists(cgroupDir(confinementOf(logs.path(), "rekill"))));
}

TEST_CASE(
    "After SIGKILL of the launcher no process of the job is left, not even one that left "
    "its session and ignores SIGTERM",
    "[confinement][integration][reliability]") {
  TempDir dir;
  Subprocess launcher(detachedGrandparent(dir.path()));
  auto pids = grandchildren(dir.path());
  const std::string cgroup = cgroupOf(pids[0]);
  INFO("grandchildren " << pids[0] << " " << pids[1] << " in " << cgroup);
  for (pid_t pid : pids) {
    REQUIRE(alive(pid));
    REQUIRE(sessionOf(pid) == pid);  // a session leader: out of its worker's process group
    REQUIRE(cgroupOf(pid).find("/cxxlaunch-") != std::string::npos);
  }
  ::kill(launcher.pid(), SIGKILL);
  REQUIRE(launcher.wait(10s));
  CHECK(eventually([&] { return noneAlive(pids); }, 10s));  // the watchdog's cgroup.kill
  for (pid_t pid : pids) ::kill(pid, SIGKILL);              // a failed check leaves nothing
  CHECK(eventually([&] { return !fs::exists(cgroup2Mount() + cgroup); }, 10s));  // removed
}

TEST_CASE("A launcher started by a worker nests its cgroup, and SIGKILL of the outer one ends all",
          "[confinement][integration][reliability]") {
  TempDir dir;
  // The outer job's only worker is an inner launcher whose two workers each detach a grandchild.
  Args inner = detachedGrandparent(dir.path());
  Args outer = {CXXLAUNCH_BIN, "run", "--nproc_per_node=1", "--shutdown_grace=1"};
  outer.insert(outer.end(), inner.begin(), inner.end());
  Subprocess launcher(outer);
  auto pids = grandchildren(dir.path());
  const std::string cgroup = cgroupOf(pids[0]);
  INFO("grandchildren " << pids[0] << " " << pids[1] << " in " << cgroup);
  REQUIRE(std::count(cgroup.begin(), cgroup.end(), '/') >= 2);  // .../cxxlaunch-A/cxxlaunch-B
  ::kill(launcher.pid(), SIGKILL);
  REQUIRE(launcher.wait(10s));
  CHECK(eventually([&] { return noneAlive(pids); }, 10s));
  for (pid_t pid : pids) ::kill(pid, SIGKILL);
  // The inner cgroup too: its own watchdog died in the outer one's kill.
  const std::string outer_dir =
      cgroup2Mount() + cgroup.substr(0, cgroup.find('/', cgroup.find("/cxxlaunch-") + 1));
  CHECK(eventually([&] { return !fs::exists(outer_dir); }, 10s));
}

TEST_CASE("Without cgroup.kill, freezing and killing each member empties the cgroup",
          "[confinement]") {
  using cxxlaunch::launcher::JobCgroup;
  auto cgroup = JobCgroup::create("cxxlaunch-test-freeze-" + std::to_string(::getpid()));
  REQUIRE(cgroup != nullptr);
  // Children that enter the cgroup, then fork more of themselves (a tree that is busy making
  // processes while it is killed).
  std::vector<pid_t> children;
  for (int i = 0; i < 3; ++i) {
    const pid_t pid = ::fork();
    REQUIRE(pid != -1);
    if (pid == 0) {
      if (::write(cgroup->procsFd(), "0", 1) != 1) ::_exit(3);
      ::signal(SIGTERM, SIG_IGN);
      for (int k = 0; k < 3; ++k) ::fork();
      for (;;) ::pause();
    }
    children.push_back(pid);
  }
  REQUIRE(eventually([&] { return cgroup->members().size() >= 3 * 8; }, 20s));
  cxxlaunch::launcher::killCgroupByFreezing(cgroup->path().c_str());
  for (pid_t pid : children) ::waitpid(pid, nullptr, 0);  // they die of it, or this hangs
  CHECK(eventually([&] { return !cgroup->populated(); }, 10s));
  const std::string path = cgroup->path();
  cgroup.reset();  // removes it
  CHECK_FALSE(fs::exists(path));
}

TEST_CASE("A worker starts in the cgroup by clone3 or by its own write before exec",
          "[confinement]") {
  using namespace cxxlaunch::launcher;
  auto cgroup = JobCgroup::create("cxxlaunch-test-spawn-" + std::to_string(::getpid()));
  REQUIRE(cgroup != nullptr);
  const std::string name = fs::path(cgroup->path()).filename().string();
  for (const bool clone3 : {true, false}) {
    INFO((clone3 ? "clone3 into the cgroup" : "write to cgroup.procs"));
    SpawnSpec spec;
    spec.program = "/bin/cat";
    spec.argv = {"/bin/cat", "/proc/self/cgroup"};
    spec.cgroup_dir_fd = clone3 ? cgroup->dirFd() : -1;
    spec.cgroup_procs_fd = cgroup->procsFd();
    const SpawnedProcess p = spawnProcess(spec);
    CHECK(p.cgroup_error == 0);
    int status = 0;
    REQUIRE(::waitpid(p.pid, &status, 0) == p.pid);
    std::string out;
    char buffer[4096];
    for (ssize_t n; (n = ::read(p.stdout_fd, buffer, sizeof(buffer))) > 0;) out.append(buffer, n);
    ::close(p.stdout_fd);
    ::close(p.stderr_fd);
    CHECK(WIFEXITED(status));
    CHECK_THAT(out, Catch::Contains("0::") && Catch::Contains("/" + name + "\n"));
  }
}

TEST_CASE("A job cgroup whose launcher and watchdog both died is emptied and removed by the next",
          "[confinement]") {
  // Two job cgroups: one with a live holder (a launcher's lock), one abandoned with a process
  // still in it (its launcher and watchdog were SIGKILLed together).
  using namespace cxxlaunch::launcher;
  auto held = JobCgroup::create("cxxlaunch-test-held-" + std::to_string(::getpid()));
  auto abandoned = JobCgroup::create("cxxlaunch-test-abandoned-" + std::to_string(::getpid()));
  REQUIRE(held != nullptr);
  REQUIRE(abandoned != nullptr);
  const std::string abandoned_dir = abandoned->path();
  const pid_t orphan = ::fork();
  REQUIRE(orphan != -1);
  if (orphan == 0) {
    if (::write(abandoned->procsFd(), "0", 1) != 1) ::_exit(3);
    ::close(abandoned->dirFd());  // as exec would (close-on-exec): the lock is the launcher's
    for (;;) ::pause();
  }
  REQUIRE(eventually([&] { return abandoned->members().size() == 1; }, 10s));
  // Gone without cleaning up: its lock goes with its descriptors (a JobCgroup that is not
  // destroyed, as after a SIGKILL).
  ::close(abandoned->dirFd());
  ::close(abandoned->procsFd());
  JobCgroup* leaked = abandoned.release();
  (void)leaked;
  const std::string parent = fs::path(abandoned_dir).parent_path().string();
  collectStaleCgroups(parent, 0);
  int status = 0;
  REQUIRE(::waitpid(orphan, &status, 0) == orphan);  // killed, or this hangs
  CHECK(WIFSIGNALED(status));
  CHECK(eventually(
      [&] {
        collectStaleCgroups(parent, 0);  // once its process is gone
        return !fs::exists(abandoned_dir);
      },
      10s));
  CHECK(fs::exists(held->path()));  // held: left alone
}

int main(int argc, char** argv) {
  return cxxlaunch::testing::runUnlessMissing(argc, argv, [] {
    // The launcher's own answer: a job's run-summary.json says which confinement it had.
    std::string confinement;
    try {
      TempDir logs;
      run({CXXLAUNCH_BIN, "run", "--log_dir", logs.path(), "--run_id", "probe", "/bin/true"});
      confinement = confinementOf(logs.path(), "probe");
    } catch (const std::exception& e) {
      confinement = e.what();
    }
    return confinement.starts_with("cgroup ")
               ? std::string()
               : "the launcher makes no cgroup on this machine (confinement: " + confinement + ")";
  });
}
