#pragma once
// A program's output (or a file's text) as its lines, without their newlines: what tests compare
// line by line.

#include <sstream>
#include <string>
#include <vector>

namespace cxxlaunch::testing {

inline std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace cxxlaunch::testing
