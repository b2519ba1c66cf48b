#pragma once
// Reading `cxxlaunch status`'s output in tests: the workers table's row of one global rank, and
// the silent-worker check on it.

#include <signal.h>
#include <sys/types.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "support/subprocess.h"

namespace cxxlaunch::testing {

// The row of global rank `rank` in the workers table of `status`, or "" when it has none.
inline std::string workerRow(const std::string& status, int rank) {
  std::istringstream in(status);
  bool in_workers = false;
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("workers")) in_workers = true;
    if (in_workers && line.starts_with("  " + std::to_string(rank) + " ")) return line;
  }
  return "";
}

// The check both rendezvous backends' status tests make, on a job of two beating workers
// (`workers`: their pids by rank) that `status()` reports with --silent_after below 30 s: both
// rows show their progress; once rank 1 is stopped it shows as stopped and SILENT, rank 0 not.
// Rank 1 is continued again before it returns. Returns the last status text.
inline std::string checkStoppedWorkerIsSilent(const std::function<std::string()>& status,
                                              const std::vector<pid_t>& workers) {
  using namespace std::chrono_literals;
  std::string text;
  REQUIRE(eventually(
      [&] {
        text = status();
        return workerRow(text, 0).find(" ago") != std::string::npos &&
               workerRow(text, 1).find(" ago") != std::string::npos;
      },
      30s));
  INFO(text);
  CHECK_THAT(workerRow(text, 1), Catch::Contains(std::to_string(workers[1])));
  ::kill(workers[1], SIGSTOP);
  CHECK(eventually(
      [&] {
        text = status();
        return workerRow(text, 1).find("SILENT") != std::string::npos;
      },
      30s));
  INFO(text);
  CHECK_THAT(workerRow(text, 1), Catch::Contains("stopped"));
  CHECK_THAT(workerRow(text, 0), !Catch::Contains("SILENT"));
  ::kill(workers[1], SIGCONT);
  return text;
}

}  // namespace cxxlaunch::testing
