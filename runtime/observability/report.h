#pragma once
// The HTML report of a run (report.html in the project folder): one self-contained page (inline
// CSS and SVG, no script, nothing fetched) with the run's summary, a plot of every logged scalar
// against the step, each scalar's last, smallest and largest value, and the config table.
// Opens in any browser, from a file, offline.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/observability/trackers.h"

namespace cxxlaunch::runtime {

struct ReportSeries {
  std::string name;
  std::vector<std::pair<int64_t, double>> points;  // (step, value), in logging order
};

struct ReportContent {
  std::string run_name;
  bool finished = false;
  double started = 0, updated = 0;  // wall times, seconds since the epoch
  int64_t logs = 0;
  RunConfig summary;  // facts about the run: world size, strategy, host...
  RunConfig config;   // what initTrackers was given
  std::vector<ReportSeries> series;
};

std::string renderReport(const ReportContent& content);

// One series as an SVG line plot, `width` x `height` pixels, with labelled axes. Values that are
// not finite break the line; a series of at most 50 values has a marker on each; a series of
// thousands of points is drawn from at most ~2000 of them (each kept point the extreme of its
// stretch, so spikes stay visible).
std::string svgPlot(const ReportSeries& series, int width, int height);

// `text` with HTML's special characters escaped, and bytes that are not UTF-8 written as \xHH.
std::string htmlEscape(const std::string& text);

}  // namespace cxxlaunch::runtime
