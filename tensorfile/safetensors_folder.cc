#include "tensorfile/safetensors_folder.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <map>
#include <set>

#include "common/error.h"
#include "common/file.h"
#include "tensorfile/files.h"
#include "tensorfile/safetensors_file.h"

namespace cxxlaunch::tensorfile {

namespace fs = std::filesystem;

namespace {
constexpr uint64_t kMaxHeader = 100u << 20;  // as the reference implementation
}  // namespace

struct SafetensorsFolder::Open {
  std::string path;
  int fd = -1;
  uint64_t size = 0;
  uint64_t data_start = 0;

  explicit Open(const std::string& p) : path(p) {
    OpenFile file = openRegularFile(p, "safetensors");
    size = file.size();
    fd = file.release();
  }
  ~Open() { ::close(fd); }
  Open(const Open&) = delete;
  Open& operator=(const Open&) = delete;

  void read(uint64_t offset, void* out, size_t bytes) const {
    size_t done = 0;
    while (done < bytes) {
      const ssize_t n = ::pread(fd, static_cast<char*>(out) + done, bytes - done,
                                static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw InvalidArgument("safetensors '" + path + "': truncated");
      done += static_cast<size_t>(n);
    }
  }

  // The header's entries in the order of their data.
  std::vector<SafetensorsEntry> entries() {
    auto bad = [&](const std::string& why) {
      return InvalidArgument("safetensors '" + path + "' is corrupt: " + why);
    };
    if (size < 8) throw bad("shorter than its header length");
    unsigned char length[8];
    read(0, length, 8);
    uint64_t header_bytes = 0;
    for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | length[i];
    if (header_bytes > kMaxHeader || header_bytes > size - 8) {
      throw bad("header length " + std::to_string(header_bytes) + " beyond the file");
    }
    std::string header(header_bytes, '\0');
    read(8, header.data(), header.size());
    data_start = 8 + header_bytes;
    std::vector<SafetensorsEntry> parsed;
    try {
      parsed = parseSafetensorsHeader(header, size - data_start);
    } catch (const InvalidArgument& e) {
      throw bad(e.what());
    }
    std::sort(
        parsed.begin(), parsed.end(),
        [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.begin < b.begin; });
    return parsed;
  }
};

SafetensorsFolder::SafetensorsFolder(const std::string& path) {
  auto open = [&](const std::string& name, const std::string& file_path,
                  const std::set<std::string>* only) {
    open_.push_back(std::make_unique<Open>(file_path));
    File file{name, {}};
    for (auto& e : open_.back()->entries()) {
      if (only != nullptr && only->count(e.name) == 0) continue;
      where_[e.name] = {files_.size(), file.tensors.size()};
      file.tensors.push_back(std::move(e));
    }
    files_.push_back(std::move(file));
  };
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    open(fs::path(path).filename().string(), path, nullptr);
    return;
  }
  const std::string index = path + "/" + kSafetensorsIndexName;
  if (!fs::exists(fs::symlink_status(index, ec))) {
    open("model.safetensors", path + "/model.safetensors", nullptr);
    return;
  }
  indexed_ = true;
  std::map<std::string, std::set<std::string>> by_file;
  try {
    by_file = parseSafetensorsIndex(readWholeFile(index, 64u << 20));
  } catch (const InvalidArgument& e) {
    throw InvalidArgument("'" + index + "': " + e.what());
  }
  for (const auto& [file, tensors] : by_file) {
    open(file, path + "/" + file, &tensors);
    for (const auto& name : tensors) {
      const auto at = where_.find(name);
      if (at == where_.end() || at->second.first != files_.size() - 1) {
        throw InvalidArgument("'" + index + "' puts '" + name + "' in " + file +
                              ", which does not hold it");
      }
    }
  }
}

SafetensorsFolder::~SafetensorsFolder() = default;

const SafetensorsEntry* SafetensorsFolder::find(const std::string& name) const {
  const auto at = where_.find(name);
  return at == where_.end() ? nullptr : &files_[at->second.first].tensors[at->second.second];
}

void SafetensorsFolder::read(const std::string& name, uint64_t offset, size_t bytes,
                             void* out) const {
  const auto& [file, tensor] = where_.at(name);
  const SafetensorsEntry& e = files_[file].tensors[tensor];
  if (offset + bytes > e.end - e.begin) {
    throw InvalidArgument("read past the end of tensor '" + name + "'");
  }
  const Open& o = *open_[file];
  o.read(o.data_start + e.begin + offset, out, bytes);
}

}  // namespace cxxlaunch::tensorfile
