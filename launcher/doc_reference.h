#pragma once
// Where a message sends the user to read more: a page of the user guide, named by title and by
// the path where it really is for the running binary. The guide is docs/ in the source tree and
// share/doc/cxxlaunch/ in an installed prefix (cmake/install.cmake), so a fixed "docs/config.md"
// in a message is wrong in one of the two. No state; safe from any thread.

#include <filesystem>
#include <string>

namespace cxxlaunch::launcher {

// "the config guide: /opt/cxxlaunch/share/doc/cxxlaunch/config.md" for `page` "config.md":
// the installed page beside the running binary (BIN/../share/doc/cxxlaunch/PAGE) when it
// exists, else the source tree's docs/PAGE when this is an in-tree build and it exists, else
// the page by title and file name and where an installation keeps it. `section` (optional)
// names a heading of the page: "..., section Slurm".
std::string docReference(const std::string& page, const std::string& section = "");

// The same for a binary at `exe` and a source tree's docs folder `source_docs` ("": none).
std::string docReference(const std::string& page, const std::string& section,
                         const std::filesystem::path& exe, const std::string& source_docs);

}  // namespace cxxlaunch::launcher
