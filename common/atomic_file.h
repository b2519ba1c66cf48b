#pragma once
// Files that are either old or complete, never half-written: written under a temporary name in
// the same folder, fsynced, renamed over the final name and the folder fsynced, so that after a
// crash or power loss the name holds either its previous content or all of the new one. The
// config writer, run-summary.json and the checkpoints write through this. Not thread-safe: one
// writer per object; writers of the same path in different processes do not collide (the
// temporary name carries the pid), the last rename wins.

#include <cstddef>
#include <string>
#include <string_view>

namespace cxxlaunch {

// What the file survives once committed. Either way a reader never sees it half-written.
enum class Durability {
  kPowerLoss,     // fsync of the file and of the folder: for what a restart reads back
  kProcessCrash,  // rename only (a crash of the writer leaves the old or the new content; a
                  // power loss may lose both): for reports nothing reads to resume, where two
                  // fsyncs would cost the caller milliseconds, tens of them on a busy disk
};

// An open file being written: append, then commit(). Destroyed uncommitted (an exception on the
// way), it removes its temporary file and the final name is untouched. Every failing system call
// throws SystemError naming it and the path (ENOSPC, EIO...).
class AtomicFile {
 public:
  explicit AtomicFile(std::string path, Durability durability = Durability::kPowerLoss);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void append(const void* data, size_t bytes);
  // fsync, rename into place, fsync of the folder (kPowerLoss; kProcessCrash: the rename only).
  // Call once.
  void commit();

 private:
  static constexpr size_t kWritebackBytes = size_t{8} << 20;
  std::string path_, temp_;
  Durability durability_;
  int fd_ = -1;
  size_t written_ = 0, writeback_from_ = 0;  // bytes appended; the first not yet sent to disk
};

// `bytes` as the whole content of `path`, through an AtomicFile.
void writeFileAtomically(const std::string& path, std::string_view bytes,
                         Durability durability = Durability::kPowerLoss);

// Makes the folder's entries (a rename, a new file) durable. Throws SystemError.
void fsyncDirectory(const std::string& dir);

}  // namespace cxxlaunch
