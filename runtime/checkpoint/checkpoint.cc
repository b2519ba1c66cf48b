#include "runtime/checkpoint/checkpoint.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "common/atomic_file.h"
#include "common/error.h"

namespace cxxlaunch::runtime::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr const char kManifest[] = "manifest";
constexpr const char kManifestMagic[] = "cxxlaunch-checkpoint-manifest 1";

std::string rankFile(int rank) { return "rank" + std::to_string(rank) + ".bin"; }

// Every rank's `ok`; throws on every rank when one failed, with this rank's own error if it has
// one.
void agree(Backend& backend, bool ok, const std::string& what, const std::string& error) {
  int32_t all_ok = ok ? 1 : 0;
  backend.allreduce(&all_ok, 1, DType::kInt32, ReduceOp::kMin)->wait();
  if (all_ok == 1) return;
  throw CommunicationError("checkpoint: " + what + " failed" +
                           (error.empty() ? " on another rank (see its log)" : ": " + error) +
                           "; the previous checkpoint is untouched");
}

// The whole number `text` is, all of it, or nullopt.
std::optional<int64_t> wholeNumber(const std::string& text) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [at, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || at != end) return std::nullopt;
  return value;
}

struct Manifest {
  int world = 0;
  Counters counters;
  std::vector<std::pair<std::string, std::pair<uint64_t, uint32_t>>> files;
};

// The manifest, or nullopt if there is none or it is incomplete (no "end" line) or malformed.
std::optional<Manifest> readManifest(const std::string& dir) {
  const std::string path = dir + "/" + kManifest;
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

namespace {

// The protocol both layouts share (checkpoint.h): `writeOwn` writes this rank's file (under the
// staging directory's `path`) and returns its size and CRC-32C.
void saveWith(Backend& backend, const std::string& dir, const Counters& counters,
              const std::function<std::pair<uint64_t, uint32_t>(const std::string&)>& writeOwn) {
  const int rank = backend.rank(), world = backend.worldSize();
  const std::string staging = dir + ".tmp", old = dir + ".old";
  std::string error;
  bool ok = true;
  if (rank == 0) {
    try {
      fs::remove_all(staging);
      fs::create_directories(staging);
    } catch (const std::exception& e) {
      ok = false;
      error = "creating '" + staging + "': " + e.what();
    }
  }
  agree(backend, ok, "preparing the directory", error);

  std::pair<uint64_t, uint32_t> written{0, 0};
  try {
    written = writeOwn(staging + "/" + rankFile(rank));
  } catch (const std::exception& e) {
    ok = false;
    error = e.what();
  }
  agree(backend, ok, "writing rank files", error);

  std::vector<uint64_t> all(2 * static_cast<size_t>(world));
  uint64_t mine[2] = {written.first, written.second};
  backend.allGather(mine, all.data(), 2, DType::kInt64)->wait();
  if (rank == 0) {
    try {
      std::ostringstream m;
      m << kManifestMagic << "\nworld " << world << "\n";
      for (const auto& [key, value] : counters) m << "counter " << key << ' ' << value << "\n";
      for (int r = 0; r < world; ++r) {
        m << "file " << rankFile(r) << ' ' << all[2 * static_cast<size_t>(r)] << ' '
          << all[2 * static_cast<size_t>(r) + 1] << "\n";
      }
      m << "end\n";
      writeFileAtomically(staging + "/" + kManifest, m.str());
      // The swap: a crash between the renames leaves `old` complete.
      fs::remove_all(old);
      if (fs::exists(dir)) fs::rename(dir, old);
      fs::rename(staging, dir);
      const auto parent = fs::path(dir).parent_path();
      fsyncDirectory(parent.empty() ? "." : parent.string());
      fs::remove_all(old);
    } catch (const std::exception& e) {
      ok = false;
      error = e.what();
    }
  }
  agree(backend, ok, "committing", error);
}

}  // namespace

void save(Backend& backend, const std::string& dir, const std::vector<Slice>& slices,
          const std::vector<std::pair<std::string, std::string>>& blobs, const Counters& counters) {
  saveWith(backend, dir, counters,
           [&](const std::string& path) { return writeShardFile(path, slices, blobs); });
}

void saveFull(Backend& backend, const std::string& dir, const FullState& state,
              const std::vector<std::pair<std::string, std::string>>& blobs,
              const Counters& counters) {
  const bool writes = backend.rank() == 0;
  saveWith(backend, dir, counters, [&](const std::string& path) {
    // Every rank runs every gather of produce(), whatever happens to rank 0's file, or the
    // others would wait for it; a write error is thrown once the gathers are over.
    std::optional<ShardFileWriter> writer;
    std::string error;
    try {
      writer.emplace(path, writes ? state.layout : std::vector<SliceLayout>{}, blobs);
    } catch (const std::exception& e) {
      error = e.what();
    }
    state.produce([&](const torch::Tensor& array) {
      if (!writes || !error.empty()) return;
      try {
        writer->append(array);
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
    if (!error.empty()) throw CommunicationError(error);
    return writer->commit();
  });
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
    if (fs::exists(dir + "/" + kManifest, ec)) return true;
  }
  for (const auto& entry : checkpointEntries(path)) {
    const std::string name = entry.path().filename().string();
    const bool named = name.rfind("checkpoint_", 0) == 0 && wholeNumber(name.substr(11));
    if (named || fs::exists(entry.path() / kManifest, ec)) return true;
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

Reader::Reader(const std::string& dir) : dir_(dir) {
  const auto m = readManifest(dir);
  if (!m) throw InvalidArgument("'" + dir + "' is no complete checkpoint (no valid manifest)");
  world_ = m->world;
  counters_ = m->counters;
  for (const auto& [name, expected] : m->files) {
    files_.push_back(std::make_unique<ShardFileReader>(dir + "/" + name));
    for (const auto& s : files_.back()->slices()) {
      for (const auto& [array, offset] : s.arrays) {
        pieces_[{s.param, array}].push_back(
            {files_.back().get(), s.begin, s.end, offset, &s.shape});
      }
    }
  }
  // Each element has one owner when saved: slices that overlap (each file's CRCs may be right)
  // would leave part of a parameter unread while plan() counted it covered.
  for (auto& [key, pieces] : pieces_) {
    std::sort(pieces.begin(), pieces.end(),
              [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
    const Piece* reach = nullptr;  // of the non-empty pieces so far, the one reaching furthest
    for (const Piece& p : pieces) {
      if (*p.shape != *pieces.front().shape) {
        throw InvalidArgument("checkpoint '" + dir + "' is corrupt: its slices of '" + key.first +
                              "' disagree on its shape");
      }
      if (p.begin == p.end) continue;
      if (reach != nullptr && p.begin < reach->end) {
        throw InvalidArgument("checkpoint '" + dir + "' is corrupt: its slices of '" + key.first +
                              "' (" + key.second + ") overlap: elements " +
                              std::to_string(reach->begin) + "-" + std::to_string(reach->end) +
                              " and " + std::to_string(p.begin) + "-" + std::to_string(p.end));
      }
      if (reach == nullptr || p.end > reach->end) reach = &p;
    }
  }
}

bool Reader::checksReads() const {
  return std::all_of(files_.begin(), files_.end(), [](const auto& f) { return f->checksReads(); });
}

std::optional<std::string> Reader::corruption() const {
  for (const auto& f : files_) {
    if (auto problem = f->corruption()) return problem;
  }
  return std::nullopt;
}

std::optional<std::string> Reader::counter(const std::string& key) const {
  auto it = counters_.find(key);
  if (it == counters_.end()) return std::nullopt;
  return it->second;
}

bool Reader::has(const std::string& param, const std::string& array) const {
  return pieces_.count({param, array}) != 0;
}

int64_t Source::wholeCounter(const std::string& key, int64_t fallback) const {
  const auto text = counter(key);
  if (!text) return fallback;
  if (auto value = wholeNumber(*text)) return *value;
  throw InvalidArgument("the checkpoint's counter '" + key + "' is '" + *text +
                        "', not a whole number: its manifest is damaged or was not written by "
                        "cxxlaunch; load another checkpoint");
}

std::optional<double> Source::realCounter(const std::string& key) const {
  const auto text = counter(key);
  if (!text) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text->c_str(), &end);
  if (text->empty() || end != text->c_str() + text->size() || !std::isfinite(value)) {
    throw InvalidArgument("the checkpoint's counter '" + key + "' is '" + *text +
                          "', not a number: its manifest is damaged or was not written by "
                          "cxxlaunch; load another checkpoint");
  }
  return value;
}

void Source::readAll(const std::vector<ReadRequest>& requests) const {
  for (const auto& r : requests) read(r.param, r.array, r.begin, r.end, r.shape, r.out);
}

void Reader::plan(const std::string& param, const std::string& array, int64_t begin, int64_t end,
                  const std::vector<int64_t>& shape, float* out,
                  std::vector<PieceRead>& reads) const {
  auto it = pieces_.find({param, array});
  if (it == pieces_.end()) {
    throw InvalidArgument("checkpoint '" + dir_ + "' has no " + array + " for '" + param +
                          "' (saved from another model or optimizer?)");
  }
  int64_t covered = 0;
  for (const Piece& p : it->second) {
    if (*p.shape != shape) {
      throw InvalidArgument("checkpoint '" + dir_ + "': '" + param +
                            "' has another shape there than in this model");
    }
    const int64_t from = std::max(begin, p.begin), to = std::min(end, p.end);
    if (from >= to) continue;
    reads.push_back({&p, from, to, out + (from - begin)});
    covered += to - from;
  }
  // Slices of one parameter never overlap (each element has one owner when saved).
  if (covered != end - begin) {
    throw InvalidArgument("checkpoint '" + dir_ + "' does not hold all of '" + param + "' (" +
                          array + "): incomplete or from another model");
  }
}

void Reader::read(const std::string& param, const std::string& array, int64_t begin, int64_t end,
                  const std::vector<int64_t>& shape, float* out) const {
  std::vector<PieceRead> reads;
  plan(param, array, begin, end, shape, out, reads);
  for (const auto& r : reads)
    r.piece->file->read(r.piece->offset, r.piece->begin, r.from, r.to, r.out);
}

void Reader::check(const std::vector<ReadRequest>& requests) const {
  std::vector<PieceRead> reads;
  for (const auto& r : requests) plan(r.param, r.array, r.begin, r.end, r.shape, r.out, reads);
}

void Reader::readAll(const std::vector<ReadRequest>& requests) const {
  std::vector<PieceRead> reads;  // every request checked before anything is read
  for (const auto& r : requests) plan(r.param, r.array, r.begin, r.end, r.shape, r.out, reads);
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::exception_ptr failure;
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < reads.size();) {
      const PieceRead& r = reads[i];
      try {
        r.piece->file->read(r.piece->offset, r.piece->begin, r.from, r.to, r.out);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!failure) failure = std::current_exception();
        next = reads.size();
      }
    }
  };
  std::vector<std::thread> threads;  // this one and kReadThreads - 1 more
  for (size_t t = 1; t < std::min<size_t>(kReadThreads, reads.size()); ++t) {
    threads.emplace_back(work);
  }
  work();
  for (auto& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
}

std::optional<std::string> Reader::blob(int rank, const std::string& name) const {
  if (rank < 0 || rank >= static_cast<int>(files_.size())) return std::nullopt;
  const auto& file = *files_[static_cast<size_t>(rank)];
  if (!file.hasBlob(name)) return std::nullopt;
  return file.blob(name);
}

}  // namespace cxxlaunch::runtime::checkpoint
