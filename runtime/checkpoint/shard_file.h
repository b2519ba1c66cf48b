#pragma once
// One rank's file in a checkpoint: slices of the model's state, each a parameter's element range
// [begin, end) with its float32 arrays (the parameter's fp32 values and its optimizer state), and
// named byte blobs (random generator states, buffers). Because a slice names the parameter and
// its elements, not a shard, a checkpoint saved by any strategy at any world size loads into any
// other: the reader finds, for each range it needs, the slices that cover it.
//
//   "cxxlaunch-checkpoint 3 <header bytes>\n"
//   "slice <param> <begin> <end> <ndim> <dims...> <arrays> (<array> <offset>)...\n" ...
//   "blob <name> <offset> <bytes>\n" ...
//   the data: each array (end - begin float32) and blob at its offset from the header's end;
//   arrays of 64 KiB and more start at multiples of 4096 bytes in the file (empty lines pad the
//   header, zeros the data before such an array), so that a load reads them with O_DIRECT;
//   then the checksums: "checksums <elements per chunk>\n", a line per array (in the header's
//   order) with the CRC-32C of each chunk of that many elements, a line per blob with its
//   CRC-32C; and last "cxxlaunch-checksums <offset of the checksums, 20 digits>\n".
//
// The checksums make a load one pass: the reader checks each chunk it reads (a read that starts
// or ends inside a chunk reads the whole chunk) and records a mismatch rather than throwing, so
// that every rank finishes the load's collectives and all agree to fall back (checkpoint.h).
// Formats 1 (no checksums) and 2 (chunks of 2^20 elements, a line "checksums") are still read. The
// reader checks everything it parses (counts, ranges, offsets against the file's size) and reads
// with pread, so a corrupt or crafted file is an error, never an out-of-bounds read, and memory
// stays bounded by what the caller asks for.
//
// Thread-safety: ShardFileReader's read() and blob() may run on several threads at once (the
// reads of a load do); everything else on one thread.

#include <torch/types.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/checkpoint/files.h"

namespace cxxlaunch::runtime::checkpoint {

struct Slice {
  std::string param;
  std::vector<int64_t> shape;                                 // the whole parameter's
  int64_t begin = 0, end = 0;                                 // elements of the flattened parameter
  std::vector<std::pair<std::string, torch::Tensor>> arrays;  // float32, end - begin elements
};

// Where a slice goes in a file: its parameter, range and the names of its arrays, without them.
struct SliceLayout {
  std::string param;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;
  std::vector<std::string> arrays;
};

// The elements each checksum of an array covers in the files written (1 MiB). A read that
// starts or ends inside a chunk reads all of it: where ZeRO's and FSDP's shards split a full
// checkpoint's arrays, each rank reads up to a chunk more per array than it needs (format 2's
// 4 MiB chunks made that 17% more for rank 1 of the bench's GPT at world 2).
inline constexpr int64_t kChunkElements = int64_t{1} << 18;
// The most a load reads at once into place, in whole chunks: the disk answers a deep queue
// faster, and one O_DIRECT read of many MiB goes out as many requests at once.
inline constexpr int64_t kReadBytes = int64_t{32} << 20;
// Whole chunks of `chunk_elements` in one such read.
inline constexpr int64_t chunksPerRead(int64_t chunk_elements) {
  return std::max<int64_t>(1, kReadBytes / (chunk_elements * 4));
}
// Arrays of at least this size start page-aligned in their file: a load reads them past the page
// cache (O_DIRECT) straight into page-aligned memory.
inline constexpr uint64_t kAlignedArrayBytes = 64u << 10;

// Writes a rank's file durably with its slices' data streamed in: the header (from the layout)
// at once, then each array in the layout's order (append), then the blobs (commit). Nothing is
// visible at `path` before commit.
class ShardFileWriter {
 public:
  ShardFileWriter(const std::string& path, std::vector<SliceLayout> layout,
                  const std::vector<std::pair<std::string, std::string>>& blobs);
  // The next array of the layout: end - begin elements, converted to float32.
  void append(const torch::Tensor& array);
  // Returns the file's size and CRC-32C for the manifest; throws if arrays are missing.
  std::pair<uint64_t, uint32_t> commit();

 private:
  std::vector<SliceLayout> layout_;
  std::vector<std::pair<std::string, std::string>> blobs_;
  DurableFile file_;
  uint64_t data_start_ = 0;
  std::vector<uint64_t> offsets_;  // each array's, from data_start_
  size_t slice_ = 0, array_ = 0;   // what append() writes next
  size_t next_array_ = 0;          // its index in offsets_
  std::string checksums_;          // the checksums' lines so far
};

// Writes a rank's file of `slices` (their arrays in hand) durably; returns its size and CRC-32C.
std::pair<uint64_t, uint32_t> writeShardFile(
    const std::string& path, const std::vector<Slice>& slices,
    const std::vector<std::pair<std::string, std::string>>& blobs);

class ShardFileReader {
 public:
  struct SliceInfo {
    std::string param;
    std::vector<int64_t> shape;
    int64_t begin = 0, end = 0;
    std::vector<std::pair<std::string, uint64_t>> arrays;  // name, offset in the file
  };

  // Parses the header; throws InvalidArgument naming the file for anything malformed.
  explicit ShardFileReader(std::string path);
  ~ShardFileReader();
  ShardFileReader(const ShardFileReader&) = delete;
  ShardFileReader& operator=(const ShardFileReader&) = delete;

  const std::vector<SliceInfo>& slices() const { return slices_; }
  // Elements [from, to) of the slice's array at `offset` (from the SliceInfo) into `out`.
  void read(uint64_t offset, int64_t slice_begin, int64_t from, int64_t to, float* out) const;
  bool hasBlob(const std::string& name) const;
  std::string blob(const std::string& name) const;

  // Whether reads are checked (formats 2 and 3), and the first thing read that failed its
  // checksum.
  bool checksReads() const { return checked_; }
  std::optional<std::string> corruption() const;

 private:
  void pread(uint64_t offset, void* out, size_t bytes) const;
  // Reads [offset, offset + bytes) into `out`: past the page cache (O_DIRECT) where the file
  // system takes it, straight into `out` where it is aligned as the file is, else through a
  // buffer; through the page cache otherwise.
  void fill(uint64_t offset, void* out, size_t bytes) const;
  // At least `needed` of `bytes` (aligned) through direct_fd_; false if the file system refused.
  bool preadDirect(uint64_t offset, char* out, size_t bytes, size_t needed) const;
  void readChecksums(int format, uint64_t data_start, uint64_t& data_bytes);
  void check(uint32_t expected, const void* data, size_t bytes, const std::string& what) const;

  std::string path_;
  int fd_ = -1;
  int direct_fd_ = -1;                      // the file opened with O_DIRECT, -1 if refused
  mutable std::atomic<bool> direct_{true};  // false once a direct read was refused
  uint64_t size_ = 0;
  std::vector<SliceInfo> slices_;
  std::vector<std::pair<std::string, std::pair<uint64_t, uint64_t>>> blobs_;
  bool checked_ = false;
  int64_t chunk_ = kChunkElements;  // the elements each checksum covers, in this file
  struct ArrayChecksums {
    int64_t numel;
    std::vector<uint32_t> chunks;
    std::string name;  // "'<param>' <array>", for the message
  };
  std::map<uint64_t, ArrayChecksums> array_checksums_;  // by the array's offset
  std::map<uint64_t, uint32_t> blob_checksums_;         // by the blob's offset
  std::vector<std::vector<uint32_t>> pending_;  // the checksums' lines, until matched to arrays
  mutable std::mutex mu_;                       // guards corruption_
  mutable std::optional<std::string> corruption_;
};

}  // namespace cxxlaunch::runtime::checkpoint
