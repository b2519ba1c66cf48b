#pragma once
// The output folder of llama_init (finetune stages its export inside OUT: apps/finetune/output.h):
// checked before any work is done, written under OUT.partial beside it and renamed into place
// at the end, and removed again when the writing fails, so that an OUT that exists is complete
// and a failed run leaves nothing behind.
//
// Thread-safety: none needed (no shared state).

#include <filesystem>
#include <string>

namespace cxxlaunch::examples {

// `value` lexically normal and without a trailing separator, so that "OUT/" and "OUT" name one
// folder; an empty path where it names no folder of its own (".", "..", "/").
std::filesystem::path normalOutputPath(const std::string& value);

// Why a folder `out` (normalOutputPath's) cannot be made where it is, or "": the nearest folder
// above it that exists must be a folder this process can write in (the ones in between are
// made when the output is written).
std::string whyCannotMake(const std::filesystem::path& out);

// The path given to `flag` (e.g. "--output_dir") as the output folder's: lexically normal,
// without a trailing separator (so that "OUT/" and "OUT" name one folder, and OUT.partial lies
// beside it, not inside). Throws InvalidArgument, before any work, where the output could not
// be put there: the path names no folder of its own (".", "..", "/"); it exists and is not an
// empty folder (a file, a non-empty folder); it is a symbolic link (refused: the final rename
// would replace the link, not fill the folder it points to); a folder above it is not one or
// cannot be written.
std::string checkOutputDir(const std::string& value, const std::string& flag);

// OUT.partial for OUT. On the process that writes (`owner`): a crashed run's leftover of that
// name is removed at construction, and whatever is there is removed when destroyed before a
// commit succeeded (an exception on the way, a full disk). Other processes only learn the path.
class PartialDir {
 public:
  PartialDir(std::string out, bool owner);
  ~PartialDir();
  PartialDir(const PartialDir&) = delete;
  PartialDir& operator=(const PartialDir&) = delete;
  const std::string& path() const { return partial_; }
  // On the owner: renames OUT.partial to OUT (an empty OUT is replaced). Returns "" or why the
  // rename failed (the folder is then removed by the destructor). Elsewhere: "".
  std::string commit();

 private:
  std::string out_, partial_;
  bool owner_, committed_ = false;
};

}  // namespace cxxlaunch::examples
