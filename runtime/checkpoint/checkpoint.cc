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

}  // namespace

std::vector<std::pair<std::string, std::string>> withCounters(
    std::vector<std::pair<std::string, std::string>> blobs, const tensorfile::Counters& counters) {
  blobs.emplace_back(tensorfile::kCountersBlob, tensorfile::countersText(counters));
  return blobs;
}

std::string stage(Backend& backend, const std::string& dir) {
  const std::string staging = dir + ".tmp";
  std::string error;
  bool ok = true;
  if (backend.rank() == 0) {
    try {
      fs::remove_all(staging);
      fs::create_directories(staging);
    } catch (const std::exception& e) {
      ok = false;
      error = "creating '" + staging + "': " + e.what();
    }
  }
  agree(backend, ok, "preparing the directory", error);
  return staging;
}

uint64_t commit(Backend& backend, const std::string& dir, const tensorfile::Counters& counters,
                std::pair<uint64_t, uint32_t> written, const std::string& write_error,
                const std::string& writing) {
  const int rank = backend.rank(), world = backend.worldSize();
  const std::string staging = dir + ".tmp", old = dir + ".old";
  agree(backend, write_error.empty(), writing, write_error);

  std::vector<uint64_t> all(2 * static_cast<size_t>(world));
  uint64_t mine[2] = {written.first, written.second};
  backend.allGather(mine, all.data(), 2, DType::kInt64)->wait();
  uint64_t bytes = 0;
  for (int r = 0; r < world; ++r) bytes += all[2 * static_cast<size_t>(r)];
  std::string error;
  bool ok = true;
  if (rank == 0) {
    try {
      std::vector<std::pair<uint64_t, uint32_t>> files;
      for (int r = 0; r < world; ++r) {
        files.emplace_back(all[2 * static_cast<size_t>(r)],
                           static_cast<uint32_t>(all[2 * static_cast<size_t>(r) + 1]));
      }
      writeFileAtomically(staging + "/" + tensorfile::kManifestName,
                          tensorfile::manifestText(world, counters, files));
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
  return bytes;
}

namespace {

// The protocol both layouts share (checkpoint.h): `writeOwn` writes this rank's file (under the
// staging directory's `path`) and returns its size and CRC-32C.
uint64_t saveWith(
    Backend& backend, const std::string& dir, const tensorfile::Counters& counters,
    const std::function<std::pair<uint64_t, uint32_t>(const std::string&)>& writeOwn) {
  const std::string staging = stage(backend, dir);
  std::pair<uint64_t, uint32_t> written{0, 0};
  std::string error;
  try {
    written = writeOwn(staging + "/" + tensorfile::rankFileName(backend.rank()));
  } catch (const std::exception& e) {
    error = e.what();
  }
  return commit(backend, dir, counters, written, error);
}

}  // namespace

uint64_t save(Backend& backend, const std::string& dir, const StateStream& state,
              const std::vector<std::pair<std::string, std::string>>& blobs,
              const tensorfile::Counters& counters) {
  return saveWith(backend, dir, counters, [&](const std::string& path) {
    // Every rank runs every gather of produce() (the full layout's), whatever happens to its own
    // file, or the others would wait for it; a write error is thrown once the gathers are over.
    std::optional<ShardFileWriter> writer;
    std::string error;
    try {
      writer.emplace(path, state.layout, withCounters(blobs, counters));
    } catch (const std::exception& e) {
      error = e.what();
    }
    state.produce([&](const torch::Tensor& array) {
      if (!error.empty()) return;
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

}  // namespace cxxlaunch::runtime::checkpoint
