#pragma once
// Reading what workers printed through a launcher in tests: each line comes with the launcher's
// "[rank R]: " prefix, or "[rank N:R]: " when several nodes' output meets.

#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace cxxlaunch::testing {

// The values of the NAME=value lines in `out`, in order, their prefix gone.
inline std::vector<std::string> values(const std::string& out, const std::string& name) {
  std::vector<std::string> found;
  std::istringstream in(out);
  const std::regex line("^\\[rank (\\d+:)?\\d+\\]: " + name + "=(.*)$");
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (std::regex_match(l, m, line)) found.push_back(m[2]);
  }
  return found;
}

}  // namespace cxxlaunch::testing
