#pragma once
// Heartbeat: this worker's sign of life for the launcher's --watchdog_timeout, and its progress
// for the launcher's progress line and `cxxlaunch status`. The launcher names a file
// (CXXLAUNCH_HEARTBEAT_FILE); beat() sets its time to now, creating it the first time, so a
// worker is watched from its first beat on (not while it loads data before training). The
// runtime beats at every micro-step and, while a collective waits for its peers, every second:
// a rank that waits for a stalled one keeps beating, and only the stalled one goes silent.
// The launcher always names a file (`cxxlaunch status` shows each worker's last progress); a
// beat touches it at most every 100 ms, so a log folder on a network file system costs a
// micro-step nothing measurable either (about 1 us per touch on a local disk).
//
// Once a step is done the touch is a rewrite of the file's progress record instead
// (common/heartbeat_record.h: steps done of the total, the latest loss, the mean step time over
// the last kStepWindow steps), still at most every 100 ms, and at once for the last step.
//
// Thread-safety: every method may be called from any thread.

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "common/heartbeat_record.h"

namespace cxxlaunch::runtime {

class Heartbeat {
 public:
  // Steps the mean step time is taken over.
  static constexpr size_t kStepWindow = 20;

  explicit Heartbeat(std::string path) : path_(std::move(path)) {}
  ~Heartbeat();  // writes a record not written yet
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  void beat();
  bool watched() const { return !path_.empty(); }  // the launcher asked for beats

  // A training step ended; `steps` done in all; `peer_wait`: the training thread's time spent
  // waiting in collectives so far (collectiveWaitOnThisThread()), left out of the work time.
  void stepDone(int64_t steps, std::chrono::nanoseconds peer_wait);
  void setTotalSteps(int64_t total);  // 0: unknown
  void setLoss(double loss);
  HeartbeatRecord record() const;  // what the next write holds

 private:
  void write();  // mu_ held

  const std::string path_;  // "": nobody watches, beat() does nothing
  mutable std::mutex mu_;
  int fd_ = -1;
  std::chrono::steady_clock::time_point last_;  // of the last touch
  HeartbeatRecord record_;
  bool progress_ = false;   // a record exists (a step ended, or a total or loss was set)
  bool unwritten_ = false;  // record_ changed since the last write
  std::chrono::steady_clock::time_point step_start_;  // of the step running; unset: none yet
  std::chrono::nanoseconds wait_at_start_{0};
  std::deque<std::pair<std::chrono::nanoseconds, std::chrono::nanoseconds>> window_;  // step, work
};

}  // namespace cxxlaunch::runtime
