#include "runtime/checkpoint/manifest.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "common/error.h"
#include "runtime/checkpoint/files.h"

namespace cxxlaunch::runtime::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr const char kManifestMagic[] = "cxxlaunch-checkpoint-manifest 1";

// Whether every listed file is there with its size (and, if `checksums`, its CRC-32).
bool filesIntact(const std::string& dir, const Manifest& m, bool checksums) {
  for (const auto& [name, expected] : m.files) {
    std::error_code ec;
    const std::string path = dir + "/" + name;
    const auto size = fs::file_size(path, ec);
    if (ec || size != expected.first) return false;
    try {
      if (checksums && fileSizeAndCrc(path) != expected) return false;
    } catch (const Error&) {  // unreadable, or no file of its own (a link)
      return false;
    }
  }
  return true;
}

int64_t stepOf(const Manifest& m) {
  auto it = m.counters.find("optimizer_steps");
  return it == m.counters.end() ? -1 : *wholeNumber(it->second);  // readManifest checked it
}

}  // namespace

std::string rankFileName(int rank) { return "rank" + std::to_string(rank) + ".bin"; }

std::string manifestText(int world, const Counters& counters,
                         const std::vector<std::pair<uint64_t, uint32_t>>& files) {
  std::ostringstream m;
  m << kManifestMagic << "\nworld " << world << "\n";
  for (const auto& [key, value] : counters) m << "counter " << key << ' ' << value << "\n";
  for (size_t r = 0; r < files.size(); ++r) {
    m << "file " << rankFileName(static_cast<int>(r)) << ' ' << files[r].first << ' '
      << files[r].second << "\n";
  }
  m << "end\n";
  return m.str();
}

std::optional<int64_t> wholeNumber(const std::string& text) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [at, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || at != end) return std::nullopt;
  return value;
}

std::optional<Manifest> readManifest(const std::string& dir) {
  const std::string path = dir + "/" + kManifestName;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  std::string text;
  try {
    text = readWholeFile(path, 1u << 20);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != kManifestMagic) return std::nullopt;
  Manifest m;
  bool ended = false;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string kind;
    words >> kind;
    if (kind == "world") {
      words >> m.world;
    } else if (kind == "counter") {
      std::string key, value;
      words >> key >> value;
      m.counters[key] = value;
    } else if (kind == "file") {
      std::string name;
      uint64_t size = 0;
      uint32_t crc = 0;
      words >> name >> size >> crc;
      if (name.find('/') != std::string::npos || name.find("..") != std::string::npos) {
        return std::nullopt;
      }
      m.files.push_back({name, {size, crc}});
    } else if (kind == "end") {
      ended = true;
      break;
    }
    if (!words) return std::nullopt;
  }
  if (!ended || m.world < 1 || m.files.size() != static_cast<size_t>(m.world)) return std::nullopt;
  // find() orders checkpoints by their step.
  if (auto it = m.counters.find("optimizer_steps");
      it != m.counters.end() && !wholeNumber(it->second)) {
    return std::nullopt;
  }
  return m;
}

namespace {

// Whether `name` ends in `suffix`.
bool endsWith(const std::string& name, const std::string& suffix) {
  return name.size() >= suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The directories directly under `path` that may hold a checkpoint: no staging (`.tmp`) ones, and
// no symbolic links, which could lead out of the folder.
std::vector<fs::directory_entry> checkpointEntries(const std::string& path) {
  std::vector<fs::directory_entry> out;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return out;
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    if (entry.is_symlink(ec) || !entry.is_directory(ec)) continue;
    if (endsWith(entry.path().filename().string(), ".tmp")) continue;
    out.push_back(entry);
  }
  return out;
}

}  // namespace

bool verifyShare(const std::string& dir, int rank, int world) {
  const auto m = readManifest(dir);
  if (!m) return false;
  for (size_t i = static_cast<size_t>(rank); i < m->files.size(); i += static_cast<size_t>(world)) {
    const auto& [name, expected] = m->files[i];
    try {
      if (fileSizeAndCrc(dir + "/" + name) != expected) return false;
    } catch (const std::exception&) {
      return false;
    }
  }
  return true;
}

std::optional<std::string> whyIncomplete(const std::string& dir) {
  std::error_code ec;
  const std::string manifest = dir + "/" + kManifestName;
  if (!fs::exists(manifest, ec)) return "'" + manifest + "' is missing";
  const auto m = readManifest(dir);
  if (!m) return "'" + manifest + "' is incomplete or malformed (a save that did not finish?)";
  for (const auto& [name, expected] : m->files) {
    const std::string path = dir + "/" + name;
    if (fs::is_symlink(path, ec)) return "'" + path + "' is a symbolic link, not a rank file";
    if (!fs::exists(path, ec)) return "'" + path + "' is missing";
    const auto size = fs::file_size(path, ec);
    if (ec || size != expected.first) {
      return "'" + path + "' is " +
             (ec ? std::string("unreadable") : std::to_string(size) + " bytes") +
             ", its manifest says " + std::to_string(expected.first) + " (cut short?)";
    }
  }
  return std::nullopt;
}

bool hasComplete(const std::string& path, bool checksums) {
  return !complete(path, checksums).empty();
}

void removeOldest(const std::string& root, size_t keep) {
  std::error_code ec;
  std::vector<std::pair<int64_t, std::string>> complete;
  for (const auto& entry : checkpointEntries(root)) {
    const std::string dir = entry.path().string();
    if (entry.path().filename().string().find('.') != std::string::npos) continue;
    if (auto m = readManifest(dir); m && filesIntact(dir, *m, /*checksums=*/false)) {
      complete.push_back({stepOf(*m), dir});
    }
  }
  std::sort(complete.rbegin(), complete.rend());
  for (size_t i = std::max<size_t>(keep, 1); i < complete.size(); ++i) {
    fs::remove_all(complete[i].second, ec);
  }
}

std::vector<std::string> complete(const std::string& path, bool checksums) {
  std::vector<std::string> out;
  for (const std::string& dir : {path, path + ".old"}) {
    if (auto m = readManifest(dir); m && filesIntact(dir, *m, checksums)) out.push_back(dir);
  }
  std::vector<std::pair<int64_t, std::string>> candidates;
  for (const auto& entry : checkpointEntries(path)) {
    if (auto m = readManifest(entry.path().string())) {
      candidates.push_back({stepOf(*m), entry.path().string()});
    }
  }
  std::sort(candidates.rbegin(), candidates.rend());
  for (const auto& [step, dir] : candidates) {
    const auto m = readManifest(dir);
    if (m && filesIntact(dir, *m, checksums)) {
      out.push_back(dir);
    } else {
      std::cerr << "cxxlaunch: checkpoint '" << dir << "' (step " << step
                << ") is incomplete or corrupt; skipping it\n";
    }
  }
  return out;
}

bool holdsCheckpoints(const std::string& path) {
  std::error_code ec;
  for (const std::string& dir : {path, path + ".old"}) {
    if (fs::exists(dir + "/" + kManifestName, ec)) return true;
  }
  for (const auto& entry : checkpointEntries(path)) {
    const std::string name = entry.path().filename().string();
    const bool named = name.rfind("checkpoint_", 0) == 0 && wholeNumber(name.substr(11));
    if (named || fs::exists(entry.path() / kManifestName, ec)) return true;
  }
  return false;
}

std::string find(const std::string& path, bool checksums) {
  const auto found = complete(path, checksums);
  if (!found.empty()) return found.front();
  throw InvalidArgument("no complete checkpoint at '" + path +
                        "' (a checkpoint directory has a manifest; a folder of them is searched "
                        "for the newest complete one)");
}

}  // namespace cxxlaunch::runtime::checkpoint
