#pragma once
// Checkpoint files: written durably through common/atomic_file.h (temporary name, fsync,
// rename, fsync of the folder) with the CRC-32C and size the manifest records; CRC-32C of files
// read back. Internal to tensorfile/ and runtime/checkpoint/.

#include <cstdint>
#include <string>

#include "common/atomic_file.h"

namespace cxxlaunch::tensorfile {

// An AtomicFile that also counts the bytes and the CRC-32C of what was appended.
class DurableFile {
 public:
  // Past the page cache: a checkpoint is read back by another job, if at all, and through the
  // page cache its writers paid for fresh pages at a third of the disk's speed here.
  explicit DurableFile(std::string path)
      : file_(std::move(path), Durability::kPowerLoss, Writes::kPastPageCache) {}

  void append(const void* data, size_t bytes);
  // append() that also returns the bytes' own CRC-32C, reading them from memory once: each piece
  // is checked and then copied while it is still in the cache (a checkpoint's arrays: their
  // chunks' checksums and the file's come from the one pass).
  uint32_t appendChecked(const void* data, size_t bytes);
  void commit() { file_.commit(); }
  uint64_t size() const { return size_; }
  uint32_t crc() const { return crc_; }

 private:
  AtomicFile file_;
  uint64_t size_ = 0;
  uint32_t crc_ = 0;
};

// CRC-32C of `bytes` continuing from `crc` (0 to start), as iSCSI and ext4 use it.
uint32_t crc32c(uint32_t crc, const void* data, size_t bytes);

// The CRC-32C of A followed by B, from A's, B's and B's length (zlib's crc32_combine): B's bytes
// are not read again.
uint32_t crc32cCombine(uint32_t first, uint32_t second, size_t second_bytes);

// The CRC-32C of a whole file and its size; throws CommunicationError if it cannot be read.
std::pair<uint64_t, uint32_t> fileSizeAndCrc(const std::string& path);

std::string readWholeFile(const std::string& path, size_t max_bytes);

}  // namespace cxxlaunch::tensorfile
