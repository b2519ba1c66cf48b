#include "launcher/failure.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/utf8.h"
#include "launcher/process.h"
#include "launcher/progress.h"

namespace cxxlaunch::launcher {
namespace {

std::string isoTime(std::chrono::system_clock::time_point time) {
  std::time_t t = std::chrono::system_clock::to_time_t(time);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

std::string firstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

// Every string of run-summary.json comes from bytes the launcher does not control (a program's
// arguments, a host name, a worker's stderr cut at any byte): nlohmann's dump throws on invalid
// UTF-8, which would lose the summary and the job's exit code.
nlohmann::json text(const std::string& bytes) { return backslashReplaceInvalidUtf8(bytes); }

nlohmann::json texts(const std::vector<std::string>& lines) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& line : lines) out.push_back(text(line));
  return out;
}

}  // namespace

std::string Failure::statusText() const {
  if (signal != 0) return signalName(signal) + " (" + std::to_string(signal) + ")";
  return "exit " + std::to_string(exit_code);
}

const Failure& rootCause(const std::vector<Failure>& failures) {
  return *std::min_element(failures.begin(), failures.end(), [](const auto& a, const auto& b) {
    return a.time != b.time ? a.time < b.time : a.global_rank < b.global_rank;
  });
}

std::optional<ErrorReport> readErrorFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  auto json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object() || !json.contains("message")) return std::nullopt;
  ErrorReport report;
  const auto& message = json["message"];
  if (message.is_string()) {
    report.message = message.get<std::string>();
  } else if (message.is_object() && message.value("message", nlohmann::json()).is_string()) {
    report.message = message["message"].get<std::string>();
    auto info = message.value("extraInfo", nlohmann::json::object());
    if (info.is_object() && info.contains("timestamp")) {
      const auto& ts = info["timestamp"];
      long long seconds = ts.is_number_integer() ? ts.get<long long>()
                          : ts.is_string()       ? std::atoll(ts.get<std::string>().c_str())
                                                 : 0;
      if (seconds > 0) report.time = std::chrono::system_clock::from_time_t(seconds);
    }
  } else {
    return std::nullopt;
  }
  return report;
}

std::string formatFailureTable(const RunReport& report) {
  const Failure& root = rootCause(report.failures);
  std::ostringstream out;
  const std::string rule(72, '=');
  out << rule << "\n"
      << report.program << " FAILED (run " << report.run_id << ", " << report.restarts << " of "
      << report.max_restarts << " restarts used)\n"
      << rule << "\n";
  char line[256];
  std::snprintf(line, sizeof(line), "  %-5s %-6s %-16s %-8s %-14s %-20s\n", "rank", "local", "host",
                "pid", "status", "time");
  out << line;
  std::vector<const Failure*> sorted;
  for (const auto& f : report.failures) sorted.push_back(&f);
  std::sort(sorted.begin(), sorted.end(),
            [](auto* a, auto* b) { return a->global_rank < b->global_rank; });
  for (const Failure* f : sorted) {
    std::snprintf(line, sizeof(line), "%s %-5d %-6d %-16s %-8d %-14s %-20s\n",
                  f == &root ? "*" : " ", f->global_rank, f->local_rank,
                  f->host.substr(0, 16).c_str(), static_cast<int>(f->pid), f->statusText().c_str(),
                  isoTime(f->time).c_str());
    out << line;
    if (!f->error_message.empty()) out << "      error: " << firstLine(f->error_message) << "\n";
  }
  out << "root cause (*): rank " << root.global_rank << " " << root.statusText() << "\n";
  if (!root.stderr_tail.empty()) {
    out << "last lines of its stderr:\n";
    for (const auto& l : root.stderr_tail) out << "  | " << l << "\n";
  }
  out << "logs: " << report.log_dir << "\n" << rule << "\n";
  return out.str();
}

void writeRunSummary(const std::string& path, const RunReport& report, mode_t mode) {
  nlohmann::json failures = nlohmann::json::array();
  for (const auto& f : report.failures) {
    failures.push_back(
        {{"rank", f.global_rank},
         {"local_rank", f.local_rank},
         {"host", text(f.host)},
         {"pid", f.pid},
         {"exit_code", f.signal != 0 ? nlohmann::json() : nlohmann::json(f.exit_code)},
         {"signal", f.signal != 0 ? nlohmann::json(signalName(f.signal)) : nlohmann::json()},
         {"time", isoTime(f.time)},
         {"error", text(f.error_message)},
         {"stderr_tail", texts(f.stderr_tail)}});
  }
  nlohmann::json json = {{"run_id", text(report.run_id)},
                         {"program", text(report.program)},
                         {"args", texts(report.args)},
                         {"status", text(report.status)},
                         {"exit_code", report.exit_code},
                         {"restarts", report.restarts},
                         {"max_restarts", report.max_restarts},
                         {"world_size", report.world_size},
                         {"log_dir", text(report.log_dir)},
                         {"confinement", text(report.confinement)},
                         {"failures", failures}};
  if (!report.failures.empty()) json["root_cause_rank"] = rootCause(report.failures).global_rank;
  // Per rank: its mean step time, and its work (the step less the waits for its peers) that
  // the straggler rule compares (docs/observability.md).
  std::vector<int64_t> work;
  for (const auto& t : report.step_times) work.push_back(t.work_us);
  const std::vector<bool> slow = stragglers(work);
  nlohmann::json step_times = nlohmann::json::array();
  for (size_t i = 0; i < report.step_times.size(); ++i) {
    const RankStepTime& t = report.step_times[i];
    auto ms = [](int64_t us) {
      return us > 0 ? nlohmann::json(static_cast<double>(us) / 1000) : nlohmann::json();
    };
    step_times.push_back({{"rank", t.rank},
                          {"steps", t.steps},
                          {"step_ms", ms(t.step_us)},
                          {"work_ms", ms(t.work_us)},
                          {"slow", static_cast<bool>(slow[i])}});
  }
  json["step_times"] = step_times;
  // A report of a job that is over: nothing resumes from it, and the fsyncs of kPowerLoss were
  // the largest part of a short launch on a busy disk.
  writeFileAtomically(path, json.dump(2) + "\n", Durability::kProcessCrash, mode);
}

}  // namespace cxxlaunch::launcher
