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
// two renames, `<dir>.old`. Re-saving the same directory is the same protocol.
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

namespace cxxlaunch::runtime::checkpoint {

// The counters a checkpoint records besides the tensors (text key -> value).
using Counters = std::map<std::string, std::string>;

void save(Backend& backend, const std::string& dir, const std::vector<Slice>& slices,
          const std::vector<std::pair<std::string, std::string>>& blobs, const Counters& counters);

// The full layout (FSDP's FULL_STATE_DICT): rank 0's file holds every parameter whole, each array
// gathered while the file is written, so no rank holds more than one unit's array at a time;
// every rank's file holds its own blobs. `produce` is a collective that every rank runs: it
// hands each array, in `layout`'s order, to the function it is given (rank 0 writes them, the
// others drop them). The protocol and its guarantees are save()'s.
struct FullState {
  std::vector<SliceLayout> layout;  // rank 0's slices, in the order produce() gives their arrays
  std::function<void(const std::function<void(const torch::Tensor&)>& write)> produce;
};
void saveFull(Backend& backend, const std::string& dir, const FullState& state,
              const std::vector<std::pair<std::string, std::string>>& blobs,
              const Counters& counters);

// The complete checkpoints `path` names, best first (see above): `path` itself, `<path>.old`,
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

// Keeps the newest `keep` complete checkpoints directly under `root` (by step), removing the
// older ones; incomplete ones and anything else are left alone. keep >= 1.
void removeOldest(const std::string& root, size_t keep);

// One read of a load: elements [begin, end) of `array` of parameter `param` (whose shape must be
// `shape`) into `out` (float32).
struct ReadRequest {
  std::string param, array;
  int64_t begin = 0, end = 0;
  std::vector<int64_t> shape;
  float* out = nullptr;
};

// Where a strategy loads parameters and optimizer state from: a checkpoint, or an exported model
// (parameters only).
class Source {
 public:
  virtual ~Source() = default;
  // One request. Throws InvalidArgument naming the parameter when the shape differs or some
  // element is missing.
  virtual void read(const std::string& param, const std::string& array, int64_t begin, int64_t end,
                    const std::vector<int64_t>& shape, float* out) const = 0;
  // Every request, as read() does each, in any order (the outputs must not overlap). This one
  // reads them one after another; a checkpoint reads them on several threads.
  virtual void readAll(const std::vector<ReadRequest>& requests) const;
  virtual bool has(const std::string& param, const std::string& array) const = 0;
  virtual std::optional<std::string> counter(const std::string& key) const = 0;
  // A counter as a number: `fallback` when there is none; InvalidArgument naming it when it is
  // not one (a damaged or crafted manifest).
  int64_t wholeCounter(const std::string& key, int64_t fallback) const;
  std::optional<double> realCounter(const std::string& key) const;
};

class Reader final : public Source {
 public:
  // Opens a complete checkpoint directory (as find() returns); checks the manifest.
  explicit Reader(const std::string& dir);

  const std::string& directory() const { return dir_; }
  int worldSize() const { return world_; }
  const Counters& counters() const { return counters_; }
  std::optional<std::string> counter(const std::string& key) const override;

  // From whichever files cover the elements.
  void read(const std::string& param, const std::string& array, int64_t begin, int64_t end,
            const std::vector<int64_t>& shape, float* out) const override;
  // On kReadThreads threads: while one waits for the disk, another checks what it has read, so
  // the disk stays busy (one synchronous reader gets about half of its speed).
  void readAll(const std::vector<ReadRequest>& requests) const override;
  static constexpr int kReadThreads = 4;
  // Throws as readAll would for any request it could not read (missing, another shape,
  // incomplete), reading nothing: ranks that share the reading check each other's requests.
  void check(const std::vector<ReadRequest>& requests) const;
  bool has(const std::string& param, const std::string& array) const override;
  // Rank `rank`'s blob, if its file has it.
  std::optional<std::string> blob(int rank, const std::string& name) const;
  // Whether every file checks what is read from it (formats 2 and 3), and the first thing read so
  // far that failed its checksum (shard_file.h): a load is then one pass over the data.
  bool checksReads() const;
  std::optional<std::string> corruption() const;

 private:
  struct Piece {
    const ShardFileReader* file;
    int64_t begin, end;
    uint64_t offset;
    const std::vector<int64_t>* shape;
  };
  // A read as the pieces that cover it: [from, to) of each piece into out + (from - begin).
  struct PieceRead {
    const Piece* piece;
    int64_t from, to;
    float* out;
  };
  void plan(const std::string& param, const std::string& array, int64_t begin, int64_t end,
            const std::vector<int64_t>& shape, float* out, std::vector<PieceRead>& reads) const;
  std::string dir_;
  int world_ = 0;
  Counters counters_;
  std::vector<std::unique_ptr<ShardFileReader>> files_;
  std::map<std::pair<std::string, std::string>, std::vector<Piece>> pieces_;  // (param, array)
};

}  // namespace cxxlaunch::runtime::checkpoint
