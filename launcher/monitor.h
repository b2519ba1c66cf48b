#pragma once
// Monitor: the agent's event loop, torch.distributed.elastic's monitor loop without the polling.
// One attempt runs from the workers' start to the exit of the last of them in one epoll loop
// that waits on
//  - their exits (SIGCHLD, read from a signalfd),
//  - their output (OutputMux::fd),
//  - the signals the agent forwards to them: SIGINT, SIGTERM, SIGHUP and SIGQUIT also stop the
//    job, SIGUSR1 and SIGUSR2 are only passed on,
//  - the end of the shutdown grace (a timerfd: SIGKILL to the workers),
//  - news from the rendezvous (an eventfd another thread writes through notify()),
//  - with --watchdog_timeout, a periodic look at the workers' heartbeats, and with a progress
//    display, a periodic read of their records.
// The first worker to fail (or a stop signal, a stalled heartbeat, news) stops the group:
// SIGTERM to every worker's process group, SIGKILL when the grace ends or at a second stop.
// When the workers are gone, whatever they started goes too (WorkerGroup::stopLeftovers) and
// their pipes are read to the end.
//
// Thread-safety: notify() from any thread; everything else from the agent's thread.

#include <chrono>
#include <optional>
#include <vector>

#include "launcher/failure.h"
#include "launcher/node_rendezvous.h"
#include "launcher/options.h"
#include "launcher/output_mux.h"
#include "launcher/progress.h"
#include "launcher/worker_group.h"

namespace cxxlaunch::launcher {

// The signals the agent handles (SIGCHLD and the forwarded ones), blocked in the thread that
// calls it and in the threads it starts later: see blockAgentSignals (agent.h).
void blockMonitoredSignals();

struct AttemptResult {
  enum class Outcome { kSucceeded, kFailed, kInterrupted, kNews };
  Outcome outcome = Outcome::kSucceeded;
  std::vector<Failure> failures;  // kFailed: each failed worker, as seen
  int signal = 0;                 // kInterrupted: the stop signal
  Decision news;                  // kNews: what the rendezvous said
};

class Monitor {
 public:
  // Blocks the monitored signals (blockMonitoredSignals) and opens the loop's descriptors.
  // Throws SystemError.
  Monitor(const LaunchOptions& options, NodeRendezvous& rendezvous);
  ~Monitor();
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  // Runs the attempt whose workers `group` has just started, their streams in `output` (worker
  // i's stdout and stderr are streams 2i and 2i + 1), until every one of them has exited.
  // Publishes the workers to the rendezvous as they start and exit (cxxlaunch status).
  AttemptResult run(WorkerGroup& group, OutputMux& output);

  // The rendezvous has news (or a join has finished): wakes run() or waitForStop(). Any thread.
  void notify();
  // Whether notify() was called since the last call; clears it.
  bool takeNews();
  // Outside run(): waits up to `timeout` for a stop signal, returned, or (with `news_too`) for
  // notify(), which returns 0 as the timeout does. Reaps exits meanwhile; SIGUSR1/2 have no
  // worker to reach and are dropped.
  int waitForStop(std::chrono::milliseconds timeout, bool news_too);

 private:
  void onSignal(WorkerGroup& group, OutputMux& output, AttemptResult& result);
  void onExits(WorkerGroup& group, OutputMux& output, const std::vector<WorkerExit>& exits,
               AttemptResult& result);
  void checkHeartbeats(WorkerGroup& group, OutputMux& output, AttemptResult& result);
  void showProgress(const WorkerGroup& group);
  void stop(WorkerGroup& group, int sig);
  void publish(const WorkerGroup& group);

  const LaunchOptions& options_;
  NodeRendezvous& rendezvous_;
  std::string host_;
  int epoll_fd_ = -1;
  int signal_fd_ = -1;
  int grace_fd_ = -1;      // timerfd: the shutdown grace
  int news_fd_ = -1;       // eventfd: notify()
  int heartbeat_fd_ = -1;  // timerfd, with --watchdog_timeout
  int progress_fd_ = -1;   // timerfd, with a progress display
  enum class ProgressDisplay { kNone, kLiveLine, kPlainLines };
  ProgressDisplay progress_display_ = ProgressDisplay::kNone;
  ProgressMeter progress_;
  bool stopping_ = false;
  std::optional<std::chrono::steady_clock::time_point> kill_at_;  // when the grace ends
};

}  // namespace cxxlaunch::launcher
