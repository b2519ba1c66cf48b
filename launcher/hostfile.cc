#include "launcher/hostfile.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "launcher/cli.h"
#include "launcher/flag_values.h"

namespace cxxlaunch::launcher {
namespace {

std::string trim(const std::string& text) {
  const auto begin = text.find_first_not_of(" \t\r");
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(" \t\r") - begin + 1);
}

bool validHost(const std::string& host) {
  return !host.empty() && host.size() <= 255 && host[0] != '-' &&
         std::all_of(host.begin(), host.end(), [](unsigned char c) {
           return std::isalnum(c) || c == '-' || c == '.' || c == '_';
         });
}

// "node1:0,1@node2" -> {node1: {0, 1}, node2: {}} (empty: every slot), in the spec's order.
std::vector<std::pair<std::string, std::set<int>>> parseSpec(const std::string& flag,
                                                             const std::string& spec) {
  std::vector<std::pair<std::string, std::set<int>>> out;
  for (const std::string& part : split(spec, '@')) {
    const auto colon = part.find(':');
    const std::string host = part.substr(0, colon);
    if (host.empty())
      failFlag(flag, spec, "HOST[:SLOT,...] specs joined by '@', e.g. node1:0,1@node2");
    std::set<int> slots;
    if (colon != std::string::npos) {
      for (int slot : parseIntList(flag, part.substr(colon + 1))) slots.insert(slot);
    }
    out.emplace_back(host, std::move(slots));
  }
  return out;
}

}  // namespace

std::vector<HostSlots> parseHostfile(const std::string& text, const std::string& name) {
  std::vector<HostSlots> hosts;
  std::set<std::string> seen;
  std::istringstream in(text);
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    const std::string where = name + ":" + std::to_string(number) + ": ";
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    std::istringstream words(line);
    std::string host, slots, extra;
    words >> host >> slots >> extra;
    int count = 0;
    const bool slots_ok = slots.starts_with("slots=") && slots.size() > 6 && slots.size() < 12 &&
                          std::all_of(slots.begin() + 6, slots.end(),
                                      [](unsigned char c) { return std::isdigit(c); }) &&
                          (count = std::stoi(slots.substr(6))) >= 1 && count <= 65536;
    if (!validHost(host) || !slots_ok || !extra.empty()) {
      throw UsageError(where + "'" + line + "' is not 'HOST slots=N' (N from 1 to 65536)");
    }
    if (!seen.insert(host).second) throw UsageError(where + "host '" + host + "' is listed twice");
    HostSlots h{host, {}};
    for (int s = 0; s < count; ++s) h.slots.push_back(s);
    hosts.push_back(std::move(h));
  }
  if (hosts.empty()) throw UsageError(name + ": no host in the hostfile");
  return hosts;
}

std::vector<HostSlots> readHostfile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw UsageError("--hostfile: '" + path + "' is not a file");
  }
  if (std::filesystem::file_size(path, ec) > (1 << 20)) {
    throw UsageError("--hostfile: '" + path + "' is larger than 1 MiB");
  }
  std::ifstream in(path);
  if (!in) throw UsageError("--hostfile: cannot read '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  return parseHostfile(text.str(), path);
}

std::vector<HostSlots> filterHosts(std::vector<HostSlots> hosts, const HostFilter& filter) {
  if (!filter.include.empty() && !filter.exclude.empty()) {
    throw UsageError("--include and --exclude go one at a time");
  }
  if ((!filter.include.empty() || !filter.exclude.empty()) &&
      (filter.num_nodes > 0 || filter.num_gpus > 0)) {
    throw UsageError("--num_nodes and --num_gpus do not go with --include or --exclude");
  }
  const bool including = !filter.include.empty();
  const std::string flag = including ? "include" : "exclude";
  if (including || !filter.exclude.empty()) {
    const auto specs = parseSpec(flag, including ? filter.include : filter.exclude);
    std::map<std::string, std::set<int>> wanted;
    for (const auto& [host, slots] : specs) {
      auto it = std::find_if(hosts.begin(), hosts.end(),
                             [&](const HostSlots& h) { return h.host == host; });
      if (it == hosts.end()) {
        throw UsageError("--" + flag + ": host '" + host + "' is not in the hostfile");
      }
      for (int slot : slots) {
        if (std::find(it->slots.begin(), it->slots.end(), slot) == it->slots.end()) {
          throw UsageError("--" + flag + ": host '" + host + "' has no slot " +
                           std::to_string(slot) + " (it has " + std::to_string(it->slots.size()) +
                           ")");
        }
      }
      auto& w = wanted[host];
      if (slots.empty()) {
        w.insert(it->slots.begin(), it->slots.end());
      } else {
        w.insert(slots.begin(), slots.end());
      }
    }
    std::vector<HostSlots> kept;
    for (auto& h : hosts) {
      auto it = wanted.find(h.host);
      std::vector<int> slots;
      for (int s : h.slots) {
        const bool named = it != wanted.end() && it->second.count(s) != 0;
        if (named == including) slots.push_back(s);
      }
      if (!slots.empty()) kept.push_back({h.host, std::move(slots)});
    }
    hosts = std::move(kept);
  }
  if (filter.num_nodes > 0) {
    if (static_cast<size_t>(filter.num_nodes) > hosts.size()) {
      throw UsageError("--num_nodes " + std::to_string(filter.num_nodes) + ": the hostfile has " +
                       std::to_string(hosts.size()) + " hosts");
    }
    hosts.resize(static_cast<size_t>(filter.num_nodes));
  }
  if (filter.num_gpus > 0) {
    for (auto& h : hosts) {
      if (static_cast<size_t>(filter.num_gpus) > h.slots.size()) {
        throw UsageError("--num_gpus " + std::to_string(filter.num_gpus) + ": host '" + h.host +
                         "' has " + std::to_string(h.slots.size()) + " slots");
      }
      h.slots.resize(static_cast<size_t>(filter.num_gpus));
    }
  }
  if (hosts.empty()) throw UsageError("--" + flag + " leaves no host of the hostfile");
  return hosts;
}

}  // namespace cxxlaunch::launcher
