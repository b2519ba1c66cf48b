#include "runtime/observability/trackers.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>

#include "common/error.h"
#include "common/private_folder.h"
#include "common/utf8.h"
#include "runtime/observability/event_file.h"
#include "runtime/observability/report.h"

namespace cxxlaunch::runtime {
namespace {

double wallTime() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A file a tracker appends lines to, in the run folder `dir` (open, checked): never through a
// symlink, never a FIFO (common/private_folder.h). Each write goes to the kernel at once.
class LineFile {
 public:
  LineFile(int dir, const std::string& dir_path, const std::string& name)
      : path_(dir_path + "/" + name),
        fd_(openFileAt(dir, name, O_WRONLY | O_APPEND | O_CREAT, 0644, path_)) {}
  void write(const std::string& lines) { writeAll(fd_.get(), lines, path_); }
  bool empty() const {
    struct stat st {};
    return ::fstat(fd_.get(), &st) != 0 || st.st_size == 0;
  }

 private:
  std::string path_;
  UniqueFd fd_;
};

// A cell of the CSV's text column.
std::string csvTextCell(const std::string& text) {
  // OWASP's CSV injection guidance: a spreadsheet runs a cell that starts with one of these as a
  // formula; a leading single quote, inside double quotes, makes it text. A ';' is another
  // locale's separator: unquoted, what follows it would start a cell.
  const bool formula =
      !text.empty() && std::string_view("=+-@\t\r").find(text[0]) != std::string::npos;
  if (!formula && text.find_first_of(",;\"\n\r") == std::string::npos) return text;
  std::string quoted = formula ? "\"'" : "\"";
  for (const char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

class CsvTracker final : public Tracker {
 public:
  CsvTracker(int dir, const std::string& dir_path) : file_(dir, dir_path, "metrics.csv") {
    if (file_.empty()) file_.write("step,wall_time,name,value\n");
  }
  void log(const Scalars& scalars, int64_t step, double wall_time) override {
    // The name is the one text column; step, wall_time and value are numbers formatted here
    // (formatNumber: digits, '.', 'e', a leading '-', nan, inf), left as they are.
    std::string rows;
    for (const auto& [name, value] : scalars) {
      rows += std::to_string(step) + "," + formatNumber(wall_time) + "," + csvTextCell(name) + "," +
              formatNumber(value) + "\n";
    }
    file_.write(rows);
  }

 private:
  LineFile file_;
};

class JsonlTracker final : public Tracker {
 public:
  JsonlTracker(int dir, const std::string& dir_path) : file_(dir, dir_path, "metrics.jsonl") {}
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
  TensorBoardTracker(int dir, const std::string& dir_path) : writer_(dir, dir_path) {}
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

const char* const kWhereProject = "--project_dir (or CXXLAUNCH_PROJECT_DIR, cxxlaunch.project_dir)";

// The project folder: the user's path, made as needed and followed as given (symlinks in it are
// the user's choice, as --log_dir's are), then used only when it is ours and no one else may
// write it: anyone who can write it can put a symlink under the name of a file this run writes.
UniqueFd openProjectFolder(const std::string& path) {
  makeFolders(path);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) throw SystemError("open " + path, errno);
  if (const std::string why = whyNotPrivate(fd.get()); !why.empty()) {
    throw InvalidArgument("the project folder '" + path + "' is " + why +
                          ": refusing to write there, as another user could turn this run's "
                          "writes onto a file of their choice; give a folder of your own that "
                          "only you can write (chmod go-w) with " +
                          kWhereProject);
  }
  return fd;
}

}  // namespace

ConfigValue::ConfigValue(long long number) : text_(std::to_string(number)), kind_(Kind::kNumber) {}
ConfigValue::ConfigValue(unsigned long long number)
    : text_(std::to_string(number)), kind_(Kind::kNumber) {}
ConfigValue::ConfigValue(double number)
    : text_(formatNumber(number)), kind_(std::isfinite(number) ? Kind::kNumber : Kind::kText) {}

std::string ConfigValue::json() const {
  // A path or an argument need not be UTF-8, and JSON must be (nlohmann throws).
  return kind_ == Kind::kText ? nlohmann::json(backslashReplaceInvalidUtf8(text_)).dump() : text_;
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
  // Not history, but kept here with it to leave trackers.h as it is: the project and run folders,
  // opened and checked once. Every file is written through them, so that a folder renamed or
  // replaced by a symlink after the check changes nothing.
  UniqueFd project, run;
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
    history_->project = openProjectFolder(options_.project_dir);
    PrivateFolder run_folder = openPrivateFolder(history_->project.get(), run, 0755, run_dir_);
    if (!run_folder.why.empty()) {
      throw InvalidArgument("the run folder '" + run_dir_ + "' is " + run_folder.why +
                            ": refusing to write there; remove it, or give another run name or " +
                            kWhereProject);
    }
    history_->run = std::move(run_folder.fd);
    const int dir = history_->run.get();
    for (const auto& name : options_.trackers) {
      if (name == "tensorboard") {
        trackers_.push_back(std::make_unique<TensorBoardTracker>(dir, run_dir_));
      }
      if (name == "csv") trackers_.push_back(std::make_unique<CsvTracker>(dir, run_dir_));
      if (name == "jsonl") trackers_.push_back(std::make_unique<JsonlTracker>(dir, run_dir_));
    }
    std::string json = "{";
    for (size_t i = 0; i < config_.size(); ++i) {
      json += (i ? ",\n  " : "\n  ") +
              nlohmann::json(backslashReplaceInvalidUtf8(config_[i].first)).dump() + ": " +
              config_[i].second.json();
    }
    replaceFileAt(dir, "config.json", json + "\n}\n", 0644, run_dir_ + "/config.json");
    writeReport(false);
  } catch (const SystemError& e) {
    throw InvalidArgument("the project folder '" + options_.project_dir + "' cannot be written (" +
                          e.what() + "): give a folder this user can create and write with " +
                          kWhereProject);
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
  // Names as valid UTF-8 for every tracker: JSON must be, TensorBoard's reader decodes a tag as
  // UTF-8 (a bad one loses the whole event), and a CSV reader decodes the file.
  Scalars named;
  named.reserve(scalars.size());
  for (const auto& [name, value] : scalars) {
    named.emplace_back(backslashReplaceInvalidUtf8(name), value);
  }
  const double now = wallTime();
  for (const auto& tracker : trackers_) tracker->log(named, step, now);
  auto& h = *history_;
  ++h.logs;
  for (const auto& [name, value] : named) {
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
  replaceFileAt(history_->project.get(), "report.html", renderReport(content), 0644, reportPath());
}

}  // namespace cxxlaunch::runtime
