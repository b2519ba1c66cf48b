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
// The reader (shard_file_reader.h) needs no LibTorch; the writer here takes tensors.
//
// Thread-safety: see shard_file_reader.h; a writer is used by one thread.

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/state_view.h"
#include "tensorfile/files.h"
#include "tensorfile/shard_file_reader.h"

namespace cxxlaunch::runtime::checkpoint {

// Writes a rank's file durably with its slices' data streamed in: the header (from the layout)
// at once, then each array in the layout's order (append), then the blobs (commit). Nothing is
// visible at `path` before commit.
class ShardFileWriter {
 public:
  ShardFileWriter(const std::string& path, std::vector<StateLayout> layout,
                  const std::vector<std::pair<std::string, std::string>>& blobs);
  // The next array of the layout: end - begin elements, converted to float32.
  void append(const torch::Tensor& array);
  // Returns the file's size and CRC-32C for the manifest; throws if arrays are missing.
  std::pair<uint64_t, uint32_t> commit();

 private:
  std::vector<StateLayout> layout_;
  std::vector<std::pair<std::string, std::string>> blobs_;
  tensorfile::DurableFile file_;
  uint64_t data_start_ = 0;
  std::vector<uint64_t> offsets_;  // each array's, from data_start_
  size_t slice_ = 0, array_ = 0;   // what append() writes next
  size_t next_array_ = 0;          // its index in offsets_
  std::string checksums_;          // the checksums' lines so far
};

// Writes a rank's file of `slices` (their arrays in hand) durably; returns its size and CRC-32C.
std::pair<uint64_t, uint32_t> writeShardFile(
    const std::string& path, const std::vector<StateView>& slices,
    const std::vector<std::pair<std::string, std::string>>& blobs);

}  // namespace cxxlaunch::runtime::checkpoint
