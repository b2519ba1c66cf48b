// `cxxlaunch run` end to end: the real launcher starting real test workers.

#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "support/status_rows.h"
#include "support/subprocess.h"
#include "support/worker_pids.h"

using namespace cxxlaunch::testing;
using namespace std::chrono_literals;
using Args = std::vector<std::string>;
namespace fs = std::filesystem;

namespace {

Args launch(Args flags, const Args& steps) {
  Args argv = {CXXLAUNCH_BIN, "run"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(TEST_WORKER);
  argv.insert(argv.end(), steps.begin(), steps.end());
  return argv;
}

// The console lines of one rank, prefix removed.
std::vector<std::string> linesOf(const std::string& text, int rank) {
  const std::string prefix = "[rank " + std::to_string(rank) + "]: ";
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with(prefix)) lines.push_back(line.substr(prefix.size()));
  }
  return lines;
}

std::map<std::string, std::string> envOf(const std::string& text, int rank) {
  std::map<std::string, std::string> vars;
  for (const auto& line : linesOf(text, rank)) {
    auto eq = line.find('=');
    if (eq != std::string::npos) vars[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return vars;
}

}  // namespace

TEST_CASE("Every rank gets the torchrun environment contract", "[launcher][integration]") {
  TempDir logs;
  auto r = run(launch({"--nproc_per_node=3", "--run_id=contract", "--log_dir", logs.path(),
                       "--role", "trainer", "--max_restarts=4"},
                      {"env"}),
               {{"OMP_NUM_THREADS", ""}, {"RANK", "99"}});
  REQUIRE(r.exit_code == 0);
  std::set<std::string> ports;
  for (int rank = 0; rank < 3; ++rank) {
    INFO("rank " << rank << "\n" << r.out);
    auto vars = envOf(r.out, rank);
    CHECK(vars["RANK"] == std::to_string(rank));
    CHECK(vars["LOCAL_RANK"] == std::to_string(rank));
    CHECK(vars["WORLD_SIZE"] == "3");
    CHECK(vars["LOCAL_WORLD_SIZE"] == "3");
    CHECK(vars["GROUP_RANK"] == "0");
    CHECK(vars["GROUP_WORLD_SIZE"] == "1");
    CHECK(vars["ROLE_NAME"] == "trainer");
    CHECK(vars["ROLE_RANK"] == std::to_string(rank));
    CHECK(vars["ROLE_WORLD_SIZE"] == "3");
    CHECK(vars["MASTER_ADDR"] == "127.0.0.1");
    CHECK(std::stoi(vars["MASTER_PORT"]) > 0);
    CHECK(vars["TORCHELASTIC_RESTART_COUNT"] == "0");
    CHECK(vars["TORCHELASTIC_MAX_RESTARTS"] == "4");
    CHECK(vars["TORCHELASTIC_RUN_ID"] == "contract");
    CHECK(vars["TORCHELASTIC_ERROR_FILE"] ==
          logs.path() + "/contract/attempt_0/" + std::to_string(rank) + "/error.json");
    CHECK(vars["OMP_NUM_THREADS"] == "1");
    ports.insert(vars["MASTER_PORT"]);
  }
  CHECK(ports.size() == 1);
}

TEST_CASE("A user's OMP_NUM_THREADS, --master_port and --gpus reach the workers",
          "[launcher][integration]") {
  auto r = run(launch({"--gpus", "3,5", "--master_port", "29877"}, {"env"}),
               {{"OMP_NUM_THREADS", "7"}, {"CUDA_VISIBLE_DEVICES", ""}});
  REQUIRE(r.exit_code == 0);
  for (int rank = 0; rank < 2; ++rank) {
    auto vars = envOf(r.out, rank);
    CHECK(vars["OMP_NUM_THREADS"] == "7");
    CHECK(vars["MASTER_PORT"] == "29877");
    // As accelerate: every worker sees the chosen GPUs and uses the one at its local rank.
    CHECK(vars["CUDA_VISIBLE_DEVICES"] == "3,5");
    CHECK(vars["CXXLAUNCH_DEVICE"] == std::to_string(rank));
  }
}

TEST_CASE("GPU ids count within the launcher's own CUDA_VISIBLE_DEVICES",
          "[launcher][integration]") {
  auto r = run(launch({"--gpus", "1,3"}, {"env"}),
               {{"CUDA_VISIBLE_DEVICES", "GPU-aa,GPU-bb,GPU-cc,GPU-dd"}});
  REQUIRE(r.exit_code == 0);
  for (int rank = 0; rank < 2; ++rank) {
    auto vars = envOf(r.out, rank);
    CHECK(vars["CUDA_VISIBLE_DEVICES"] == "GPU-bb,GPU-dd");
    CHECK(vars["CXXLAUNCH_DEVICE"] == std::to_string(rank));
  }
  // An id the inherited list does not have: one line, exit 2, no worker started.
  auto bad =
      run(launch({"--gpus", "0,2"}, {"print", "started"}), {{"CUDA_VISIBLE_DEVICES", "4,5"}});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("--gpus 2: this shell's CUDA_VISIBLE_DEVICES=4,5 shows 2 GPU(s)") !=
        std::string::npos);
  CHECK(bad.out.find("started") == std::string::npos);
}

TEST_CASE("A worker that stops making progress is named and the job stopped",
          "[launcher][integration]") {
  // Rank 1 beats once, then hangs outside anything the launcher could see exit; rank 0 beats
  // and finishes. A worker that never beats (no runtime) is not watched: rank 0 here.
  const auto start = std::chrono::steady_clock::now();
  auto r = run(launch({"--nproc_per_node=2", "--watchdog_timeout", "1", "--shutdown_grace", "1"},
                      {"rank", "1", "heartbeat", "sleep", "60"}));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(r.out << r.err);
  CHECK(seconds < 10);
  CHECK(r.exit_code == 128 + 9);
  CHECK_THAT(r.err, Catch::Contains("cxxlaunch: rank 1 (pid "));
  CHECK_THAT(r.err, Catch::Contains("(--watchdog_timeout 1.0 s): stopped by the launcher"));
  CHECK_THAT(r.err, Catch::Contains("root cause (*): rank 1"));
}

TEST_CASE("cxxlaunch status shows a stopped worker as silent, without --watchdog_timeout",
          "[launcher][integration][status]") {
  // Both ranks beat every 0.1 s (as the runtime does at each micro-step) until rank 1 is
  // stopped; the launcher has no --watchdog_timeout and so stops nothing.
  TempDir pids;
  const std::string endpoint = "127.0.0.1:" + std::to_string(freePort());
  Subprocess launcher(launch({"--nproc_per_node=2", "--rdzv_endpoint", endpoint, "--rdzv_id",
                              "silent", "--rdzv_conf", "keep_alive_interval=0.2"},
                             {"pidfile", pids.path(), "beating"}));
  auto workers = waitForPids(pids.path(), 2);
  const std::string text = checkStoppedWorkerIsSilent(
      [&] {
        return run({CXXLAUNCH_BIN, "status", "--rdzv_endpoint", endpoint, "--rdzv_id", "silent",
                    "--silent_after", "3"})
            .out;
      },
      workers);
  CHECK_THAT(text, Catch::Contains("1 worker has made no progress"));
  ::kill(launcher.pid(), SIGTERM);
  auto r = launcher.wait(30s);
  REQUIRE(r);
  CHECK(r->exit_code == 128 + SIGTERM);
}

TEST_CASE("Arguments pass verbatim with ${local_rank} substituted", "[launcher][integration]") {
  auto r = run(launch({"--nproc_per_node=2"},
                      {"argv", "--nproc_per_node=5", "shard-${local_rank}.bin", "a b", "--"}));
  REQUIRE(r.exit_code == 0);
  for (int rank = 0; rank < 2; ++rank) {
    REQUIRE(linesOf(r.out, rank) ==
            std::vector<std::string>{"--nproc_per_node=5", "shard-" + std::to_string(rank) + ".bin",
                                     "a b", "--"});
  }
}

TEST_CASE("A failed worker's shared-memory segment is removed from /dev/shm",
          "[launcher][integration]") {
  // As if the worker died while setting up shared-memory collectives.
  auto r = run({CXXLAUNCH_BIN, "run", "--nproc_per_node=1", "/bin/sh", "-c",
                "touch /dev/shm/cxxlaunch-$$-42 && echo $$ && exit 3"});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 3);
  const auto pid = linesOf(r.out, 0).at(0);
  CHECK_FALSE(fs::exists("/dev/shm/cxxlaunch-" + pid + "-42"));
}

TEST_CASE("A failing group restarts with the restart count incremented",
          "[launcher][integration]") {
  // Rank 1 fails in attempts 0 and 1 (after rank 0 has printed), then everyone succeeds.
  auto r = run(launch({"--nproc_per_node=2", "--max_restarts=3", "--shutdown_grace=5"},
                      {"env", "rank", "1", "attempt-below", "2", "sleep", "0.5", "exit", "3"}));
  REQUIRE(r.exit_code == 0);
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::string> counts;
    for (const auto& line : linesOf(r.out, rank)) {
      if (line.starts_with("TORCHELASTIC_RESTART_COUNT=")) counts.push_back(line.substr(27));
    }
    CHECK(counts == std::vector<std::string>{"0", "1", "2"});
  }
  REQUIRE_THAT(r.err, Catch::Contains("restarting all workers (restart 1 of 3)"));
  REQUIRE_THAT(r.err, Catch::Contains("restarting all workers (restart 2 of 3)"));
}

TEST_CASE("max_restarts bounds the restarts and then the root cause's code is the exit code",
          "[launcher][integration]") {
  TempDir logs;
  auto r = run(launch(
      {"--nproc_per_node=2", "--max_restarts=1", "--log_dir", logs.path(), "--run_id", "bounded"},
      {"env", "rank", "1", "exit", "3"}));
  REQUIRE(r.exit_code == 3);
  REQUIRE(linesOf(r.out, 1).size() >= 2);  // two attempts printed their env
  REQUIRE_THAT(r.out, Catch::Contains("TORCHELASTIC_RESTART_COUNT=1"));
  REQUIRE_THAT(r.out, !Catch::Contains("TORCHELASTIC_RESTART_COUNT=2"));
  REQUIRE_THAT(r.err, Catch::Contains("root cause (*): rank 1 exit 3"));
  auto summary = nlohmann::json::parse(readFile(logs.path() + "/bounded/run-summary.json"));
  CHECK(summary["status"] == "failed");
  CHECK(summary["exit_code"] == 3);
  CHECK(summary["restarts"] == 1);
  CHECK(summary["root_cause_rank"] == 1);
}

TEST_CASE("The first failure is the root cause and stops the others", "[launcher][integration]") {
  TempDir logs;
  // Rank 2 dies of SIGSEGV after writing an error file; the others would sleep for a minute.
  auto start = std::chrono::steady_clock::now();
  auto r = run(launch({"--nproc_per_node=3", "--log_dir", logs.path(), "--run_id", "crash"},
                      {"rank", "2", "eprint", "about to crash", "error-file", "bad tensor shape",
                       "kill", "11", "rank", "all", "sleep", "60"}));
  REQUIRE(std::chrono::steady_clock::now() - start < 30s);
  REQUIRE(r.exit_code == 128 + SIGSEGV);
  REQUIRE_THAT(r.err, Catch::Contains("root cause (*): rank 2 SIGSEGV (11)"));
  REQUIRE_THAT(r.err, Catch::Contains("error: bad tensor shape"));
  REQUIRE_THAT(r.err, Catch::Contains("| about to crash"));
  auto summary = nlohmann::json::parse(readFile(logs.path() + "/crash/run-summary.json"));
  CHECK(summary["root_cause_rank"] == 2);
  CHECK(summary["failures"].size() == 1);  // the stopped ranks are not failures
  CHECK(summary["failures"][0]["signal"] == "SIGSEGV");
  CHECK(summary["failures"][0]["error"] == "bad tensor shape");
}

TEST_CASE("Signals reach every worker and a stop signal ends the job with 128+signal",
          "[launcher][integration]") {
  TempDir pids;
  Subprocess launcher(launch({"--nproc_per_node=2"}, {"trap", "pidfile", pids.path(), "wait"}));
  auto workers = waitForPids(pids.path(), 2);
  for (int sig : {SIGUSR1, SIGUSR2, SIGHUP}) {
    // SIGHUP stops the job; the USR signals only reach the workers.
    ::kill(launcher.pid(), sig);
    if (sig != SIGHUP) {
      std::string name = sig == SIGUSR1 ? "got SIGUSR1" : "got SIGUSR2";
      REQUIRE(eventually(
          [&] {
            return linesOf(launcher.out(), 0).size() >= (sig == SIGUSR1 ? 1u : 2u) &&
                   linesOf(launcher.out(), 1).size() >= (sig == SIGUSR1 ? 1u : 2u);
          },
          10s));
      REQUIRE_THAT(launcher.out(), Catch::Contains("[rank 0]: " + name));
      REQUIRE_THAT(launcher.out(), Catch::Contains("[rank 1]: " + name));
    }
  }
  auto r = launcher.wait(20s);
  REQUIRE(r);
  REQUIRE(r->exit_code == 128 + SIGHUP);
  REQUIRE_THAT(r->out, Catch::Contains("[rank 0]: got SIGHUP"));
  REQUIRE_THAT(r->out, Catch::Contains("[rank 1]: got SIGHUP"));
  for (pid_t pid : workers) REQUIRE_FALSE(alive(pid));
}

TEST_CASE("SIGINT and SIGTERM to the launcher are forwarded", "[launcher][integration]") {
  for (int sig : {SIGINT, SIGTERM, SIGQUIT}) {
    TempDir pids;
    Subprocess launcher(launch({"--nproc_per_node=2"}, {"trap", "pidfile", pids.path(), "wait"}));
    waitForPids(pids.path(), 2);
    ::kill(launcher.pid(), sig);
    auto r = launcher.wait(20s);
    REQUIRE(r);
    REQUIRE(r->exit_code == 128 + sig);
    const std::string got = "got SIG" + std::string(sigabbrev_np(sig));
    REQUIRE_THAT(r->out, Catch::Contains("[rank 0]: " + got));
    REQUIRE_THAT(r->out, Catch::Contains("[rank 1]: " + got));
  }
}

TEST_CASE("SIGKILL of the launcher leaves no worker alive", "[launcher][integration]") {
  TempDir pids;
  Subprocess launcher(launch({"--nproc_per_node=3"}, {"pidfile", pids.path(), "wait"}));
  auto workers = waitForPids(pids.path(), 3);
  for (pid_t pid : workers) REQUIRE(alive(pid));
  ::kill(launcher.pid(), SIGKILL);
  REQUIRE(launcher.wait(5s));
  REQUIRE(eventually(
      [&] {
        return std::none_of(workers.begin(), workers.end(), [](pid_t p) { return alive(p); });
      },
      2s));
}

TEST_CASE("A worker that ignores SIGTERM is killed after the grace", "[launcher][integration]") {
  // Rank 1 fails only once rank 0 has started ignoring SIGTERM (its pid file comes after that).
  TempDir pids;
  auto start = std::chrono::steady_clock::now();
  Subprocess launcher(launch({"--nproc_per_node=2", "--shutdown_grace=1"},
                             {"ignore-term", "pidfile", pids.path(), "rank", "1", "wait-file",
                              pids.path() + "/rank0.pid", "exit", "5", "rank", "all", "wait"}));
  auto workers = waitForPids(pids.path(), 2);
  auto r = launcher.wait(20s);
  REQUIRE(r);
  REQUIRE(r->exit_code == 5);
  REQUIRE(std::chrono::steady_clock::now() - start >= 1s);  // rank 0 survived SIGTERM
  REQUIRE_FALSE(alive(workers[0]));
}

TEST_CASE("Logs go to per-attempt per-rank files and the console gets whole prefixed lines",
          "[launcher][integration]") {
  TempDir logs;
  auto r = run(launch(
      {"--nproc_per_node=2", "--log_dir", logs.path(), "--run_id", "logs", "--max_restarts=1"},
      {"print", "out line", "eprint", "err line", "partial", "no newline", "rank", "1",
       "attempt-below", "1", "sleep", "0.5", "exit", "1"}));
  REQUIRE(r.exit_code == 0);
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (int rank = 0; rank < 2; ++rank) {
      const std::string dir =
          logs.path() + "/logs/attempt_" + std::to_string(attempt) + "/" + std::to_string(rank);
      CHECK(readFile(dir + "/stdout.log") == "out line\nno newline");
      CHECK(readFile(dir + "/stderr.log") == "err line\n");
    }
  }
  CHECK(linesOf(r.out, 1) ==
        std::vector<std::string>{"out line", "no newline", "out line", "no newline"});
  CHECK(linesOf(r.err, 0) == std::vector<std::string>{"err line", "err line"});
  auto summary = nlohmann::json::parse(readFile(logs.path() + "/logs/run-summary.json"));
  CHECK(summary["status"] == "succeeded");
  CHECK(summary["restarts"] == 1);
}

TEST_CASE("The rank filter and redirects keep lines off the console but not out of the logs",
          "[launcher][integration]") {
  TempDir logs;
  auto filtered = run(launch(
      {"--nproc_per_node=2", "--local_ranks_filter=1", "--log_dir", logs.path(), "--run_id", "f"},
      {"print", "hi"}));
  REQUIRE(filtered.exit_code == 0);
  CHECK(linesOf(filtered.out, 0).empty());
  CHECK(linesOf(filtered.out, 1) == std::vector<std::string>{"hi"});
  CHECK(readFile(logs.path() + "/f/attempt_0/0/stdout.log") == "hi\n");

  auto redirected = run(launch({"--nproc_per_node=2", "--redirects=1", "--tee=1:1"},
                               {"print", "to file", "eprint", "to console"}));
  REQUIRE(redirected.exit_code == 0);
  CHECK(linesOf(redirected.out, 0).empty());
  CHECK(linesOf(redirected.out, 1) == std::vector<std::string>{"to file"});
  CHECK(linesOf(redirected.err, 0) == std::vector<std::string>{"to console"});
}

TEST_CASE("Bad input gets one clear line and exit code 2 with nothing spawned",
          "[launcher][integration]") {
  TempDir pids;
  TempDir dir;
  const std::string not_executable = dir.path() + "/data.txt";
  std::ofstream(not_executable) << "x";
  const std::string fifo = dir.path() + "/config.fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::vector<std::pair<Args, std::string>> cases = {
      // A config path that is not a regular file is refused before anything is read: a
      // directory was an empty config, a FIFO hung, /dev/zero ran out of memory.
      {{CXXLAUNCH_BIN, "run", "--config_file", dir.path(), TEST_WORKER, "pidfile", pids.path()},
       "is a directory"},
      {{CXXLAUNCH_BIN, "run", "--config_file", fifo, TEST_WORKER, "pidfile", pids.path()},
       "not a regular file"},
      {{CXXLAUNCH_BIN, "run", "--config_file=/dev/zero", TEST_WORKER, "pidfile", pids.path()},
       "not a regular file"},
      {{CXXLAUNCH_BIN, "run", "--nnodes=32769", "--nproc_per_node=65536", "--rdzv_endpoint=h",
        "--rdzv_id=j", TEST_WORKER, "pidfile", pids.path()},
       "ranks, more than the"},
      {{CXXLAUNCH_BIN, "run", "--bogus_flag", TEST_WORKER, "pidfile", pids.path()},
       "unknown flag '--bogus_flag'"},
      {{CXXLAUNCH_BIN, "run", "--nproc_per_node", "0", TEST_WORKER, "pidfile", pids.path()},
       "'0' is not a number >= 1"},
      {{CXXLAUNCH_BIN, "run", "--nproc_per_node=2"}, "no program given"},
      {{CXXLAUNCH_BIN, "run", not_executable}, "is not an executable file"},
      {{CXXLAUNCH_BIN, "run", "--master_port=99999", TEST_WORKER, "pidfile", pids.path()},
       "is not a port number"},
      {{CXXLAUNCH_BIN, "frobnicate"}, "unknown command 'frobnicate'"},
  };
  for (const auto& [argv, message] : cases) {
    auto r = run(argv, {}, 10s);
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains(message));
    CHECK(r.out.empty());
  }
  CHECK(fs::is_empty(pids.path()));
}

TEST_CASE("Process counts: two flags that disagree exit 2, a flag over the file prints a note",
          "[launcher][integration]") {
  auto conflict = run(launch({"--num_processes", "3", "--nproc_per_node", "1"}, {"print", "x"}));
  CHECK(conflict.exit_code == 2);
  CHECK(conflict.err ==
        "cxxlaunch run: error: --nproc_per_node 1 conflicts with --num_processes 3; give one of "
        "them\n");
  TempDir dir;
  const std::string yaml = dir.path() + "/c.yaml";
  // Two workers, no more than the cores of any machine that runs this (more would add a warning).
  std::ofstream(yaml) << "distributed_type: MULTI_CPU\nnum_processes: 1\n";
  auto over = run(launch({"--config_file", yaml, "--nproc_per_node", "2", "--log_dir", dir.path()},
                         {"print", "hi"}));
  CHECK(over.exit_code == 0);
  CHECK(linesOf(over.out, 1) == std::vector<std::string>{"hi"});
  CHECK(over.err == "cxxlaunch: note: --nproc_per_node 2 overrides num_processes 1 from file " +
                        yaml + ":2:16\n");
}

TEST_CASE("Out of file descriptors (ulimit -n) the launcher says so and exits 1",
          "[launcher][integration][limits]") {
  // Past some of these limits the launcher runs out of descriptors in its own pipes, its log
  // folder, or a new worker's set-up (once reported as "exec ... failed").
  TempDir dir;
  int refused = 0;
  for (const int limit : {12, 16, 20, 24, 28, 32, 36}) {
    auto r = run({"/usr/bin/prlimit", "--nofile=" + std::to_string(limit), "--", CXXLAUNCH_BIN,
                  "run", "--log_dir", dir.path(), "--nproc_per_node=4", "/bin/true"},
                 {}, 30s);
    INFO("limit " << limit << ": " << r.err);
    if (r.exit_code == 0) continue;
    ++refused;
    CHECK(r.exit_code == 1);
    // On a machine with fewer than 4 cores a warning line says so first.
    std::string err = r.err;
    if (err.starts_with("cxxlaunch: warning: 4 worker processes on ")) {
      err.erase(0, err.find('\n') + 1);
    }
    CHECK(err.starts_with("cxxlaunch run: "));
    CHECK(err.ends_with(" (the launcher has as many files open as it may, " +
                        std::to_string(limit) +
                        ": its workers' pipes and logs need a few each; raise ulimit -n)\n"));
    CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  }
  CHECK(refused >= 3);
}
