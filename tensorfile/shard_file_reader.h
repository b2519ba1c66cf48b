#pragma once
// Reading one rank's file of a checkpoint (its format: runtime/checkpoint/shard_file.h), without
// LibTorch, so that `cxxlaunch merge-weights` reads checkpoints in the launcher's binary.
//
// Thread-safety: ShardFileReader's read() and blob() may run on several threads at once (the
// reads of a load do); everything else on one thread.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensorfile/files.h"

namespace cxxlaunch::tensorfile {

// The file's first line and its checksums' last line: "<magic> <format> <header bytes>\n",
// "<checksums magic> <offset>\n". Format 1 had no checksums; 2 had chunks of 2^20 elements.
inline constexpr char kShardFileMagic[] = "cxxlaunch-checkpoint";
inline constexpr int kShardFileFormat = 3;
inline constexpr char kChecksumsMagic[] = "cxxlaunch-checksums";
// Arrays of at least kAlignedArrayBytes start at file offsets that are multiples of this.
inline constexpr uint64_t kDirectAlignment = 4096;

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

  const std::string& path() const { return path_; }
  const std::vector<SliceInfo>& slices() const { return slices_; }
  // Elements [from, to) of the slice's array at `offset` (from the SliceInfo) into `out`.
  void read(uint64_t offset, int64_t slice_begin, int64_t from, int64_t to, float* out) const;
  bool hasBlob(const std::string& name) const;
  std::vector<std::string> blobNames() const;
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

}  // namespace cxxlaunch::tensorfile
