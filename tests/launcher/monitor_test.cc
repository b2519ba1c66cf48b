#include "launcher/monitor.h"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <thread>

#include "agent_parts.h"
#include "support/subprocess.h"

using namespace cxxlaunch::launcher;
using cxxlaunch::testing::AgentSignalMask;
using cxxlaunch::testing::alive;
using cxxlaunch::testing::eventually;
using cxxlaunch::testing::readFile;
using cxxlaunch::testing::TempDir;
using Outcome = AttemptResult::Outcome;

namespace {

LaunchOptions optionsFor(const std::string& run_id) {
  LaunchOptions options;
  options.run_id = run_id;
  options.progress = ProgressMode::kOff;
  options.shutdown_grace = std::chrono::seconds(30);
  return options;
}

// One attempt as the agent runs it: the real rendezvous (a private server, as a single-node job
// has), a WorkerGroup, an OutputMux with each worker's logs, and the Monitor.
struct Attempt {
  explicit Attempt(LaunchOptions launch)
      : options(std::move(launch)),
        rendezvous(makeNodeRendezvous(options)),
        monitor(options, *rendezvous),
        group("cxxlaunch-test-" + std::to_string(::getpid())),
        mux(std::vector<Console*>{}) {
    group.beginAttempt(0);
  }

  // Worker `rank` runs `sh -c script` with $DIR its own folder (error.json, heartbeat, logs).
  void start(int rank, const std::string& script) {
    const std::string folder = dir.path() + "/" + std::to_string(rank);
    std::filesystem::create_directory(folder);
    Worker w;
    w.local_rank = w.global_rank = rank;
    w.error_file = folder + "/error.json";
    w.heartbeat_file = folder + "/heartbeat";
    SpawnSpec spec;
    spec.program = "/bin/sh";
    spec.argv = {"/bin/sh", "-c", script};
    spec.env = {"PATH=/usr/bin:/bin", "DIR=" + folder};
    const auto fds = group.spawn(std::move(w), std::move(spec));
    mux.add(fds[0], std::make_unique<StreamSink>(folder + "/stdout.log", nullptr, "", 0));
    mux.add(fds[1], std::make_unique<StreamSink>(folder + "/stderr.log", nullptr, "", 10));
  }
  std::string log(int rank, const char* name) const {
    return readFile(dir.path() + "/" + std::to_string(rank) + "/" + name);
  }
  AttemptResult run() { return monitor.run(group, mux); }

  AgentSignalMask mask;  // first: before the rendezvous starts its threads
  LaunchOptions options;
  TempDir dir;
  std::unique_ptr<NodeRendezvous> rendezvous;
  Monitor monitor;
  WorkerGroup group;
  OutputMux mux;
};

bool exitedBy(const Worker& w) { return !w.running; }

}  // namespace

TEST_CASE("The first failure stops the other workers and is reported with its last words",
          "[monitor]") {
  Attempt attempt(optionsFor("monitor-failure"));
  attempt.start(0,
                "echo 'Traceback' >&2; echo 'RuntimeError: boom' >&2;"
                "echo '{\"message\": \"boom in step 3\"}' > $DIR/error.json; exit 3");
  attempt.start(1, "echo ready; exec sleep 100");
  const AttemptResult result = attempt.run();
  CHECK(result.outcome == Outcome::kFailed);
  REQUIRE(result.failures.size() == 1);  // rank 1's SIGTERM came from the stop: not a failure
  const Failure& f = result.failures[0];
  CHECK(f.global_rank == 0);
  CHECK(f.exit_code == 3);
  CHECK(f.signal == 0);
  CHECK(f.error_message == "boom in step 3");
  CHECK(f.stderr_tail == std::vector<std::string>{"Traceback", "RuntimeError: boom"});
  CHECK(std::all_of(attempt.group.workers().begin(), attempt.group.workers().end(), exitedBy));
  CHECK(attempt.log(1, "stdout.log") == "ready\n");  // read to the end after the exits
}

TEST_CASE("A stop signal stops the workers and ends the attempt as interrupted", "[monitor]") {
  Attempt attempt(optionsFor("monitor-stop"));
  attempt.start(0, "exec sleep 100");
  attempt.start(1, "trap 'echo terminated; exit 0' TERM; touch $DIR/ready; sleep 100 & wait");
  REQUIRE(eventually([&] { return std::filesystem::exists(attempt.dir.path() + "/1/ready"); },
                     std::chrono::seconds(10)));
  ::kill(::getpid(), SIGTERM);  // blocked: the monitor reads it from its signalfd
  const AttemptResult result = attempt.run();
  CHECK(result.outcome == Outcome::kInterrupted);
  CHECK(result.signal == SIGTERM);
  CHECK(result.failures.empty());
  CHECK(attempt.log(1, "stdout.log") == "terminated\n");  // it got the signal itself
}

TEST_CASE("SIGUSR1 is passed on to the workers and the job goes on", "[monitor]") {
  Attempt attempt(optionsFor("monitor-usr1"));
  attempt.start(0, "trap 'echo usr1; exit 0' USR1; touch $DIR/ready; sleep 100 & wait");
  std::thread sender([&] {
    eventually([&] { return std::filesystem::exists(attempt.dir.path() + "/0/ready"); },
               std::chrono::seconds(10));
    ::kill(::getpid(), SIGUSR1);
  });
  const AttemptResult result = attempt.run();
  sender.join();
  CHECK(result.outcome == Outcome::kSucceeded);
  CHECK(result.signal == 0);
  CHECK(attempt.log(0, "stdout.log") == "usr1\n");
}

TEST_CASE("News from the rendezvous stops the workers, and the exits it causes are no failures",
          "[monitor]") {
  Attempt attempt(optionsFor("monitor-news"));
  attempt.start(0, "exec sleep 100");
  attempt.start(1, "exec sleep 100");
  attempt.monitor.notify();  // as the keep-alive thread does
  const AttemptResult result = attempt.run();
  CHECK(result.outcome == Outcome::kNews);
  CHECK(result.failures.empty());
  CHECK_FALSE(attempt.monitor.takeNews());  // the loop took it
}

TEST_CASE("A worker whose heartbeat goes silent past --watchdog_timeout is the failure",
          "[monitor]") {
  LaunchOptions options = optionsFor("monitor-watchdog");
  options.watchdog_timeout = std::chrono::milliseconds(300);
  Attempt attempt(options);
  attempt.start(0, "while :; do touch $DIR/heartbeat; sleep 0.05; done");
  attempt.start(1, "touch $DIR/heartbeat; echo 'stuck here' >&2; exec sleep 100");
  const AttemptResult result = attempt.run();
  CHECK(result.outcome == Outcome::kFailed);
  REQUIRE(result.failures.size() == 1);
  CHECK(result.failures[0].global_rank == 1);
  CHECK_THAT(result.failures[0].error_message, Catch::StartsWith("made no progress for"));
  CHECK(result.failures[0].stderr_tail == std::vector<std::string>{"stuck here"});
}

TEST_CASE("Nothing the workers started outlives the attempt", "[monitor]") {
  LaunchOptions options = optionsFor("monitor-leftovers");
  options.shutdown_grace = std::chrono::milliseconds(200);
  Attempt attempt(options);
  attempt.start(0, "trap '' TERM; setsid sleep 100 >/dev/null 2>&1 & echo $! > $DIR/left; exit 0");
  const AttemptResult result = attempt.run();
  CHECK(result.outcome == Outcome::kSucceeded);
  const pid_t leftover = std::stoi(readFile(attempt.dir.path() + "/0/left"));
  CHECK_FALSE(alive(leftover));
}

TEST_CASE("Outside an attempt, a stop signal or news ends the wait", "[monitor]") {
  Attempt attempt(optionsFor("monitor-wait"));
  CHECK(attempt.monitor.waitForStop(std::chrono::milliseconds(1), true) == 0);
  attempt.monitor.notify();
  CHECK(attempt.monitor.waitForStop(std::chrono::hours(1), true) == 0);
  CHECK(attempt.monitor.takeNews());
  ::kill(::getpid(), SIGHUP);
  CHECK(attempt.monitor.waitForStop(std::chrono::hours(1), false) == SIGHUP);
}
