#include "tensorfile/merge_output.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <iterator>
#include <optional>

#include "common/atomic_file.h"
#include "common/error.h"
#include "tensorfile/manifest.h"

namespace cxxlaunch::tensorfile {
namespace {

namespace fs = std::filesystem;

// Whether `inner` lies strictly inside `outer` (both real paths).
bool inside(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i) {
    if (i == inner.end() || *i != *o) return false;
  }
  return i != inner.end();
}

// Whether process `pid` may still be the merge that made a leftover: it exists (or we may not
// ask) and its command line has a `merge-weights` argument (or cannot be read).
bool mayBeMerge(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  if (!in) return true;  // /proc hidden (hidepid): assume it is
  const std::string cmdline{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  size_t start = 0;
  for (size_t end; (end = cmdline.find('\0', start)) != std::string::npos; start = end + 1) {
    if (cmdline.compare(start, end - start, "merge-weights") == 0) return true;
  }
  return false;  // another program (the id was reused), or a zombie (no command line)
}

// Whether a process holds the lock of folder `path`.
bool locked(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  const bool held = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);  // releases the lock if we took it
  return held;
}

}  // namespace

fs::path realPath(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  if (ec) p = fs::path(path);
  fs::path resolved = fs::weakly_canonical(p, ec);
  if (ec) resolved = p.lexically_normal();  // a loop of links: compare as written
  while (!resolved.has_filename() && resolved.has_relative_path()) {
    resolved = resolved.parent_path();  // "model/"
  }
  return resolved;
}

void refuseOverlap(const std::string& output, const std::string& input, const std::string& what) {
  const fs::path out = realPath(output), in = realPath(input);
  std::string how;
  if (out == in) {
    how = "is the " + what + " '" + input + "'";
    if (output != input) how += " (both resolve to '" + out.string() + "')";
  } else if (inside(out, in)) {
    how = "lies inside the " + what + " '" + input + "'";
  } else if (inside(in, out)) {
    how = "contains the " + what + " '" + input + "'";
  } else {
    return;
  }
  throw InvalidArgument("output '" + output + "' " + how +
                        ": merge-weights never writes where it reads (--overwrite would remove "
                        "it); name a folder outside it");
}

std::vector<std::string> removeLeftovers(const fs::path& output, bool output_in_place) {
  std::vector<std::string> removed;
  const std::string prefix = "." + output.filename().string() + ".merge-";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(output.parent_path(), ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    std::string digits = name.substr(prefix.size());
    const bool aside = digits.size() > 4 && digits.compare(digits.size() - 4, 4, ".old") == 0;
    if (aside) digits.resize(digits.size() - 4);
    const auto pid = wholeNumber(digits);
    if (!pid || *pid <= 0 || *pid == ::getpid() ||
        digits.find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    if (aside && !output_in_place) continue;
    if (mayBeMerge(static_cast<pid_t>(*pid))) continue;
    if (!aside && locked(entry.path())) continue;
    std::error_code remove_ec;
    fs::remove_all(entry.path(), remove_ec);
    if (!remove_ec) removed.push_back(entry.path().string());
  }
  return removed;
}

FolderLock::FolderLock(const std::string& path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd_ >= 0 && ::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);
}

StagedOutput::StagedOutput(const std::string& output, bool overwrite) {
  output_ = fs::absolute(output).lexically_normal();
  if (!output_.has_filename()) output_ = output_.parent_path();  // "model/"
  std::error_code ec;
  exists_ = fs::exists(fs::symlink_status(output_, ec));
  if (exists_ && !(fs::is_directory(output_, ec) && fs::is_empty(output_, ec)) && !overwrite) {
    throw InvalidArgument("output '" + output +
                          "' exists and is not empty; pass --overwrite to replace it");
  }
}

StagedOutput::~StagedOutput() {
  lock_.reset();
  std::error_code ec;
  if (!done_ && !staging_.empty()) fs::remove_all(staging_, ec);
}

const std::string& StagedOutput::begin(std::vector<std::string>& notes) {
  const fs::path parent = output_.parent_path();
  fs::create_directories(parent);
  for (const auto& path : removeLeftovers(output_, exists_)) {
    notes.push_back("removed '" + path + "', left by a merge that was killed");
  }
  staging_ = (parent / ("." + output_.filename().string() + ".merge-" + std::to_string(::getpid())))
                 .string();
  fs::remove_all(staging_);
  fs::create_directories(staging_);
  lock_ = std::make_unique<FolderLock>(staging_);  // tells other merges that this one runs
  return staging_;
}

void StagedOutput::commit(std::vector<std::string>& notes) {
  fsyncDirectory(staging_);
  // An OUTPUT being replaced is moved aside first, so that a crash leaves either it or the new one.
  const std::string aside = staging_ + ".old";
  std::error_code ec;
  if (exists_ && !(fs::is_directory(output_, ec) && fs::is_empty(output_, ec))) {
    fs::remove_all(aside);
    fs::rename(output_, aside);
  }
  fs::rename(staging_, output_);  // over an empty folder, or where nothing is
  done_ = true;
  lock_.reset();
  fsyncDirectory(output_.parent_path().string());
  fs::remove_all(aside, ec);
  for (const auto& path : removeLeftovers(output_, /*output_in_place=*/true)) {
    notes.push_back("removed '" + path + "', left by a merge that was killed");
  }
}

}  // namespace cxxlaunch::tensorfile
