#pragma once
// Trackers: where Accelerator::log's scalars go (accelerate's log_with). Each tracker writes its
// file in the run's folder, <project_dir>/<run_name>/:
//   tensorboard  events.out.tfevents.<seconds>.<host>  (event_file.h; TensorBoard reads it)
//   csv          metrics.csv    one row per value: step,wall_time,name,value
//   jsonl        metrics.jsonl  one object per log: {"step":..,"wall_time":..,"<name>":value,..}
// besides config.json (the run's config) and, whenever any tracker is on, the HTML report
// <project_dir>/report.html (report.h), rewritten every `report_every` logs and at finish().
// Every file is written as the values come, so a crashed run keeps what it logged.
//
// The Accelerator keeps one Trackers on the main process only. No LibTorch here.
// Thread-safety: one thread.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/reports.h"

namespace cxxlaunch::runtime {

// The shortest decimal text that reads back as `value` ("nan", "inf", "-inf" for those).
std::string formatNumber(double value);

struct TrackerOptions {
  std::vector<std::string> trackers;  // from parseTrackerList (common/tracker_names.h)
  std::string project_dir;            // must be given when `trackers` is not empty
  std::string run_name;               // a folder name: no '/', not "." or ".."
  int report_every = 10;              // logs between rewrites of report.html
};

// One destination of the scalars.
class Tracker {
 public:
  virtual ~Tracker() = default;
  virtual void log(const Scalars& scalars, int64_t step, double wall_time) = 0;
};

class Trackers {
 public:
  // Creates the project and run folders if needed, opens every tracker's file, writes
  // config.json and a first report. Throws InvalidArgument naming the folder (and what to do)
  // when it cannot be created or written, a run name that is no folder name, or no project folder.
  // `summary` holds facts about the run the report shows (world size, strategy, host...).
  Trackers(TrackerOptions options, RunConfig config, RunConfig summary);
  ~Trackers();  // finish(), if not done, warning on stderr instead of throwing
  Trackers(const Trackers&) = delete;
  Trackers& operator=(const Trackers&) = delete;

  // Writes `scalars` at `step` to every tracker. Throws InvalidArgument for an empty name or
  // one of the reserved columns ("step", "wall_time"), before anything is written.
  void log(const Scalars& scalars, int64_t step);
  // The last report (status "finished"). Later logs still write.
  void finish();

  const std::string& runDir() const { return run_dir_; }
  std::string reportPath() const { return options_.project_dir + "/report.html"; }

 private:
  void writeReport(bool finished);

  struct History;  // every logged value, for the report
  TrackerOptions options_;
  RunConfig config_, summary_;
  std::string run_dir_;
  std::vector<std::unique_ptr<Tracker>> trackers_;
  std::unique_ptr<History> history_;
  int logs_since_report_ = 0;
  bool finished_ = false;
};

}  // namespace cxxlaunch::runtime
