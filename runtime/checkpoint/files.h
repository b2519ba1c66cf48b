#pragma once
// Durable files for checkpoints: written under a temporary name, fsynced, renamed into place,
// and the directory fsynced, so that after a crash a name holds either its old content or its
// complete new one. CRC-32C for the manifest's checksums. Internal to runtime/.

#include <cstdint>
#include <string>

namespace cxxlaunch::runtime::checkpoint {

// Writes `bytes` to `path` durably (tmp + fsync + rename + fsync of the directory). Throws
// CommunicationError naming the path and the system's reason (ENOSPC, EIO...).
void writeFileDurably(const std::string& path, const std::string& bytes);

// An open file being written durably: append, then commit() (fsync + rename + fsync of the
// directory). Destroyed uncommitted, it removes its temporary file.
class DurableFile {
 public:
  explicit DurableFile(std::string path);
  ~DurableFile();
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;

  void append(const void* data, size_t bytes);
  void commit();
  uint64_t size() const { return size_; }
  uint32_t crc() const { return crc_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint32_t crc_ = 0;
};

void fsyncDirectory(const std::string& dir);

// CRC-32C of `bytes` continuing from `crc` (0 to start), as iSCSI and ext4 use it.
uint32_t crc32c(uint32_t crc, const void* data, size_t bytes);

// The CRC-32C of a whole file and its size; throws CommunicationError if it cannot be read.
std::pair<uint64_t, uint32_t> fileSizeAndCrc(const std::string& path);

std::string readWholeFile(const std::string& path, size_t max_bytes);

}  // namespace cxxlaunch::runtime::checkpoint
