#pragma once
// Where this process's memory comes from, from /proc/self/maps: for tests that check a buffer
// lives in shared memory.

#include <string>

namespace cxxlaunch::testing {

// The file behind the mapping that holds `address` ("" when anonymous or not mapped).
std::string mappedFileOf(const void* address);

}  // namespace cxxlaunch::testing
