#pragma once
// Heartbeat: this worker's sign of life for the launcher's --watchdog_timeout. The launcher names
// a file (CXXLAUNCH_HEARTBEAT_FILE); beat() sets its time to now, creating it the first time, so
// a worker is watched from its first beat on (not while it loads data before training). The
// runtime beats at every micro-step and, while a collective waits for its peers, every second:
// a rank that waits for a stalled one keeps beating, and only the stalled one goes silent.
// The launcher always names a file (`cxxlaunch status` shows each worker's last progress); a
// beat touches it at most every 100 ms, so a log folder on a network file system costs a
// micro-step nothing measurable either (about 1 us per touch on a local disk).
//
// Thread-safety: beat() may be called from any thread.

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

namespace cxxlaunch::runtime {

class Heartbeat {
 public:
  explicit Heartbeat(std::string path) : path_(std::move(path)) {}
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  void beat();
  bool watched() const { return !path_.empty(); }  // the launcher asked for beats

 private:
  const std::string path_;  // "": nobody watches, beat() does nothing
  std::mutex mu_;
  int fd_ = -1;
  std::chrono::steady_clock::time_point last_;  // of the last touch
};

}  // namespace cxxlaunch::runtime
