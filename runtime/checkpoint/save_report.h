#pragma once
// What a trainer learns of each committed save (Accelerator::takeSaveReports).

#include <cstdint>
#include <string>

namespace cxxlaunch::runtime::checkpoint {

// A committed save: its directory, the bytes of its rank files over every rank, the seconds
// from its start to its commit, and of those the seconds training waited for it.
struct SaveReport {
  std::string dir;
  uint64_t bytes = 0;
  double seconds = 0;
  double blocked_seconds = 0;
};

}  // namespace cxxlaunch::runtime::checkpoint
