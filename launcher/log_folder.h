#pragma once
// A job's log folder, made so that no other local user can read the logs or turn the launcher's
// writes onto someone else's files. The default base lives in a folder every user may write
// ($TMPDIR, /tmp), where anyone can take the name first, as a folder of theirs or as a symlink:
// it is used only when it is a folder of ours that no one else may write, else the logs go to a
// fresh private folder (mkdtemp) and the note says why. Below the base (the default one or
// --log_dir, which is the user's choice and used as given) every folder is made or reused
// without following a symlink, and reused only when it is ours and no one else may write it; log
// files are created fresh (O_EXCL) without following a symlink (output.h).
//
// Free functions without state: safe from any thread.

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

namespace cxxlaunch::launcher {

struct LogFolder {
  std::filesystem::path path;  // the run's folder: exists, ours
  mode_t folder_mode = 0700;   // for the folders made below it
  mode_t file_mode = 0600;     // for the files made in them
  std::string note;            // why the default base was not used; empty when it was
};

// `log_dir`/`components...`, made as needed. `log_dir` empty: the default base
// $TMPDIR/cxxlaunch-<uid> (/tmp without TMPDIR), folders 0700 and files 0600; else folders 0755
// and files 0644. Throws Error naming the folder when one below the base is a symlink, is not
// ours or is writable by others; SystemError when one cannot be made.
LogFolder makeRunFolder(const std::string& log_dir, const std::vector<std::string>& components);

// `parent`/`names...`, each made with `mode` or reused, checked as above; `parent` is trusted.
// Returns the path. Throws as makeRunFolder does.
std::filesystem::path makeSubfolders(const std::filesystem::path& parent,
                                     const std::vector<std::string>& names, mode_t mode);

}  // namespace cxxlaunch::launcher
