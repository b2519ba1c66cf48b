#include "tensorfile/reader.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <iterator>
#include <mutex>
#include <thread>

#include "common/error.h"

namespace cxxlaunch::tensorfile {

Reader::Reader(const std::string& dir) : dir_(dir) {
  std::string why;
  const auto m = readManifest(dir, &why);
  if (!m) throw InvalidArgument("'" + dir + "' is no complete checkpoint: " + why);
  world_ = m->world;
  format_ = m->format;
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
  if (!files_.empty()) checkCountersOf(0, /*all=*/true);
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

namespace {

std::string valueOrNone(const Counters& counters, const std::string& key) {
  auto it = counters.find(key);
  return it == counters.end() ? "absent" : "'" + it->second + "'";
}

}  // namespace

void Reader::checkCountersOf(size_t index, bool all) const {
  if (format_ < 2) return;  // saved by a build that did not record them in the rank files
  const ShardFileReader& file = *files_.at(index);
  auto refuse = [&](const std::string& why) {
    throw InvalidArgument("checkpoint '" + dir_ + "': " + why +
                          ": its manifest was changed after the save or comes from another "
                          "checkpoint");
  };
  if (!file.hasBlob(kCountersBlob)) refuse("'" + file.path() + "' has no record of its counters");
  const auto saved = parseCounters(file.blob(kCountersBlob));
  if (auto problem = file.corruption()) {
    throw InvalidArgument(*problem + ": the checkpoint is corrupt");
  }
  if (!saved) refuse("'" + file.path() + "' has a malformed record of its counters");
  std::vector<std::string> keys;
  if (all) {
    for (const auto& [key, value] : counters_) keys.push_back(key);
    for (const auto& [key, value] : *saved) keys.push_back(key);
  } else {
    keys.assign(std::begin(kPositionCounters), std::end(kPositionCounters));
  }
  for (const auto& key : keys) {
    const std::string in_manifest = valueOrNone(counters_, key), in_file = valueOrNone(*saved, key);
    if (in_manifest != in_file) {
      refuse("its manifest's counter '" + key + "' is " + in_manifest + " where '" + file.path() +
             "' recorded " + in_file);
    }
  }
}

void Reader::checkCounters(int rank, int world) const {
  for (size_t i = static_cast<size_t>(rank); i < files_.size(); i += static_cast<size_t>(world)) {
    if (i != 0) checkCountersOf(i, /*all=*/false);  // the constructor checked rank 0's
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

std::vector<std::pair<std::string, std::vector<int64_t>>> Reader::params(
    const std::string& array) const {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  // pieces_ is sorted by element within a parameter: its first piece holds element 0.
  for (size_t f = 0; f < files_.size(); ++f) {
    const auto& slices = files_[f]->slices();
    for (size_t s = 0; s < slices.size(); ++s) {
      const auto& slice = slices[s];
      const auto it = pieces_.find({slice.param, array});
      if (it == pieces_.end() || it->second.front().file != files_[f].get() ||
          it->second.front().begin != slice.begin) {
        continue;
      }
      out.emplace_back(slice.param, slice.shape);
    }
  }
  return out;
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

}  // namespace cxxlaunch::tensorfile
