#include "common/tracker_names.h"

#include <algorithm>
#include <cctype>

#include "common/did_you_mean.h"
#include "common/error.h"

namespace cxxlaunch {

const std::vector<std::string>& knownTrackers() {
  static const std::vector<std::string> names = {"tensorboard", "csv", "jsonl"};
  return names;
}

std::vector<std::string> parseTrackerList(std::string_view list, const std::string& where) {
  std::vector<std::string> trackers, unknown;
  const auto add = [&trackers](const std::string& name) {
    if (std::find(trackers.begin(), trackers.end(), name) == trackers.end()) {
      trackers.push_back(name);
    }
  };
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    std::string name(list.substr(start, comma - start));
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    start = comma + 1;
    if (name.empty()) continue;
    if (name == "all") {
      for (const auto& known : knownTrackers()) add(known);
    } else if (std::find(knownTrackers().begin(), knownTrackers().end(), name) !=
               knownTrackers().end()) {
      add(name);
    } else {
      unknown.push_back(name);
    }
  }
  if (!unknown.empty()) {
    std::string message = where + ": unknown tracker";
    message += unknown.size() > 1 ? "s " : " ";
    for (size_t i = 0; i < unknown.size(); ++i) {
      message += (i ? ", '" : "'") + unknown[i] + "'";
      if (const auto close = closestMatch(unknown[i], knownTrackers()); !close.empty()) {
        message += " (did you mean '" + close + "'?)";
      }
    }
    message += "; the known ones are tensorboard, csv and jsonl (or all), as a comma list";
    throw InvalidArgument(message);
  }
  return trackers;
}

}  // namespace cxxlaunch
