#include "launcher/progress.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/error.h"

namespace cxxlaunch::launcher {

ProgressMode parseProgressMode(const std::string& text) {
  if (text == "auto") return ProgressMode::kAuto;
  if (text == "on") return ProgressMode::kOn;
  if (text == "off") return ProgressMode::kOff;
  throw InvalidArgument("progress '" + text + "': give auto, on or off");
}

void ProgressMeter::update(const std::vector<RankRecord>& records, Clock::time_point now) {
  if (records.empty()) return;
  int64_t steps = records.front().record.steps, total = 0;
  std::optional<double> loss;
  int loss_rank = 0;
  for (const auto& [rank, r] : records) {
    steps = std::min(steps, r.steps);
    total = std::max(total, r.total);
    if (r.loss && (!loss || rank < loss_rank)) {
      loss = r.loss;
      loss_rank = rank;
    }
  }
  if (!samples_.empty() && steps < samples_.back().steps) samples_.clear();  // resumed earlier
  steps_ = steps;
  total_ = total;
  if (loss) loss_ = loss;
  // Once the run is through its total the rate stays as it was, not falling while the workers
  // finish.
  if (total > 0 && !samples_.empty() && samples_.back().steps >= total) return;
  samples_.push_back({now, steps});
  while (samples_.size() > 2 && now - samples_[1].at >= kRateWindow) samples_.pop_front();
}

std::optional<double> ProgressMeter::stepsPerSecond() const {
  if (samples_.size() < 2) return std::nullopt;
  const Sample &first = samples_.front(), &last = samples_.back();
  const double seconds = std::chrono::duration<double>(last.at - first.at).count();
  if (seconds <= 0 || last.steps == first.steps) return std::nullopt;
  return static_cast<double>(last.steps - first.steps) / seconds;
}

std::string formatDuration(double seconds) {
  const auto s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  char text[48];
  if (s >= 3600) {
    std::snprintf(text, sizeof(text), "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(text, sizeof(text), "%lld:%02lld", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  }
  return text;
}

namespace {

// The parts after the count: rate, ETA, loss.
std::string details(std::optional<double> rate, int64_t steps, int64_t total,
                    std::optional<double> loss) {
  std::string out;
  char text[96];
  if (rate) {
    std::snprintf(text, sizeof(text), "  %.3g steps/s", *rate);
    out += text;
    if (total > steps) out += "  ETA " + formatDuration(static_cast<double>(total - steps) / *rate);
  }
  if (loss) {
    std::snprintf(text, sizeof(text), "  loss %.4g", *loss);
    out += text;
  }
  return out;
}

}  // namespace

std::string ProgressMeter::line(size_t width) const {
  std::string out = "step " + std::to_string(steps_);
  if (total_ > 0) {
    constexpr int64_t kBar = 20;
    const int64_t done = std::min(steps_, total_);
    const auto filled = static_cast<size_t>(done * kBar / total_);
    out += "/" + std::to_string(total_) + " [" + std::string(filled, '#') +
           std::string(kBar - filled, ' ') + "] " + std::to_string(done * 100 / total_) + "%";
  }
  out += details(stepsPerSecond(), steps_, total_, loss_);
  if (out.size() > width) out.resize(width);
  return out;
}

std::string ProgressMeter::plainLine(Clock::time_point now) {
  if (!started()) return "";
  if (total_ > 0) {
    const int64_t tenths = std::min<int64_t>(10, steps_ * 10 / total_);
    if (tenths <= plain_tenths_) return "";
    plain_tenths_ = tenths;
  } else {
    if (plain_at_ && now - *plain_at_ < kPlainEvery) return "";
    plain_at_ = now;
  }
  std::string out = "cxxlaunch: step " + std::to_string(steps_);
  if (total_ > 0) {
    out += "/" + std::to_string(total_) + " (" +
           std::to_string(std::min<int64_t>(100, steps_ * 100 / total_)) + "%)";
  }
  return out + details(stepsPerSecond(), steps_, total_, loss_) + "\n";
}

std::vector<bool> stragglers(const std::vector<int64_t>& work) {
  std::vector<int64_t> reported;
  for (int64_t w : work) {
    if (w > 0) reported.push_back(w);
  }
  std::vector<bool> slow(work.size(), false);
  if (reported.size() < 2) return slow;
  std::sort(reported.begin(), reported.end());
  const size_t n = reported.size();
  const double median =
      n % 2 == 1
          ? static_cast<double>(reported[n / 2])
          : (static_cast<double>(reported[n / 2 - 1]) + static_cast<double>(reported[n / 2])) / 2;
  for (size_t i = 0; i < work.size(); ++i) {
    slow[i] = work[i] > 0 && static_cast<double>(work[i]) > kSlowFactor * median;
  }
  return slow;
}

}  // namespace cxxlaunch::launcher
