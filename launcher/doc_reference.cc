#include "launcher/doc_reference.h"

#include <system_error>

namespace cxxlaunch::launcher {

namespace fs = std::filesystem;

std::string docReference(const std::string& page, const std::string& section, const fs::path& exe,
                         const std::string& source_docs) {
  const std::string title = "the " + fs::path(page).stem().string() + " guide";
  const std::string in = section.empty() ? "" : ", section " + section;
  std::error_code ec;
  auto found = [&](const fs::path& path) {
    return fs::is_regular_file(path, ec) ? title + ": " + path.lexically_normal().string() + in
                                         : std::string();
  };
  if (!exe.empty()) {
    if (std::string at = found(exe.parent_path() / CXXLAUNCH_DOCS_FROM_BIN / page); !at.empty())
      return at;
  }
  if (!source_docs.empty()) {
    if (std::string at = found(fs::path(source_docs) / page); !at.empty()) return at;
  }
  return title + " (" + page + in + ", in PREFIX/" + CXXLAUNCH_INSTALL_DOCDIR +
         "/ where cxxlaunch is installed)";
}

std::string docReference(const std::string& page, const std::string& section) {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return docReference(page, section, ec ? fs::path() : exe, CXXLAUNCH_SOURCE_DOCS);
}

}  // namespace cxxlaunch::launcher
