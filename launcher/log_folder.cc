#include "launcher/log_folder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <utility>

#include "common/error.h"
#include "common/private_folder.h"

namespace cxxlaunch::launcher {
namespace fs = std::filesystem;

fs::path makeSubfolders(const fs::path& parent, const std::vector<std::string>& names,
                        mode_t mode) {
  UniqueFd dir(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) throw SystemError("open " + parent.string(), errno);
  fs::path path = parent;
  for (const std::string& name : names) {
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
      throw InvalidArgument("'" + name + "' cannot name a log folder");
    }
    path /= name;
    PrivateFolder next = openPrivateFolder(dir.get(), name, mode, path.string());
    if (!next.why.empty()) {
      throw Error("the log folder " + path.string() + " is " + next.why +
                  ": refusing to write logs there (remove it, or choose --log_dir)");
    }
    dir = std::move(next.fd);
  }
  return path;
}

LogFolder makeRunFolder(const std::string& log_dir, const std::vector<std::string>& components) {
  LogFolder folder;
  fs::path base = log_dir;
  if (!log_dir.empty()) {
    // The user's own choice of place, symlinks in it included.
    folder.folder_mode = 0755;
    folder.file_mode = 0644;
    fs::create_directories(base);
  } else {
    const char* tmp = std::getenv("TMPDIR");  // NOLINT(concurrency-mt-unsafe)
    const fs::path shared = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
    const std::string name = "cxxlaunch-" + std::to_string(::geteuid());
    base = shared / name;
    const std::string why = openPrivateFolder(AT_FDCWD, base, 0700, base.string()).why;
    if (!why.empty()) {
      std::string own = (shared / (name + "-XXXXXX")).string();
      if (::mkdtemp(own.data()) == nullptr) throw SystemError("mkdtemp " + own, errno);
      folder.note = base.string() + " is " + why + "; the logs go to " + own + " instead";
      base = own;
    }
  }
  folder.path = makeSubfolders(base, components, folder.folder_mode);
  return folder;
}

}  // namespace cxxlaunch::launcher
