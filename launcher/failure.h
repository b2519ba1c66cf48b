#pragma once
// Failure reporting: what a failed worker left behind (exit status, error file, stderr tail),
// which failure is the root cause, the table printed at the end and run-summary.json.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cxxlaunch::launcher {

struct Failure {
  int global_rank = 0;
  int local_rank = 0;
  std::string host;
  pid_t pid = 0;
  int exit_code = 0;  // when the worker exited
  int signal = 0;     // when a signal killed it (then exit_code is unused)
  std::chrono::system_clock::time_point time;
  std::string error_message;  // from TORCHELASTIC_ERROR_FILE, if the worker wrote one
  std::vector<std::string> stderr_tail;

  // What the launcher exits with when this failure is the root cause: the worker's exit code,
  // or 128 + signal number, as a shell reports it.
  int processExitCode() const { return signal != 0 ? 128 + signal : exit_code; }
  // "exit 3" or "SIGSEGV (11)".
  std::string statusText() const;
};

// The earliest failure (ties: the lowest rank). `failures` must not be empty.
const Failure& rootCause(const std::vector<Failure>& failures);

// A torchelastic error file: {"message": {"message": TEXT, "extraInfo": {"timestamp": SECONDS}}}
// or {"message": TEXT}. Missing or unreadable files give nullopt; the timestamp, when present,
// becomes the failure time, as torchrun does.
struct ErrorReport {
  std::string message;
  std::optional<std::chrono::system_clock::time_point> time;
};
std::optional<ErrorReport> readErrorFile(const std::string& path);

// A worker's steps and mean step times as its last heartbeat gave them (heartbeat_record.h).
struct RankStepTime {
  int rank = 0;
  int64_t steps = 0;
  int64_t step_us = 0;  // 0: none
  int64_t work_us = 0;
};

struct RunReport {
  std::string run_id;
  std::string program;
  std::vector<std::string> args;
  std::string status;  // "succeeded", "failed" or "interrupted"
  int exit_code = 0;
  int restarts = 0;
  int max_restarts = 0;
  int world_size = 0;
  std::string log_dir;
  // How the job's processes were confined: "cgroup PATH" or "process groups" (reliability.md).
  std::string confinement;
  std::vector<Failure> failures;         // of the last attempt
  std::vector<RankStepTime> step_times;  // of the last attempt's workers that reported them
};

// The table printed on stderr when the job fails.
std::string formatFailureTable(const RunReport& report);

// Writes run-summary.json atomically (temporary file, then rename; no fsync: a power loss may
// lose it, a crash of the launcher never leaves half of it).
void writeRunSummary(const std::string& path, const RunReport& report, mode_t mode = 0644);

}  // namespace cxxlaunch::launcher
