#pragma once
// Reading a complete checkpoint (runtime/checkpoint/checkpoint.h): every rank file's slices, and
// reads of any parameter's element range from whichever files cover it. No LibTorch: `cxxlaunch
// merge-weights` reads checkpoints with it in the launcher's binary.
//
// Thread-safety: readAll() reads on several threads; a Reader is used by one thread.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensorfile/manifest.h"
#include "tensorfile/shard_file_reader.h"

namespace cxxlaunch::tensorfile {

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
  // Opens a complete checkpoint directory (as find() returns); checks the manifest, and that
  // rank 0's file recorded the same counters (format 2 manifests: a manifest changed after the
  // save, or put there from another checkpoint, is refused).
  explicit Reader(const std::string& dir);
  // Throws InvalidArgument, naming the counter, when one of the files of this share (every
  // world-th from rank, as verifyShare) records other positions (optimizer_steps, micro_step,
  // scheduler_steps) than the manifest: a rank file from another save. Format 1: nothing.
  void checkCounters(int rank, int world) const;

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
  // The parameters that have `array`, each with its shape, in the order their first elements
  // come in the files (rank 0's file first): the model's order for every layout but DDP's.
  std::vector<std::pair<std::string, std::vector<int64_t>>> params(const std::string& array) const;
  // The files, rank 0's first.
  const std::vector<std::unique_ptr<ShardFileReader>>& files() const { return files_; }
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
  // Throws unless file `index` recorded the manifest's counters: all of them (`all`) or the
  // positions.
  void checkCountersOf(size_t index, bool all) const;
  std::string dir_;
  int world_ = 0;
  int format_ = 0;  // the manifest's
  Counters counters_;
  std::vector<std::unique_ptr<ShardFileReader>> files_;
  std::map<std::pair<std::string, std::string>, std::vector<Piece>> pieces_;  // (param, array)
};

}  // namespace cxxlaunch::tensorfile
