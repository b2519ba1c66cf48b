#include "launcher/agent.h"

#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <optional>
#include <thread>

#include "common/error.h"
#include "common/host.h"
#include "launcher/failure.h"
#include "launcher/log_folder.h"
#include "launcher/monitor.h"
#include "launcher/output.h"
#include "launcher/output_mux.h"
#include "launcher/worker_group.h"
#include "launcher/worker_spec.h"

namespace cxxlaunch::launcher {
namespace fs = std::filesystem;
namespace {

constexpr size_t kStderrTailLines = 10;

// How long a finishing launcher waits for a console that does not take its last lines (the log
// files have them all).
constexpr std::chrono::seconds kConsoleDrain{5};

// The agent's own lines go through the same console queue as the workers' stderr: they keep
// their order and never block the loop.
void say(const std::string& text) { Console::of(STDERR_FILENO).write(text); }

// torch.distributed.elastic's agent: the restart loop around the rendezvous. Each attempt joins
// a round, starts the workers (WorkerGroup, their output in an OutputMux), runs the Monitor until
// they are gone, and asks the rendezvous what comes next.
class Agent {
 public:
  Agent(const LaunchOptions& options, NodeRendezvous& rendezvous)
      : options_(options),
        rendezvous_(rendezvous),
        log_(makeLogFolder(options)),
        monitor_(options, rendezvous),
        group_("cxxlaunch-" + options.run_id + "-" + std::to_string(::getpid())),
        spec_(options, currentEnvironment()) {}

  int run();

 private:
  static LogFolder makeLogFolder(const LaunchOptions& options);
  std::optional<WorldAssignment> joinInterruptibly(int& signal);
  std::optional<Decision> waitForPeers(int& signal);
  void startWorkers(int attempt, const WorldAssignment& world);
  Decision decide(const AttemptResult& result, const WorldAssignment& world, int& signal);
  int finish(RunReport& report, const std::string& status, int exit_code);

  const LaunchOptions& options_;
  NodeRendezvous& rendezvous_;
  LogFolder log_;
  Monitor monitor_;
  WorkerGroup group_;
  WorkerSpec spec_;
  OutputMux output_;
};

LogFolder Agent::makeLogFolder(const LaunchOptions& options) {
  std::vector<std::string> components = {options.run_id};
  // Nodes of one job may share a machine (and a log folder): each gets its own below the job's.
  if (options.rdzv.multiNode()) {
    components.push_back(hostName() + "_" + std::to_string(::getpid()));
  }
  LogFolder log = makeRunFolder(options.log_dir, components);
  if (!log.note.empty()) say("cxxlaunch: note: " + log.note + "\n");
  return log;
}

void Agent::startWorkers(int attempt, const WorldAssignment& world) {
  const std::string attempt_name = "attempt_" + std::to_string(attempt);
  fs::remove_all(log_.path / attempt_name);
  output_.clear();
  group_.beginAttempt(attempt);
  for (int local_rank = 0; local_rank < options_.nproc_per_node; ++local_rank) {
    Worker w;
    w.local_rank = local_rank;
    w.global_rank = world.rank_offset + local_rank;
    const fs::path dir =
        makeSubfolders(log_.path, {attempt_name, std::to_string(local_rank)}, log_.folder_mode);
    w.error_file = (dir / "error.json").string();
    // Always: a touch per micro-step costs about a microsecond, and `cxxlaunch status` shows
    // its age with or without --watchdog_timeout (docs/reliability.md).
    w.heartbeat_file = (dir / "heartbeat").string();
    const std::string prefix = world.num_nodes > 1
                                   ? "[rank " + std::to_string(world.node_rank) + ":" +
                                         std::to_string(w.global_rank) + "]: "
                                   : "[rank " + std::to_string(w.global_rank) + "]: ";
    std::array<std::unique_ptr<StreamSink>, 2> sinks;
    const std::array<const char*, 2> names = {"stdout.log", "stderr.log"};
    for (int s = 0; s < 2; ++s) {
      Console* console =
          options_.onConsole(local_rank, s == 0 ? StreamSpec::kOut : StreamSpec::kErr)
              ? &Console::of(s == 0 ? STDOUT_FILENO : STDERR_FILENO)
              : nullptr;
      sinks[static_cast<size_t>(s)] =
          std::make_unique<StreamSink>((dir / names[static_cast<size_t>(s)]).string(), console,
                                       prefix, s == 1 ? kStderrTailLines : 0, log_.file_mode);
    }
    SpawnSpec spec = spec_.of(w, world);
    const std::array<int, 2> pipes = group_.spawn(std::move(w), std::move(spec));
    output_.add(pipes[0], std::move(sinks[0]));
    output_.add(pipes[1], std::move(sinks[1]));
  }
}

// Joins on a helper thread so that a stop signal can cancel a join that waits for other nodes.
std::optional<WorldAssignment> Agent::joinInterruptibly(int& signal) {
  signal = 0;
  if (auto at_once = rendezvous_.joinAtOnce()) return at_once;
  std::optional<WorldAssignment> world;
  std::exception_ptr error;
  std::thread joiner([&] {
    try {
      world = rendezvous_.join();
    } catch (...) {
      error = std::current_exception();
    }
    monitor_.notify();
  });
  signal = monitor_.waitForStop(std::chrono::hours(24 * 365), true);
  if (signal != 0) {
    say("cxxlaunch: received " + signalName(signal) + " while joining\n");
    rendezvous_.cancelJoin();
  }
  joiner.join();
  monitor_.takeNews();
  if (signal != 0) return std::nullopt;
  if (error) std::rethrow_exception(error);
  return world;
}

// After this node's workers succeeded, while others still run: keep-alives go on until the run
// closes (kDone) or pulls this node into a restart.
std::optional<Decision> Agent::waitForPeers(int& signal) {
  rendezvous_.watch([this] { monitor_.notify(); });
  signal = monitor_.waitForStop(rendezvous_.exitBarrier(), true);
  rendezvous_.unwatch();
  const bool news = monitor_.takeNews();
  if (signal != 0) return std::nullopt;
  if (!news) {
    return Decision{Decision::Kind::kDone,
                    "other nodes did not finish within the exit barrier; leaving",
                    {},
                    {}};
  }
  return rendezvous_.news();
}

int Agent::finish(RunReport& report, const std::string& status, int exit_code) {
  report.status = status;
  report.exit_code = exit_code;
  report.confinement = group_.confinement();
  // Each local worker's last heartbeat record: its steps and step times (docs/observability.md).
  for (const Worker& w : group_.workers()) {
    if (auto r = readHeartbeatRecord(w.heartbeat_file)) {
      report.step_times.push_back({w.global_rank, r->steps, r->step_us, r->work_us});
    }
  }
  writeRunSummary((log_.path / "run-summary.json").string(), report, log_.file_mode);
  rendezvous_.finish();
  // The job is over; a console that does not take its last lines within the bound only loses
  // them from the screen.
  Console& out = Console::of(STDOUT_FILENO);
  Console& err = Console::of(STDERR_FILENO);
  const size_t unwritten = out.drain(kConsoleDrain) ? 0 : out.pending();
  if (unwritten > 0) {
    say("cxxlaunch: the console did not take the last " + std::to_string(unwritten) +
        " bytes of output within " + std::to_string(kConsoleDrain.count()) +
        " s; every byte is in the logs under " + log_.path.string() + "\n");
  }
  err.drain(kConsoleDrain);
  return exit_code;
}

// What the nodes decide after an attempt that ended on its own (not by a stop signal).
Decision Agent::decide(const AttemptResult& result, const WorldAssignment& world, int& signal) {
  using Outcome = AttemptResult::Outcome;
  switch (result.outcome) {
    case Outcome::kNews:
      return result.news;
    case Outcome::kFailed: {
      const Failure& root = rootCause(result.failures);
      Decision decision = rendezvous_.workersFailed(
          root.global_rank, root.processExitCode(),
          "rank " + std::to_string(root.global_rank) + " " + root.statusText());
      if (decision.kind == Decision::Kind::kRestart) {
        decision.reason = "rank " + std::to_string(root.global_rank) + " failed (" +
                          root.statusText() + "); restarting all workers (restart " +
                          std::to_string(world.restart_count + 1) + " of " +
                          std::to_string(options_.max_restarts) + ")";
      }
      return decision;
    }
    case Outcome::kSucceeded:
    case Outcome::kInterrupted:
      break;
  }
  Decision decision = rendezvous_.workersSucceeded();
  if (decision.kind == Decision::Kind::kWait) {
    if (auto after = waitForPeers(signal)) return *after;
  }
  return decision;
}

// 1. Join a round of the rendezvous (interruptible by a stop signal).
// 2. Start this node's workers with the round's world, and monitor them until they are gone.
// 3. Tell the rendezvous how they ended; it decides for every node: restart (back to 1), done,
//    or failed (the root cause's table and exit code). A stop signal ends the job at any step
//    as interrupted, 128 + the signal.
int Agent::run() {
  ::signal(SIGPIPE, SIG_IGN);  // a closed console must not kill the agent
  RunReport report;
  report.run_id = options_.run_id;
  report.program = options_.program;
  report.args = options_.args;
  report.max_restarts = options_.max_restarts;
  report.log_dir = log_.path.string();
  for (int attempt = 0;; ++attempt) {
    int signal = 0;
    const auto world = joinInterruptibly(signal);
    if (!world) return finish(report, "interrupted", 128 + signal);
    report.world_size = world->world_size;
    report.restarts = world->restart_count;
    startWorkers(attempt, *world);
    rendezvous_.watch([this] { monitor_.notify(); });
    AttemptResult result = monitor_.run(group_, output_);
    rendezvous_.unwatch();
    if (result.outcome == AttemptResult::Outcome::kInterrupted) {
      return finish(report, "interrupted", 128 + result.signal);
    }
    const Decision decision = decide(result, *world, signal);
    if (signal != 0) return finish(report, "interrupted", 128 + signal);

    switch (decision.kind) {
      case Decision::Kind::kRestart:
        say("cxxlaunch: " + decision.reason + "\n");
        continue;
      case Decision::Kind::kDone:
      case Decision::Kind::kWait:
        if (!decision.reason.empty() && result.outcome == AttemptResult::Outcome::kSucceeded &&
            decision.reason != "every node finished") {
          say("cxxlaunch: " + decision.reason + "\n");
        }
        return finish(report, "succeeded", kExitOk);
      case Decision::Kind::kFail: {
        report.failures = std::move(result.failures);
        int exit_code = decision.remote_exit_code.value_or(
            report.failures.empty() ? kExitInternal : rootCause(report.failures).processExitCode());
        if (exit_code == 0) exit_code = kExitInternal;
        if (!report.failures.empty()) say(formatFailureTable(report));
        if (!decision.remote_description.empty()) {
          say("cxxlaunch: the job failed: " + decision.remote_description + "\n");
        } else if (report.failures.empty()) {
          say("cxxlaunch: the job failed: " + decision.reason + "\n");
        }
        return finish(report, "failed", exit_code);
      }
    }
  }
}

}  // namespace

void blockAgentSignals() { blockMonitoredSignals(); }

int runAgent(const LaunchOptions& options, NodeRendezvous& rendezvous) {
  Agent agent(options, rendezvous);
  return agent.run();
}

}  // namespace cxxlaunch::launcher
