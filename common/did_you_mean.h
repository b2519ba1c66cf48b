#pragma once
// Did-you-mean for unknown flags, subcommands and config keys.

#include <string>
#include <vector>

namespace cxxlaunch {

// The candidate closest to `word` (ignoring case) within a small edit distance, or "".
std::string closestMatch(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace cxxlaunch
