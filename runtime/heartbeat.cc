#include "runtime/heartbeat.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace cxxlaunch::runtime {

Heartbeat::~Heartbeat() {
  if (!path_.empty() && unwritten_) {
    std::lock_guard<std::mutex> lock(mu_);
    write();
  }
  if (fd_ != -1) ::close(fd_);
}

void Heartbeat::beat() {
  if (path_.empty()) return;
  constexpr auto kEvery = std::chrono::milliseconds(100);  // far below any timeout that watches
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ != -1 && now - last_ < kEvery) return;
  write();
  last_ = now;
}

void Heartbeat::write() {
  if (fd_ == -1) fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_TRUNC, 0644);
  if (fd_ == -1) return;  // a failed touch only costs the watch a beat
  if (progress_) {
    // The rewrite sets the file's time too: one system call either way.
    const std::string line = formatHeartbeatRecord(record_);
    if (::pwrite(fd_, line.data(), line.size(), 0) == static_cast<ssize_t>(line.size())) {
      unwritten_ = false;
    }
  } else {
    ::futimens(fd_, nullptr);
  }
}

void Heartbeat::stepDone(int64_t steps, std::chrono::nanoseconds peer_wait) {
  if (path_.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  // The first step only starts the clock: its time holds the start-up (the first forward, and
  // for the waits, prepare's broadcasts before it).
  if (step_start_ != std::chrono::steady_clock::time_point()) {
    const auto step = now - step_start_;
    const auto work = std::max(std::chrono::nanoseconds(0), step - (peer_wait - wait_at_start_));
    window_.emplace_back(step, work);
    if (window_.size() > kStepWindow) window_.pop_front();
    std::chrono::nanoseconds step_sum{0}, work_sum{0};
    for (const auto& [s, w] : window_) {
      step_sum += s;
      work_sum += w;
    }
    const auto n = static_cast<int64_t>(window_.size());
    record_.step_us = std::chrono::duration_cast<std::chrono::microseconds>(step_sum).count() / n;
    record_.work_us = std::chrono::duration_cast<std::chrono::microseconds>(work_sum).count() / n;
  }
  step_start_ = now;
  wait_at_start_ = peer_wait;
  record_.steps = steps;
  progress_ = unwritten_ = true;
  // The last step is written at once: the launcher's line ends at the total, not short of it.
  if (record_.total > 0 && steps == record_.total) {
    write();
    last_ = now;
  }
}

void Heartbeat::setTotalSteps(int64_t total) {
  std::lock_guard<std::mutex> lock(mu_);
  record_.total = std::max<int64_t>(0, total);
  progress_ = unwritten_ = true;
}

void Heartbeat::setLoss(double loss) {
  std::lock_guard<std::mutex> lock(mu_);
  record_.loss = loss;
  progress_ = unwritten_ = true;
}

HeartbeatRecord Heartbeat::record() const {
  std::lock_guard<std::mutex> lock(mu_);
  return record_;
}

}  // namespace cxxlaunch::runtime
