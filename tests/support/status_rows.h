#pragma once
// Reading `cxxlaunch status`'s output in tests: the workers table's row of one global rank.

#include <sstream>
#include <string>

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

}  // namespace cxxlaunch::testing
