#pragma once
// Checkpoints on disk: a directory with one file per rank (checkpoint/shard_file.h) and a
// manifest, written last, that makes it complete.
//
// Saving (a collective):
//   1. rank 0 makes `<dir>.tmp` afresh; every rank writes its file there durably (temporary
//      name, fsync, rename, fsync of the directory);
//   2. once every rank reported success, rank 0 writes the manifest (world size, counters,
//      each file's size and CRC-32C) durably, then swaps the directory in: `<dir>` (if it exists)
//      to `<dir>.old`, `<dir>.tmp` to `<dir>`, then removes `<dir>.old`;
//   3. a failure on any rank (disk full, I/O error) is an error on every rank; what existed
//      before stays as it was.
// A crash at any instant leaves at least the last complete checkpoint: `<dir>` or, between the
// two renames, `<dir>.old`. Re-saving the same directory is the same protocol. Asynchronous
// saves (async_save.h) run this protocol too, their rank files written in the background.
//
// Loading picks a checkpoint: `path` itself when it is complete (manifest present, every file
// of the listed size and checksum), else `<path>.old`, else the complete subdirectory of `path`
// with the highest step (an incomplete or corrupt one is skipped with a note). The files need
// a filesystem every rank sees (as PyTorch DCP assumes). Accelerator::loadState takes the newest
// whose files have their sizes and checks the checksums of what it reads (one pass); if any rank
// cannot load it (a checksum, a header, a name or shape, a permission), every rank goes on to the
// next newest, and so on.
//
// Thread-safety: one training thread.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/checkpoint/shard_file.h"
#include "runtime/comm/backend.h"
#include "tensorfile/manifest.h"
#include "tensorfile/reader.h"

namespace cxxlaunch::runtime::checkpoint {

// Writes this rank's `state` (state_view.h: its own views, or in the full layout everything on
// rank 0) as its file; returns the bytes of the checkpoint's rank files, over every rank.
uint64_t save(Backend& backend, const std::string& dir, const StateStream& state,
              const std::vector<std::pair<std::string, std::string>>& blobs,
              const tensorfile::Counters& counters);

// `blobs` and the blob of the counters that a rank file records beside them (manifest.h).
std::vector<std::pair<std::string, std::string>> withCounters(
    std::vector<std::pair<std::string, std::string>> blobs, const tensorfile::Counters& counters);

// The protocol's two halves around the writing of the rank files, for a save that writes them
// later (async_save.h); save() is stage(), this rank's file, commit(). Both are collectives.
// stage() is step 1 and returns the staging directory. commit() is steps 2 and 3, given this
// rank's file (`written`: its size and CRC-32C) or the error that stopped it (`write_error` not
// empty: every rank throws, `writing` saying what failed); it returns save()'s bytes.
std::string stage(Backend& backend, const std::string& dir);
uint64_t commit(Backend& backend, const std::string& dir, const tensorfile::Counters& counters,
                std::pair<uint64_t, uint32_t> written, const std::string& write_error,
                const std::string& writing = "writing rank files");

}  // namespace cxxlaunch::runtime::checkpoint
