#pragma once
// Files that are either old or complete, never half-written: written under a temporary name in
// the same folder, fsynced, renamed over the final name and the folder fsynced, so that after a
// crash or power loss the name holds either its previous content or all of the new one. The
// config writer, run-summary.json and the checkpoints write through this. Not thread-safe: one
// writer per object; writers of the same path in different processes do not collide (the
// temporary name carries the pid), the last rename wins.

#include <sys/types.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace cxxlaunch {

// What the file survives once committed. Either way a reader never sees it half-written.
enum class Durability {
  kPowerLoss,     // fsync of the file and of the folder: for what a restart reads back
  kProcessCrash,  // rename only (a crash of the writer leaves the old or the new content; a
                  // power loss may lose both): for reports nothing reads to resume, where two
                  // fsyncs would cost the caller milliseconds, tens of them on a busy disk
};

// How the bytes travel. Through the page cache by default. kPastPageCache (O_DIRECT) copies
// them into an aligned buffer and writes it straight to the disk: for large files written once
// and not read back soon (checkpoints), whose page-cache copy costs fresh pages the writer's
// process pays for (slow in a virtual machine) and evicts what other processes cache. There are
// two buffers: while a thread of the file's own writes a full one, append() fills the other, so
// that the caller's work between appends (copying, checksums, gathering the next bytes) runs
// while the disk writes. Where the file system refuses O_DIRECT the file is written through the
// page cache.
enum class Writes { kThroughPageCache, kPastPageCache };

// An open file being written: append, then commit(). The temporary file is created with `mode`,
// never through a symlink. Destroyed uncommitted (an exception on the
// way), it removes its temporary file and the final name is untouched. Every failing system call
// throws SystemError naming it and the path (ENOSPC, EIO...); a write of kPastPageCache's thread
// that failed throws from the next append() or from commit().
class AtomicFile {
 public:
  explicit AtomicFile(std::string path, Durability durability = Durability::kPowerLoss,
                      Writes writes = Writes::kThroughPageCache, mode_t mode = 0644);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void append(const void* data, size_t bytes);
  // fsync, rename into place, fsync of the folder (kPowerLoss; kProcessCrash: the rename only).
  // Call once.
  void commit();

 private:
  static constexpr size_t kWritebackBytes = size_t{8} << 20;
  // O_DIRECT wants the buffer's address, the offset and the length aligned to the device's
  // logical block; 4 KiB covers every common one.
  static constexpr size_t kDirectAlignment = 4096, kDirectBufferBytes = size_t{8} << 20;
  void writeAll(const void* data, size_t bytes, uint64_t offset);
  // Hands the full buffer to the writing thread, and append() fills the other one next.
  void writeFullBufferBehind();
  void writeBehindLoop();  // the writing thread's
  // Waits for the writing thread's write. Throws if it failed; if O_DIRECT was refused, writes
  // its bytes and the rest through the page cache.
  void awaitWriteBehind();
  void stopWritingThread();
  void writeLastBuffer();    // the rest of direct_, padded to the alignment (cut off at commit)
  void stopWritingDirect();  // O_DIRECT refused: the rest through the page cache

  std::string path_, temp_;
  Durability durability_;
  int fd_ = -1;
  struct FreeDeleter {
    void operator()(void* p) const;
  };
  // kPastPageCache's buffers, while used: the one append() fills, the other written behind it.
  std::unique_ptr<unsigned char, FreeDeleter> direct_, behind_;
  // Bytes in the file (appended and no longer in direct_); the first the disk was not yet asked
  // to write (through the page cache); bytes in direct_, not yet written (past it).
  size_t on_disk_ = 0, writeback_from_ = 0, buffered_ = 0;

  // The writing thread, started with the first full buffer. While `writing_` it writes behind_
  // at behind_offset_, then records the write's result: 0, EINVAL where O_DIRECT was refused
  // (behind_ then still holds the bytes), or the error.
  std::thread writer_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool writing_ = false, stopping_ = false;
  uint64_t behind_offset_ = 0;
  int behind_result_ = 0;
};

// `bytes` as the whole content of `path`, through an AtomicFile.
void writeFileAtomically(const std::string& path, std::string_view bytes,
                         Durability durability = Durability::kPowerLoss, mode_t mode = 0644);

// Makes the folder's entries (a rename, a new file) durable. Throws SystemError.
void fsyncDirectory(const std::string& dir);

}  // namespace cxxlaunch
