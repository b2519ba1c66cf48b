#pragma once
// The test worker's `pidfile DIR` step writes DIR/rank<R>.pid: waiting for them in tests.

#include <sys/types.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "support/subprocess.h"

namespace cxxlaunch::testing {

// The pids of ranks 0..n-1 once all of them wrote their file (at most 20 s).
inline std::vector<pid_t> waitForPids(const std::string& dir, int n) {
  auto file = [&](int r) { return dir + "/rank" + std::to_string(r) + ".pid"; };
  std::vector<pid_t> pids;
  REQUIRE(eventually(
      [&] {
        for (int r = 0; r < n; ++r) {
          if (!std::filesystem::exists(file(r))) return false;
        }
        return true;
      },
      std::chrono::seconds(20)));
  for (int r = 0; r < n; ++r) pids.push_back(std::stoi(readFile(file(r))));
  return pids;
}

}  // namespace cxxlaunch::testing
