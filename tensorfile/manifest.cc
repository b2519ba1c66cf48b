#include "tensorfile/manifest.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <tuple>

#include "common/error.h"
#include "tensorfile/files.h"

namespace cxxlaunch::tensorfile {
namespace {

namespace fs = std::filesystem;

constexpr const char kManifestMagic[] = "cxxlaunch-checkpoint-manifest";
constexpr const char kChecksumWord[] = "crc32c";

// Why a listed file is not there with its size (and, if `checksums`, its CRC-32C), naming it;
// nullopt when every one is.
std::optional<std::string> whyFilesNotIntact(const std::string& dir, const Manifest& m,
                                             bool checksums) {
  for (const auto& [name, expected] : m.files) {
    std::error_code ec;
    const std::string path = dir + "/" + name;
    if (fs::is_symlink(path, ec)) return "'" + path + "' is a symbolic link, not a rank file";
    if (!fs::exists(path, ec)) return "'" + path + "' is missing";
    const auto size = fs::file_size(path, ec);
    if (ec || size != expected.first) {
      return "'" + path + "' is " +
             (ec ? std::string("unreadable") : std::to_string(size) + " bytes") +
             ", its manifest says " + std::to_string(expected.first) + " (cut short?)";
    }
    try {
      if (checksums && fileSizeAndCrc(path) != expected) {
        return "'" + path + "' does not match its manifest's CRC-32C (damaged)";
      }
    } catch (const Error&) {  // unreadable, or no file of its own (a link)
      return "'" + path + "' cannot be read";
    }
  }
  return std::nullopt;
}

int64_t stepOf(const Manifest& m) {
  auto it = m.counters.find(kOptimizerStepsCounter);
  return it == m.counters.end() ? -1 : *wholeNumber(it->second);  // readManifest checked it
}

std::string hex8(uint32_t value) {
  char text[9];
  std::snprintf(text, sizeof(text), "%08x", value);
  return text;
}

}  // namespace

std::string rankFileName(int rank) { return "rank" + std::to_string(rank) + ".bin"; }

std::string countersText(const Counters& counters) {
  std::string out;
  for (const auto& [key, value] : counters) out += "counter " + key + ' ' + value + "\n";
  return out;
}

std::optional<Counters> parseCounters(const std::string& text) {
  Counters out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string kind, key, value, rest;
    if (!(words >> kind >> key >> value) || kind != "counter" || (words >> rest)) {
      return std::nullopt;
    }
    out[key] = value;
  }
  return out;
}

std::string encodeCounterValue(const std::string& text) {
  std::string out;
  for (const unsigned char c : text) {
    if (c <= ' ' || c >= 0x7f || c == '%') {
      char escape[4];
      std::snprintf(escape, sizeof(escape), "%%%02X", c);
      out += escape;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out.empty() ? "%" : out;  // a counter's value is one word: "%" alone is the empty text
}

std::optional<std::string> decodeCounterValue(const std::string& value) {
  if (value == "%") return std::string();
  std::string out;
  for (size_t i = 0; i < value.size(); ++i) {
    if (value[i] != '%') {
      out += value[i];
      continue;
    }
    unsigned byte = 0;
    const char* first = value.data() + i + 1;
    if (i + 2 >= value.size() || std::from_chars(first, first + 2, byte, 16).ptr != first + 2) {
      return std::nullopt;
    }
    out += static_cast<char>(byte);
    i += 2;
  }
  return out;
}

std::string manifestText(int world, const Counters& counters,
                         const std::vector<std::pair<uint64_t, uint32_t>>& files) {
  std::ostringstream m;
  m << kManifestMagic << ' ' << kManifestFormat << "\nworld " << world << "\n"
    << countersText(counters);
  for (size_t r = 0; r < files.size(); ++r) {
    m << "file " << rankFileName(static_cast<int>(r)) << ' ' << files[r].first << ' '
      << files[r].second << "\n";
  }
  m << "end\n";
  const std::string body = m.str();
  return body + kChecksumWord + ' ' + hex8(crc32c(0, body.data(), body.size())) + "\n";
}

std::optional<int64_t> wholeNumber(const std::string& text) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [at, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || at != end) return std::nullopt;
  return value;
}

std::optional<Manifest> readManifest(const std::string& dir, std::string* why) {
  const std::string path = dir + "/" + kManifestName;
  auto fail = [&](const std::string& reason) -> std::optional<Manifest> {
    if (why != nullptr) *why = "'" + path + "' " + reason;
    return std::nullopt;
  };
  std::error_code ec;
  if (fs::is_symlink(path, ec)) return fail("is a symbolic link, not a manifest");
  if (!fs::exists(path, ec)) return fail("is missing");
  if (!fs::is_regular_file(path, ec)) return fail("is not a regular file");
  std::string text;
  try {
    text = readWholeFile(path, 1u << 20);
  } catch (const std::exception& e) {
    return fail(std::string("cannot be read: ") + e.what());
  }
  if (text.empty()) return fail("is empty (a save that did not finish, or a damaged disk?)");
  Manifest m;
  const size_t first_end = text.find('\n');
  const std::string first = text.substr(0, first_end);
  if (first == std::string(kManifestMagic) + " 1") {
    m.format = 1;
  } else if (first == std::string(kManifestMagic) + " 2") {
    m.format = 2;
  } else if (first.rfind(std::string(kManifestMagic) + " ", 0) == 0) {
    return fail("is of format '" + first.substr(sizeof(kManifestMagic)) +
                "', which this build does not read (a newer cxxlaunch wrote it?)");
  } else {
    return fail("does not begin with '" + std::string(kManifestMagic) + "' (damaged)");
  }
  if (m.format >= 2) {
    // The last line is the checksum of everything before it.
    const size_t last = text.size() >= 2 ? text.rfind('\n', text.size() - 2) : std::string::npos;
    const std::string word = std::string(kChecksumWord) + ' ';
    if (text.back() != '\n' || last == std::string::npos ||
        text.compare(last + 1, word.size(), word) != 0) {
      return fail("has no checksum line at its end (cut short?)");
    }
    const std::string stated =
        text.substr(last + 1 + word.size(), text.size() - last - 2 - word.size());
    if (stated.size() != 8 || stated.find_first_not_of("0123456789abcdef") != std::string::npos) {
      return fail("has a malformed checksum line (damaged)");
    }
    if (stated != hex8(crc32c(0, text.data(), last + 1))) {
      return fail("does not match its CRC-32C: it was damaged or edited after the save");
    }
    text.resize(last + 1);
  }
  std::istringstream in(text.substr(first_end == std::string::npos ? text.size() : first_end + 1));
  std::string line;
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
        return fail("names a file outside its directory ('" + name + "')");
      }
      m.files.push_back({name, {size, crc}});
    } else if (kind == "end") {
      ended = true;
      break;
    } else if (m.format >= 2) {
      return fail("has a line this format does not have: '" + line + "'");
    }
    if (!words) return fail("has a malformed line: '" + line + "'");
  }
  if (!ended) return fail("has no 'end' line (a save that did not finish?)");
  if (m.format >= 2 && in.peek() != std::char_traits<char>::eof()) {
    return fail("has lines after its 'end' line");
  }
  if (m.world < 1 || m.files.size() != static_cast<size_t>(m.world)) {
    return fail("says world " + std::to_string(m.world) + " but lists " +
                std::to_string(m.files.size()) + " rank file(s)");
  }
  // find() orders checkpoints by their step.
  if (auto it = m.counters.find(kOptimizerStepsCounter);
      it != m.counters.end() && !wholeNumber(it->second)) {
    return fail("has an optimizer_steps counter that is no whole number ('" + it->second + "')");
  }
  return m;
}

namespace {

// Whether `name` ends in `suffix`.
bool endsWith(const std::string& name, const std::string& suffix) {
  return name.size() >= suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The step in a name saveCheckpoint gives (checkpoint_<step> as accelerate names them, or
// checkpoint-<step> as HF Trainer does; or either with .old between a save's two renames), or
// nullopt.
std::optional<int64_t> namedStep(std::string name) {
  if (endsWith(name, ".old")) name.resize(name.size() - 4);
  if (name.rfind("checkpoint_", 0) != 0 && name.rfind("checkpoint-", 0) != 0) return std::nullopt;
  return wholeNumber(name.substr(11));
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
  std::string why;
  const auto m = readManifest(dir, &why);
  if (!m) return why;
  return whyFilesNotIntact(dir, *m, /*checksums=*/false);
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
    if (auto m = readManifest(dir); m && !whyFilesNotIntact(dir, *m, /*checksums=*/false)) {
      complete.push_back({stepOf(*m), dir});
    }
  }
  std::sort(complete.rbegin(), complete.rend());
  for (size_t i = std::max<size_t>(keep, 1); i < complete.size(); ++i) {
    fs::remove_all(complete[i].second, ec);
  }
}

std::vector<std::string> complete(const std::string& path, bool checksums,
                                  std::vector<std::string>* skipped) {
  auto skip = [&](const std::string& dir, const std::string& why) {
    if (skipped != nullptr) skipped->push_back("checkpoint '" + dir + "' skipped: " + why);
  };
  std::vector<std::string> out;
  std::error_code ec;
  for (const std::string& dir : {path, path + ".old"}) {
    if (!fs::exists(fs::symlink_status(dir + "/" + kManifestName, ec))) continue;
    std::string why;
    const auto m = readManifest(dir, &why);
    const auto broken = m ? whyFilesNotIntact(dir, *m, checksums) : why;
    if (broken) {
      skip(dir, *broken);
    } else {
      out.push_back(dir);
    }
  }
  // By step, newest first; at one step a checkpoint before `.old` (the save that replaced it).
  struct Candidate {
    int64_t step;
    bool current;
    std::string dir;
    std::optional<Manifest> manifest;
    std::string why;  // when the manifest cannot be read
    bool operator<(const Candidate& o) const {
      return std::tie(step, current, dir) < std::tie(o.step, o.current, o.dir);
    }
  };
  std::vector<Candidate> candidates;
  for (const auto& entry : checkpointEntries(path)) {
    const std::string dir = entry.path().string();
    const std::string name = entry.path().filename().string();
    const auto named = namedStep(name);
    // Anything else in the folder (logs, an export) that is neither named nor has a manifest is
    // no checkpoint: no note.
    if (!named && !fs::exists(fs::symlink_status(entry.path() / kManifestName, ec))) continue;
    Candidate c{named.value_or(-1), !endsWith(name, ".old"), dir, std::nullopt, ""};
    c.manifest = readManifest(dir, &c.why);
    if (c.manifest) c.step = stepOf(*c.manifest);
    candidates.push_back(std::move(c));
  }
  std::sort(candidates.rbegin(), candidates.rend());
  for (const auto& c : candidates) {
    const auto broken = c.manifest ? whyFilesNotIntact(c.dir, *c.manifest, checksums) : c.why;
    if (broken) {
      skip(c.dir, *broken);
    } else {
      out.push_back(c.dir);
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
    if (namedStep(name) || fs::exists(entry.path() / kManifestName, ec)) return true;
  }
  return false;
}

std::string find(const std::string& path, bool checksums) {
  std::vector<std::string> skipped;
  const auto found = complete(path, checksums, &skipped);
  if (!found.empty()) return found.front();
  std::string why;
  for (const auto& s : skipped) why += "\n  " + s;
  throw InvalidArgument("no complete checkpoint at '" + path +
                        "' (a checkpoint directory has a manifest; a folder of them is searched "
                        "for the newest complete one)" +
                        why);
}

}  // namespace cxxlaunch::tensorfile
