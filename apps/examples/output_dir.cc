#include "apps/examples/output_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/error.h"

namespace cxxlaunch::examples {

namespace fs = std::filesystem;

fs::path normalOutputPath(const std::string& value) {
  fs::path out = fs::path(value).lexically_normal();
  if (!out.has_filename() && out.has_relative_path()) out = out.parent_path();  // "a/b/" -> "a/b"
  const std::string name = out.filename().string();
  if (name.empty() || name == "." || name == "..") return {};
  return out;
}

std::string whyCannotMake(const fs::path& out) {
  struct stat st {};
  for (fs::path above = out.parent_path();; above = above.parent_path()) {
    const fs::path probe = above.empty() ? fs::path(".") : above;  // "a" -> "" -> "."
    if (::stat(probe.c_str(), &st) != 0) {
      if (errno != ENOENT || above.empty()) {
        return "cannot be made in '" + probe.string() + "': " + std::strerror(errno);
      }
      continue;  // made when the output is written
    }
    if (!S_ISDIR(st.st_mode)) return "lies inside '" + probe.string() + "', which is not a folder";
    if (::access(probe.c_str(), W_OK | X_OK) != 0) {
      return "cannot be made in '" + probe.string() + "': " + std::strerror(errno);
    }
    return "";
  }
}

std::string checkOutputDir(const std::string& value, const std::string& flag) {
  auto refuse = [&](const std::string& why) {
    throw InvalidArgument(flag + " '" + value + "' " + why);
  };
  const fs::path out = normalOutputPath(value);
  if (out.empty()) {
    refuse("names no folder of its own; give a new folder's name (such as out/tuned)");
  }
  struct stat st {};
  if (::lstat(out.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) {
      refuse(
          "is a symbolic link; give the folder itself (the output is renamed into place at the "
          "end, which would replace the link rather than fill what it points to)");
    }
    if (!S_ISDIR(st.st_mode)) refuse("exists and is not a folder; give a new folder");
    std::error_code ec;
    if (!fs::is_empty(out, ec) || ec) refuse("exists and is not empty; give a new folder");
  } else if (errno != ENOENT) {
    refuse(std::string("cannot be used: ") + std::strerror(errno));
  }
  // OUT.partial is made beside OUT: in the same folder.
  if (const std::string why = whyCannotMake(out); !why.empty()) refuse(why);
  return out.string();
}

PartialDir::PartialDir(std::string out, bool owner)
    : out_(std::move(out)), partial_(out_ + ".partial"), owner_(owner) {
  std::error_code ec;
  if (owner_) fs::remove_all(partial_, ec);  // a crashed run's leftovers
}

PartialDir::~PartialDir() {
  std::error_code ec;
  if (owner_ && !committed_) fs::remove_all(partial_, ec);
}

std::string PartialDir::commit() {
  if (!owner_) return "";
  std::error_code ec;
  fs::rename(partial_, out_, ec);  // replaces an empty OUT
  if (ec) return "cannot rename " + partial_ + " to " + out_ + ": " + ec.message();
  committed_ = true;
  return "";
}

}  // namespace cxxlaunch::examples
