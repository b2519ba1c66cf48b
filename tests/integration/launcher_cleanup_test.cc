// `cxxlaunch run` end to end, its guarantees under stress: no process outlives its job (docs/
// reliability.md), and a console nobody reads, or reads late, delays neither a failure's reaction
// nor a stop.

#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "support/subprocess.h"
#include "support/worker_pids.h"

using namespace cxxlaunch::testing;
using namespace std::chrono_literals;
using Args = std::vector<std::string>;
namespace fs = std::filesystem;

namespace {

// A worker (/bin/sh) that starts a grandchild which ignores SIGTERM and sleeps, waits until the
// grandchild has written its pid to DIR/gc.LOCAL_RANK, then runs `then`.
Args grandparent(const std::string& dir, const std::string& then) {
  const std::string gc = dir + "/gc.$LOCAL_RANK";
  return {CXXLAUNCH_BIN,
          "run",
          "--nproc_per_node=2",
          "--shutdown_grace=1",
          "/bin/sh",
          "-c",
          "/bin/sh -c 'trap \"\" TERM; echo $$ > " + gc + ".tmp; mv " + gc + ".tmp " + gc +
              "; exec sleep 521' & while [ ! -e " + gc + " ]; do sleep 0.01; done; " + then};
}

std::vector<pid_t> grandchildren(const std::string& dir) {
  std::vector<pid_t> pids;
  REQUIRE(eventually([&] { return fs::exists(dir + "/gc.0") && fs::exists(dir + "/gc.1"); }, 10s));
  for (int r = 0; r < 2; ++r) {
    pids.push_back(static_cast<pid_t>(std::stol(readFile(dir + "/gc." + std::to_string(r)))));
  }
  return pids;
}

bool noneAlive(const std::vector<pid_t>& pids) {
  return std::none_of(pids.begin(), pids.end(), [](pid_t p) { return alive(p); });
}

}  // namespace

TEST_CASE("Grandchildren that ignore SIGTERM do not outlive a clean job",
          "[launcher][integration][reliability]") {
  TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  auto r = run(grandparent(dir.path(), "exit 0"), {}, 30s);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  auto pids = grandchildren(dir.path());
  CHECK(noneAlive(pids));  // at the launcher's exit, not some time later
  CHECK(std::chrono::steady_clock::now() - start < 10s);  // SIGTERM, 1 s grace, SIGKILL
}

TEST_CASE("A failed worker's grandchildren get the grace and then SIGKILL",
          "[launcher][integration][reliability]") {
  TempDir dir;
  // Rank 1 fails only once rank 0's grandchild exists too: under load, rank 0 could otherwise be
  // stopped before it started one, and the test would wait for a pid file never written.
  const std::string both = "while [ ! -e " + dir.path() + "/gc.0 ]; do sleep 0.01; done; ";
  auto r =
      run(grandparent(dir.path(), "if [ $LOCAL_RANK = 1 ]; then " + both + "exit 3; fi; sleep 30"),
          {}, 30s);
  INFO(r.err);
  CHECK(r.exit_code == 3);
  CHECK(noneAlive(grandchildren(dir.path())));
}

TEST_CASE("SIGKILL of the launcher leaves no grandchild alive",
          "[launcher][integration][reliability]") {
  TempDir dir;
  Subprocess launcher(grandparent(dir.path(), "wait"));
  auto pids = grandchildren(dir.path());
  for (pid_t pid : pids) REQUIRE(alive(pid));
  ::kill(launcher.pid(), SIGKILL);
  REQUIRE(launcher.wait(5s));
  CHECK(eventually([&] { return noneAlive(pids); }, 2s));  // the watchdog's work
  for (pid_t pid : pids) ::kill(pid, SIGKILL);  // a failed check must not leave them behind
}

TEST_CASE("Where no cgroup is to be had, the job is confined by process groups and says so",
          "[launcher][integration][reliability]") {
  // CXXLAUNCH_CGROUP=off stands for a machine without a writable cgroup v2 hierarchy.
  TempDir logs;
  auto r = run({CXXLAUNCH_BIN, "run", "--log_dir", logs.path(), "--run_id", "nocg",
                "--nproc_per_node=2", "/bin/sh", "-c", "/bin/cat /proc/self/cgroup"},
               {{"CXXLAUNCH_CGROUP", "off"}});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.err.empty());  // silently
  const auto summary = nlohmann::json::parse(readFile(logs.path() + "/nocg/run-summary.json"));
  CHECK(summary["confinement"] == "process groups");
  CHECK_THAT(r.out, !Catch::Contains("cxxlaunch-nocg-"));
}

TEST_CASE("A console nobody reads does not delay the reaction to a failed worker",
          "[launcher][integration][reliability]") {
  // Rank 0 floods stdout into a pipe nobody reads; rank 1 fails after 1 s. The launcher must
  // stop rank 0 and report at once, not when the console has taken the flood.
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  TempDir dir;
  const std::string err = dir.path() + "/err";
  const std::string script =
      "exec " + std::string(CXXLAUNCH_BIN) +
      " run --nproc_per_node=2 /bin/sh -c '[ $LOCAL_RANK = 1 ] && { sleep 1; exit 7; }; yes | "
      "head -c 50000000' >&" +
      std::to_string(pipe_fds[1]) + " 2>" + err;
  const auto start = std::chrono::steady_clock::now();
  Subprocess launcher({"/bin/sh", "-c", script});
  ::close(pipe_fds[1]);
  REQUIRE(eventually([&] { return readFile(err).find("root cause") != std::string::npos; }, 15s));
  const auto reacted = std::chrono::steady_clock::now() - start;
  CHECK(reacted < 4s);  // was 20 s: the launcher blocked in a console write
  auto r = launcher.wait(20s);
  REQUIRE(r);
  CHECK(r->exit_code == 7);
  CHECK_THAT(readFile(err), Catch::Contains("did not take the last"));
  ::close(pipe_fds[0]);
}

TEST_CASE("SIGTERM ends a job whose console is never read",
          "[launcher][integration][reliability]") {
  // Both ranks write without end into a pipe nobody ever reads. Once the console's queue is full
  // the launcher stops reading them; a SIGTERM must still stop them and end the job (it waited
  // for the pipe before: for ever, with a reader that never comes).
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  TempDir dir;
  const std::string err = dir.path() + "/err";
  const std::string script = "exec " + std::string(CXXLAUNCH_BIN) + " run --log_dir " + dir.path() +
                             " --run_id flood --nproc_per_node=2 yes >&" +
                             std::to_string(pipe_fds[1]) + " 2>" + err;
  Subprocess launcher({"/bin/sh", "-c", script});
  ::close(pipe_fds[1]);
  auto logged = [&] {
    std::error_code ec;
    uintmax_t bytes = 0;
    for (const char* rank : {"0", "1"}) {
      const auto size = fs::file_size(dir.path() + "/flood/attempt_0/" + rank + "/stdout.log", ec);
      if (!ec) bytes += size;
    }
    return bytes;
  };
  // "y\n" is 12 bytes on the console ("[rank 0]: y\n"): 150 kB logged is more than the pipe
  // holds, and most of the 1 MiB queue.
  REQUIRE(eventually([&] { return logged() > 150'000; }, 30s));
  ::kill(launcher.pid(), SIGTERM);
  auto r = launcher.wait(60s);
  REQUIRE(r);
  CHECK(r->exit_code == 128 + SIGTERM);
  CHECK_THAT(readFile(err), Catch::Contains("did not take the last"));
  ::close(pipe_fds[0]);
}

TEST_CASE("A stderr reader that falls behind and catches up does not stop the job",
          "[launcher][integration][reliability]") {
  // The event loop once tagged "stderr writable again" with the tag of the rendezvous' news: a
  // console that filled and drained stopped the workers as if the rendezvous had news (and the
  // job then ended as if it had succeeded). A worker writes more than the pipe holds to stderr,
  // then sleeps while the reader, late, catches up, then says it is done.
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  TempDir dir;
  const std::string script =
      "exec " + std::string(CXXLAUNCH_BIN) + " run --log_dir " + dir.path() +
      " --nproc_per_node=1 /bin/sh -c 'head -c 200000 /dev/zero | tr \"\\\\0\" y | fold -w 49 >&2; "
      "sleep 2; echo done' 2>&" +
      std::to_string(pipe_fds[1]) + " >" + dir.path() + "/out";
  Subprocess launcher({"/bin/sh", "-c", script});
  ::close(pipe_fds[1]);
  std::this_thread::sleep_for(1s);  // 240 kB of lines wait: the pipe is full
  std::string err;
  std::optional<Finished> r;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{pipe_fds[0], POLLIN, 0};
    if (::poll(&p, 1, 100) > 0) {
      char buffer[65536];
      const ssize_t n = ::read(pipe_fds[0], buffer, sizeof(buffer));
      if (n > 0) {
        err.append(buffer, static_cast<size_t>(n));
        continue;
      }
      if (n == 0) break;
    }
    if ((r = launcher.wait(0ms))) break;
  }
  ::close(pipe_fds[0]);
  if (!r) r = launcher.wait(10s);
  REQUIRE(r);
  INFO(err.substr(err.size() > 2000 ? err.size() - 2000 : 0));
  CHECK(r->exit_code == 0);
  CHECK(readFile(dir.path() + "/out") == "[rank 0]: done\n");  // it was not stopped
  // 200000 bytes in lines of 49: 4081 whole lines and one of 31 bytes, ended at exit.
  CHECK(std::count(err.begin(), err.end(), '\n') == 4082);
}

TEST_CASE("A stop signal during the leftovers' grace kills them at once and ends the job",
          "[launcher][integration][reliability]") {
  TempDir dir;
  Args argv = grandparent(dir.path(), "exit 0");
  argv[3] = "--shutdown_grace=30";  // the leftovers would get 30 s
  Subprocess launcher(argv);
  auto pids = grandchildren(dir.path());
  std::this_thread::sleep_for(300ms);  // the workers have exited; the launcher waits for pids
  const auto start = std::chrono::steady_clock::now();
  ::kill(launcher.pid(), SIGINT);
  auto r = launcher.wait(10s);
  REQUIRE(r);
  CHECK(r->exit_code == 128 + SIGINT);
  CHECK(std::chrono::steady_clock::now() - start < 3s);
  CHECK(noneAlive(pids));
}
