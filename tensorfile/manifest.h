#pragma once
// A checkpoint directory's manifest (runtime/checkpoint/checkpoint.h): written last, it makes the
// checkpoint complete. Text, one item a line: "cxxlaunch-checkpoint-manifest 2", "world <N>",
// "counter <key> <value>" ..., "file rank<r>.bin <bytes> <CRC-32C>" for each rank, "end", and
// last "crc32c <8 hex digits>": the CRC-32C of every byte before that line, so that a manifest
// damaged or edited after the save (a counter changed, a line cut) is never read as another
// valid one. Format 1 (no checksum line) is still read: checkpoints of earlier builds resume.
// Each rank file also records the counters (blob kCountersBlob), which a load compares with the
// manifest's (reader.h). And finding the complete checkpoints of a folder, with the reason each
// other one was skipped. No LibTorch: `cxxlaunch merge-weights` uses it.
//
// Thread-safety: none needed (free functions over the file system).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensorfile/checkpoint_schema.h"  // the counters' names

namespace cxxlaunch::tensorfile {

// The counters a checkpoint records besides the tensors (text key -> value).
using Counters = std::map<std::string, std::string>;

inline constexpr char kManifestName[] = "manifest";
inline constexpr int kManifestFormat = 2;  // written; 1 and 2 are read
std::string rankFileName(int rank);        // rank<r>.bin

struct Manifest {
  int format = kManifestFormat;
  int world = 0;
  Counters counters;
  std::vector<std::pair<std::string, std::pair<uint64_t, uint32_t>>> files;  // name, size, CRC
};

// The manifest of checkpoint `dir`, or nullopt if there is none or it is incomplete (no "end"
// line), malformed or fails its checksum; then `why`, if given, says which, naming the file.
std::optional<Manifest> readManifest(const std::string& dir, std::string* why = nullptr);
// The manifest's text for rank files of these sizes and CRC-32C, in rank order.
std::string manifestText(int world, const Counters& counters,
                         const std::vector<std::pair<uint64_t, uint32_t>>& files);
// The counters as "counter <key> <value>" lines (the manifest's), and back; nullopt for text
// that is not such lines.
std::string countersText(const Counters& counters);
std::optional<Counters> parseCounters(const std::string& text);
// A counter value for any bytes (a path with spaces): '%', white space, control characters and
// bytes past ASCII as %XX. decodeCounterValue gives nullopt for a malformed escape.
std::string encodeCounterValue(const std::string& text);
std::optional<std::string> decodeCounterValue(const std::string& value);
// The whole number `text` is, all of it, or nullopt.
std::optional<int64_t> wholeNumber(const std::string& text);

// The complete checkpoints `path` names, best first (runtime/checkpoint/checkpoint.h): `path`
// itself, `<path>.old`, then the subdirectories of `path` by step, newest first. Without
// `checksums` files are checked by size only (verifyShare, or a format 2/3 file's reads, then check
// the CRCs). A subdirectory that is a symbolic link is never taken: a checkpoint lies inside its
// folder. `skipped`, if given, gets a line for each checkpoint that is not complete (one with a
// manifest, or named checkpoint_<step> or checkpoint-<step>), naming it and why ("checkpoint 'D'
// skipped: ..."), newest first.
std::vector<std::string> complete(const std::string& path, bool checksums = true,
                                  std::vector<std::string>* skipped = nullptr);
// The first of complete(); throws InvalidArgument when there is none.
std::string find(const std::string& path, bool checksums = true);
bool hasComplete(const std::string& path, bool checksums = true);
// Whether `path` is or holds a checkpoint, complete or not (a manifest, or a directory named
// `checkpoint_<step>` or `checkpoint-<step>` as saveCheckpoint names them); staging directories
// do not count.
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

}  // namespace cxxlaunch::tensorfile
