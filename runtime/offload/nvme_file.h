#pragma once
// NvmeFile: one rank's swap file on local disk (DeepSpeed's ZeRO-Infinity `nvme_path`), holding
// the optimizer state and, under ZeRO-3, the fp32 master parameters that rest off memory.
//
//   - The file is created unnamed in the directory (O_TMPFILE, else created and unlinked at once):
//     nothing is left behind however the process ends, and nothing else can open it.
//   - Its whole size is allocated up front (allocate()), so a full disk is an error before
//     training starts, never in the middle of a step.
//   - I/O bypasses the page cache (O_DIRECT) where the filesystem allows it, so what is moved
//     out really leaves memory; buffers, offsets and sizes are then kAlignment-aligned
//     (alignedBuffer() makes such buffers, reserve() such regions).
//   - Reads and writes run on the file's own thread, in submission order, each returning a Work
//     (backend.h): the caller overlaps them with compute.
//
// Thread-safety: reserve/allocate on one thread before any I/O; read/write from any thread.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/comm/backend.h"
#include "runtime/comm/comm_thread.h"

namespace cxxlaunch::runtime {

class NvmeFile {
 public:
  static constexpr size_t kAlignment = 4096;

  // Opens the swap file in `dir`; `what` names the setting for messages
  // ("offload_optimizer_nvme_path"). Throws InvalidArgument when `dir` is not an existing,
  // writable directory.
  NvmeFile(const std::string& dir, const std::string& what);
  ~NvmeFile();
  NvmeFile(const NvmeFile&) = delete;
  NvmeFile& operator=(const NvmeFile&) = delete;

  // A region of `bytes` rounded up to kAlignment; returns its offset. Before allocate().
  int64_t reserve(size_t bytes);
  // Allocates every reserved byte on disk (zeros). Throws InvalidArgument naming the directory,
  // the bytes needed and the bytes free when the disk cannot hold them.
  void allocate();

  // `bytes` (a multiple of kAlignment) at `offset`, to or from a kAlignment-aligned buffer that
  // must stay alive until the Work completes.
  WorkPtr read(int64_t offset, void* to, size_t bytes);
  WorkPtr write(int64_t offset, const void* from, size_t bytes);

  size_t size() const { return static_cast<size_t>(size_); }
  const std::string& directory() const { return dir_; }
  bool direct() const { return direct_; }  // whether I/O bypasses the page cache

  static size_t roundUp(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

 private:
  std::string dir_, what_;
  int fd_ = -1;
  bool direct_ = false;
  int64_t size_ = 0;
  bool allocated_ = false;
  CommThread io_;  // last: drains before the file closes
};

// A float buffer of `numel` elements (zeroed), aligned and padded for NvmeFile's I/O.
struct AlignedBuffer {
  std::shared_ptr<float> data;
  size_t bytes = 0;  // padded to a multiple of NvmeFile::kAlignment
};
AlignedBuffer alignedBuffer(size_t numel);

}  // namespace cxxlaunch::runtime
