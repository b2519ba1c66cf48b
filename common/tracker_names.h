#pragma once
// The trackers a run can log to (accelerate's log_with), named once for the launcher, which
// checks the config before it spawns anything, and the runtime, which opens them.

#include <string>
#include <string_view>
#include <vector>

namespace cxxlaunch {

// "tensorboard", "csv", "jsonl".
const std::vector<std::string>& knownTrackers();

// The trackers of a comma list ("tensorboard,csv"; "all": every one), without duplicates, in
// the list's order; "" gives none. Throws InvalidArgument, once, naming every unknown name in
// it, the known ones and `where` the list came from (a flag, a variable, a config key).
std::vector<std::string> parseTrackerList(std::string_view list, const std::string& where);

}  // namespace cxxlaunch
