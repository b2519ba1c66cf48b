#pragma once
// A checkpoint directory's manifest (checkpoint.h): written last, it makes the checkpoint
// complete. Text, one item a line: "cxxlaunch-checkpoint-manifest 1", "world <N>",
// "counter <key> <value>" ..., "file rank<r>.bin <bytes> <CRC-32C>" for each rank, "end". And
// finding the complete checkpoints of a folder. No LibTorch: `cxxlaunch merge-weights` uses it.
//
// Thread-safety: none needed (free functions over the file system).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cxxlaunch::runtime::checkpoint {

// The counters a checkpoint records besides the tensors (text key -> value).
using Counters = std::map<std::string, std::string>;

inline constexpr char kManifestName[] = "manifest";
std::string rankFileName(int rank);  // rank<r>.bin

struct Manifest {
  int world = 0;
  Counters counters;
  std::vector<std::pair<std::string, std::pair<uint64_t, uint32_t>>> files;  // name, size, CRC
};

// The manifest of checkpoint `dir`, or nullopt if there is none or it is incomplete (no "end"
// line) or malformed.
std::optional<Manifest> readManifest(const std::string& dir);
// The manifest's text for rank files of these sizes and CRC-32C, in rank order.
std::string manifestText(int world, const Counters& counters,
                         const std::vector<std::pair<uint64_t, uint32_t>>& files);
// The whole number `text` is, all of it, or nullopt.
std::optional<int64_t> wholeNumber(const std::string& text);

// The complete checkpoints `path` names, best first (checkpoint.h): `path` itself, `<path>.old`,
// then the subdirectories of `path` by step, newest first. Without `checksums` files are checked
// by size only (verifyShare, or a format 2/3 file's reads, then check the CRCs). A subdirectory
// that is a symbolic link is never taken: a checkpoint lies inside its folder.
std::vector<std::string> complete(const std::string& path, bool checksums = true);
// The first of complete(); throws InvalidArgument when there is none.
std::string find(const std::string& path, bool checksums = true);
bool hasComplete(const std::string& path, bool checksums = true);
// Whether `path` is or holds a checkpoint, complete or not (a manifest, or a directory named
// `checkpoint_<step>` as saveCheckpoint names them); staging directories do not count.
bool holdsCheckpoints(const std::string& path);
// Whether the files of checkpoint `dir` that fall to `rank` (every world-th, from rank) have
// their manifest's CRC-32C.
bool verifyShare(const std::string& dir, int rank, int world);

// Why `dir` is no complete checkpoint by its files' sizes (its manifest missing, incomplete or
// malformed; a rank file missing or of another size), naming the file; nullopt when it is one.
std::optional<std::string> whyIncomplete(const std::string& dir);

// Keeps the newest `keep` complete checkpoints directly under `root` (by step), removing the
// older ones; incomplete ones and anything else are left alone. keep >= 1.
void removeOldest(const std::string& root, size_t keep);

}  // namespace cxxlaunch::runtime::checkpoint
