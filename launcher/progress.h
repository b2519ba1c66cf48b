#pragma once
// The run's progress as the launcher shows it (docs/observability.md): the local workers'
// heartbeat records (common/heartbeat_record.h) folded into one line, either the live line at
// the bottom of a terminal or, on anything else, a plain line now and then; and the straggler
// rule that `cxxlaunch status` and the run summary apply to the workers' step times.
//
// Single-threaded: the node agent owns the meter and feeds it from its event loop.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "common/heartbeat_record.h"
#include "launcher/options.h"

namespace cxxlaunch::launcher {

ProgressMode parseProgressMode(const std::string& text);  // "auto", "on", "off"

struct RankRecord {
  int rank = 0;
  HeartbeatRecord record;
};

class ProgressMeter {
 public:
  using Clock = std::chrono::steady_clock;
  // Steps per second are measured over this much of the recent past.
  static constexpr std::chrono::seconds kRateWindow{30};

  // The records the workers have now (those that have one). Steps done are the slowest rank's,
  // the total the largest any rank gave, the loss the lowest rank's that has one.
  void update(const std::vector<RankRecord>& records, Clock::time_point now);
  // A restart: the steps may start again from a checkpoint's, and the rate is measured afresh.
  void restart() { samples_.clear(); }
  bool started() const { return !samples_.empty(); }

  int64_t steps() const { return steps_; }
  int64_t total() const { return total_; }
  std::optional<double> stepsPerSecond() const;

  // "step 120/600 [####                ] 20%  14.3 steps/s  ETA 0:34  loss 0.4312", cut to
  // `width` columns (a terminal's; a wider line would wrap and break the redraw).
  std::string line(size_t width) const;
  // For a console that is not a terminal: the line to print now, or "". One for every tenth of
  // the total (and the last step), or every kPlainEvery without a total.
  std::string plainLine(Clock::time_point now);
  static constexpr std::chrono::seconds kPlainEvery{30};

 private:
  struct Sample {
    Clock::time_point at;
    int64_t steps;
  };
  std::deque<Sample> samples_;
  int64_t steps_ = 0;
  int64_t total_ = 0;
  std::optional<double> loss_;
  int64_t plain_tenths_ = -1;  // of the total, last printed
  std::optional<Clock::time_point> plain_at_;
};

// "0:34", "12:05", "3:02:11".
std::string formatDuration(double seconds);

// A rank is a straggler when its work per step is more than kSlowFactor times the median of the
// ranks' (those that report one; at least two needed). Returns one flag per entry of `work`,
// where 0 means "no report".
inline constexpr double kSlowFactor = 1.25;
std::vector<bool> stragglers(const std::vector<int64_t>& work);

}  // namespace cxxlaunch::launcher
