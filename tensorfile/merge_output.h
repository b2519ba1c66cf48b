#pragma once
// The output side of `cxxlaunch merge-weights` (merge_weights.h): an OUTPUT that would overlap
// the checkpoint it reads is refused, OUTPUT is written in a staging folder beside it that is
// locked while a merge writes it and swapped in at the end, and what killed merges left beside
// OUTPUT is removed. Internal to merge_weights.cc and merge_lora.cc.
//
// Leftovers: a merge writes `.<OUTPUT's name>.merge-<pid>` beside OUTPUT and, when it replaces
// an OUTPUT, moves the old one aside to `.<name>.merge-<pid>.old` until the new one is in place. A
// merge that was killed leaves them. One is removed when its merge is over: its process is gone
// (kill(pid, 0) fails with ESRCH), or that process id now belongs to a process that is not a
// merge (its command line has no `merge-weights` argument: the id was reused), and, for a staging
// folder, no process holds its lock (a running merge holds an exclusive flock on its staging
// folder; where the file system has no such locks, the process rule alone decides). An aside
// (the replaced OUTPUT) is removed only while a complete OUTPUT is in place: until then it may
// be the only copy of the old one. Only OUTPUT's own leftovers are touched.
//
// Thread-safety: none needed (free functions over the file system).

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace cxxlaunch::tensorfile {

// `path` as the file system resolves it: absolute, symbolic links and `..` resolved as far as
// the path exists (the rest lexically), no trailing separator.
std::filesystem::path realPath(const std::string& path);

// Throws InvalidArgument when `output` is `input`, lies inside it or contains it, by their real
// paths: merging must never write over what it reads (`--overwrite` would remove it). `what`
// names the input in the message.
void refuseOverlap(const std::string& output, const std::string& input,
                   const std::string& what = "checkpoint");

// Removes the leftovers of merges into `output` (an absolute path) that are over, as the header
// says; asides only with `output_in_place`. Returns the paths removed.
std::vector<std::string> removeLeftovers(const std::filesystem::path& output, bool output_in_place);

// An exclusive flock on the folder `path` for as long as this lives (see above); a file system
// without such locks gives none, silently.
class FolderLock {
 public:
  explicit FolderLock(const std::string& path);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_ = -1;
};

// A merge's OUTPUT, written into a staging folder beside it (so that the final rename stays on
// one file system) and swapped in by commit(): a crash leaves either the old OUTPUT (under its
// own name, or the aside name) or the complete new one. Destroyed uncommitted (an error on the
// way), the staging folder is removed and OUTPUT is as it was.
class StagedOutput {
 public:
  // Checks OUTPUT before anything is read, so that a mistake costs no time: throws
  // InvalidArgument when it exists and is not an empty folder, unless `overwrite`. Writes nothing.
  StagedOutput(const std::string& output, bool overwrite);
  ~StagedOutput();
  StagedOutput(const StagedOutput&) = delete;
  StagedOutput& operator=(const StagedOutput&) = delete;

  // Creates OUTPUT's parent and the locked staging folder, after removing what killed merges
  // into OUTPUT left (a note each). Returns the staging folder's path.
  const std::string& begin(std::vector<std::string>& notes);
  // Makes the staging folder durable and swaps it in for OUTPUT (a note per leftover removed).
  void commit(std::vector<std::string>& notes);

 private:
  std::filesystem::path output_;
  bool exists_ = false;
  std::string staging_;
  std::unique_ptr<FolderLock> lock_;
  bool done_ = false;
};

}  // namespace cxxlaunch::tensorfile
