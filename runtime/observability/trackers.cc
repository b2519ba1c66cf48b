#include "runtime/observability/trackers.h"

#include <sys/stat.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/error.h"
#include "runtime/observability/event_file.h"
#include "runtime/observability/report.h"

namespace cxxlaunch::runtime {
namespace {

double wallTime() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A file a tracker appends lines to; each write goes to the kernel at once.
class LineFile {
 public:
  explicit LineFile(const std::string& path) : path_(path), out_(path, std::ios::app) {
    if (!out_) throw SystemError("open " + path, errno);
  }
  void write(const std::string& lines) {
    out_ << lines << std::flush;
    if (!out_) throw SystemError("write " + path_, errno);
  }
  bool empty() const {
    struct stat st {};
    return ::stat(path_.c_str(), &st) != 0 || st.st_size == 0;
  }

 private:
  std::string path_;
  std::ofstream out_;
};

std::string csvField(const std::string& text) {
  if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
  std::string quoted = "\"";
  for (const char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

class CsvTracker final : public Tracker {
 public:
  explicit CsvTracker(const std::string& dir) : file_(dir + "/metrics.csv") {
    if (file_.empty()) file_.write("step,wall_time,name,value\n");
  }
  void log(const Scalars& scalars, int64_t step, double wall_time) override {
    std::string rows;
    for (const auto& [name, value] : scalars) {
      rows += std::to_string(step) + "," + formatNumber(wall_time) + "," + csvField(name) + "," +
              formatNumber(value) + "\n";
    }
    file_.write(rows);
  }

 private:
  LineFile file_;
};

class JsonlTracker final : public Tracker {
 public:
  explicit JsonlTracker(const std::string& dir) : file_(dir + "/metrics.jsonl") {}
  void log(const Scalars& scalars, int64_t step, double wall_time) override {
    // Written by hand to keep the log's order; JSON has no NaN or infinity: those are null.
    std::string line =
        "{\"step\":" + std::to_string(step) + ",\"wall_time\":" + formatNumber(wall_time);
    for (const auto& [name, value] : scalars) {
      line += "," + nlohmann::json(name).dump() + ":" +
              (std::isfinite(value) ? formatNumber(value) : "null");
    }
    file_.write(line + "}\n");
  }

 private:
  LineFile file_;
};

class TensorBoardTracker final : public Tracker {
 public:
  explicit TensorBoardTracker(const std::string& dir) : writer_(dir) {}
  void log(const Scalars& scalars, int64_t step, double wall_time) override {
    writer_.writeScalars(wall_time, step, scalars);
  }

 private:
  EventFileWriter writer_;
};

// mkdir -p, naming the folder that could not be made.
void makeFolders(const std::string& path) {
  for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    const std::string prefix = path.substr(0, slash);
    if (!prefix.empty() && ::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      throw SystemError("mkdir " + prefix, errno);
    }
    if (slash == std::string::npos) break;
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw SystemError("stat " + path, errno);
  if (!S_ISDIR(st.st_mode)) throw SystemError("mkdir " + path, ENOTDIR);
}

}  // namespace

ConfigValue::ConfigValue(long long number) : text_(std::to_string(number)), kind_(Kind::kNumber) {}
ConfigValue::ConfigValue(unsigned long long number)
    : text_(std::to_string(number)), kind_(Kind::kNumber) {}
ConfigValue::ConfigValue(double number)
    : text_(formatNumber(number)), kind_(std::isfinite(number) ? Kind::kNumber : Kind::kText) {}

std::string ConfigValue::json() const {
  return kind_ == Kind::kText ? nlohmann::json(text_).dump() : text_;
}

std::string formatNumber(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char text[32];
  const auto result = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, result.ptr);
}

struct Trackers::History {
  double started = wallTime();
  int64_t logs = 0;
  std::vector<ReportSeries> series;
  std::map<std::string, size_t> index;  // name -> its place in `series`
};

Trackers::Trackers(TrackerOptions options, RunConfig config, RunConfig summary)
    : options_(std::move(options)),
      config_(std::move(config)),
      summary_(std::move(summary)),
      history_(std::make_unique<History>()) {
  if (options_.project_dir.empty()) {
    throw InvalidArgument(
        "trackers need a project folder to write into: launch with --project_dir DIR (or "
        "CXXLAUNCH_PROJECT_DIR, cxxlaunch.project_dir in the config, or "
        "AcceleratorOptions::project_dir)");
  }
  const auto& run = options_.run_name;
  if (run.empty() || run == "." || run == ".." || run.find('/') != std::string::npos) {
    throw InvalidArgument("initTrackers: the run name '" + run +
                          "' is not a folder name; give one without '/' (e.g. \"run1\")");
  }
  if (options_.report_every < 1) {
    throw InvalidArgument("the report's interval must be at least 1 log, not " +
                          std::to_string(options_.report_every));
  }
  run_dir_ = options_.project_dir + "/" + run;
  try {
    makeFolders(run_dir_);
    for (const auto& name : options_.trackers) {
      if (name == "tensorboard")
        trackers_.push_back(std::make_unique<TensorBoardTracker>(run_dir_));
      if (name == "csv") trackers_.push_back(std::make_unique<CsvTracker>(run_dir_));
      if (name == "jsonl") trackers_.push_back(std::make_unique<JsonlTracker>(run_dir_));
    }
    std::string json = "{";
    for (size_t i = 0; i < config_.size(); ++i) {
      json += (i ? ",\n  " : "\n  ") + nlohmann::json(config_[i].first).dump() + ": " +
              config_[i].second.json();
    }
    writeFileAtomically(run_dir_ + "/config.json", json + "\n}\n", Durability::kProcessCrash);
    writeReport(false);
  } catch (const SystemError& e) {
    throw InvalidArgument("the project folder '" + options_.project_dir + "' cannot be written (" +
                          e.what() +
                          "): give a folder this user can create and write with --project_dir "
                          "(or CXXLAUNCH_PROJECT_DIR, cxxlaunch.project_dir)");
  }
}

Trackers::~Trackers() {
  if (finished_) return;
  try {
    finish();
  } catch (const std::exception& e) {
    std::cerr << "cxxlaunch: warning: the final report could not be written: " << e.what() << "\n";
  }
}

void Trackers::log(const Scalars& scalars, int64_t step) {
  for (const auto& [name, value] : scalars) {
    if (name.empty() || name == "step" || name == "wall_time") {
      throw InvalidArgument("log: '" + name +
                            "' cannot name a value (empty, or a column of its own: step, "
                            "wall_time); give it another name");
    }
  }
  const double now = wallTime();
  for (const auto& tracker : trackers_) tracker->log(scalars, step, now);
  auto& h = *history_;
  ++h.logs;
  for (const auto& [name, value] : scalars) {
    auto [it, added] = h.index.emplace(name, h.series.size());
    if (added) h.series.push_back({name, {}});
    h.series[it->second].points.emplace_back(step, value);
  }
  if (++logs_since_report_ >= options_.report_every) writeReport(false);
}

void Trackers::finish() {
  finished_ = true;
  writeReport(true);
}

void Trackers::writeReport(bool finished) {
  logs_since_report_ = 0;
  ReportContent content;
  content.run_name = options_.run_name;
  content.finished = finished;
  content.started = history_->started;
  content.updated = wallTime();
  content.logs = history_->logs;
  content.summary = summary_;
  content.summary.emplace_back("trackers", [this] {
    std::string list;
    for (const auto& t : options_.trackers) list += (list.empty() ? "" : ", ") + t;
    return list.empty() ? std::string("none (the report only)") : list;
  }());
  content.summary.emplace_back("run folder", run_dir_);
  content.config = config_;
  content.series = history_->series;
  writeFileAtomically(reportPath(), renderReport(content), Durability::kProcessCrash);
}

}  // namespace cxxlaunch::runtime
