#include "runtime/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/file.h"
#include "common/host_memory.h"
#include "common/sha256.h"
#include "tensorfile/files.h"
#include "tensorfile/safetensors_file.h"
#include "tensorfile/safetensors_folder.h"

namespace cxxlaunch::runtime::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr const char* kIndex = tensorfile::kSafetensorsIndexName;

const std::vector<std::pair<const char*, c10::ScalarType>>& dtypes() {
  static const std::vector<std::pair<const char*, c10::ScalarType>> table = {
      {"F64", c10::ScalarType::Double}, {"F32", c10::ScalarType::Float},
      {"F16", c10::ScalarType::Half},   {"BF16", c10::ScalarType::BFloat16},
      {"I64", c10::ScalarType::Long},   {"I32", c10::ScalarType::Int},
      {"I16", c10::ScalarType::Short},  {"I8", c10::ScalarType::Char},
      {"U8", c10::ScalarType::Byte},    {"BOOL", c10::ScalarType::Bool}};
  return table;
}

c10::ScalarType scalarTypeOf(const std::string& name) {
  for (const auto& [n, type] : dtypes()) {
    if (name == n) return type;
  }
  throw InvalidArgument("dtype " + name + " has no LibTorch type to read it into");
}

void writeAt(int fd, const std::string& path, uint64_t offset, const void* data, size_t bytes) {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pwrite(fd, static_cast<const char*>(data) + done, bytes - done,
                               static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw CommunicationError("cannot write '" + path + "': " + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

}  // namespace

const char* safetensorsDtypeName(c10::ScalarType t) {
  for (const auto& [name, type] : dtypes()) {
    if (type == t) return name;
  }
  throw InvalidArgument(std::string("safetensors has no dtype for ") + c10::toString(t));
}

SafetensorsReader::SafetensorsReader(const std::string& path)
    : path_(path), folder_(std::make_unique<tensorfile::SafetensorsFolder>(path)) {
  for (const auto& file : folder_->files()) {
    for (const auto& e : file.tensors) entries_[e.name] = e;
  }
}

SafetensorsReader::~SafetensorsReader() = default;

void SafetensorsReader::readFloat(const std::string& name, int64_t begin, int64_t end,
                                  float* out) const {
  const tensorfile::SafetensorsEntry& e = entries_.at(name);
  const size_t size = tensorfile::safetensorsDtypeSize(e.dtype);
  if (e.dtype == "F32") {
    return folder_->read(name, static_cast<uint64_t>(begin) * size,
                         static_cast<size_t>(end - begin) * size, out);
  }
  const c10::ScalarType type = scalarTypeOf(e.dtype);
  if (!c10::isFloatingType(type)) {
    throw InvalidArgument("safetensors '" + path_ + "': '" + name + "' is " + e.dtype +
                          ", not a floating-point tensor");
  }
  // Converted through a bounded buffer: a shard of a big tensor is never held twice.
  constexpr int64_t kChunk = 1 << 20;
  torch::Tensor raw = torch::empty({std::min(kChunk, end - begin)}, torch::dtype(type));
  for (int64_t done = begin; done < end; done += kChunk) {
    const int64_t n = std::min(kChunk, end - done);
    folder_->read(name, static_cast<uint64_t>(done) * size, static_cast<size_t>(n) * size,
                  raw.data_ptr());
    torch::from_blob(out + (done - begin), {n}, torch::kFloat).copy_(raw.narrow(0, 0, n));
  }
}

torch::Tensor SafetensorsReader::tensor(const std::string& name) const {
  const tensorfile::SafetensorsEntry& e = entries_.at(name);
  torch::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(scalarTypeOf(e.dtype)));
  prefaultForWriting(t.data_ptr(), static_cast<size_t>(e.end - e.begin));
  folder_->read(name, 0, static_cast<size_t>(e.end - e.begin), t.data_ptr());
  return t;
}

std::string SafetensorsReader::fingerprint() const {
  constexpr uint64_t kSample = 4096;
  Sha256 hash;
  std::string sample;
  for (const auto& [name, e] : entries_) {  // std::map: in name order
    std::string head = name + '\0' + e.dtype;
    for (int64_t d : e.shape) head += ':' + std::to_string(d);
    hash.update(head + '\0');
    const uint64_t bytes = e.end - e.begin;
    for (uint64_t at : {uint64_t{0}, bytes / 2, bytes > kSample ? bytes - kSample : 0}) {
      sample.resize(static_cast<size_t>(std::min(kSample, bytes - std::min(at, bytes))));
      folder_->read(name, at, sample.size(), sample.data());
      hash.update(sample);
    }
  }
  return "sha256:" + hash.hexDigest();
}

SafetensorsWriter::SafetensorsWriter(std::string dir, uint64_t max_file_bytes,
                                     std::vector<Planned> plan)
    : dir_(std::move(dir)) {
  std::vector<tensorfile::SafetensorsTensor> layout;
  std::vector<uint64_t> bytes;
  for (const auto& p : plan) {
    layout.push_back({p.name, safetensorsDtypeName(p.dtype), p.shape});
    bytes.push_back(tensorfile::safetensorsBytes(layout.back()));
  }
  std::vector<size_t> starts = tensorfile::safetensorsFileStarts(bytes, max_file_bytes);
  fs::create_directories(dir_);
  starts.push_back(plan.size());
  for (size_t f = 0; f + 1 < starts.size(); ++f) {
    const std::vector<tensorfile::SafetensorsTensor> mine(layout.begin() + starts[f],
                                                          layout.begin() + starts[f + 1]);
    const std::string head = tensorfile::safetensorsHead(mine);
    temporary_.push_back(dir_ + "/.part-" + std::to_string(f));
    names_.emplace_back();
    const int fd = ::open(temporary_.back().c_str(),
                          O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
      throw CommunicationError("cannot write '" + temporary_.back() + "': " + std::strerror(errno));
    }
    fds_.push_back(fd);
    writeAt(fd, temporary_.back(), 0, head.data(), head.size());
    uint64_t at = head.size();
    for (size_t i = starts[f]; i < starts[f + 1]; ++i) {
      names_.back().push_back(plan[i].name);
      places_[plan[i].name] = Place{f, at, plan[i]};
      at += bytes[i];
      total_bytes_ += bytes[i];
    }
  }
}

SafetensorsWriter::~SafetensorsWriter() {
  for (const int fd : fds_) ::close(fd);
  if (finished_) return;
  std::error_code ec;
  for (const auto& path : temporary_) fs::remove(path, ec);
}

void SafetensorsWriter::add(const std::string& name, const torch::Tensor& tensor) {
  auto it = places_.find(name);
  if (it == places_.end() || it->second.written) {
    throw InvalidArgument("safetensors export: '" + name + "' is " +
                          (it == places_.end() ? "not in the plan" : "written twice"));
  }
  Place& place = it->second;
  if (tensor.sizes().vec() != place.planned.shape || tensor.scalar_type() != place.planned.dtype) {
    throw InvalidArgument("safetensors export: '" + name +
                          "' is not of its planned shape and dtype");
  }
  const torch::Tensor t = tensor.detach().to(torch::kCPU).contiguous();
  writeAt(fds_[place.file], temporary_[place.file], place.offset, t.data_ptr(), t.nbytes());
  place.written = true;
}

void writeSafetensorsFile(const std::string& path,
                          const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  std::vector<tensorfile::SafetensorsTensor> layout;
  std::vector<torch::Tensor> data;
  for (const auto& [name, tensor] : tensors) {
    data.push_back(tensor.detach().to(torch::kCPU).contiguous());
    layout.push_back(
        {name, safetensorsDtypeName(data.back().scalar_type()), data.back().sizes().vec()});
  }
  tensorfile::SafetensorsFileWriter file(path, layout);
  for (const auto& t : data) file.append(t.data_ptr(), t.nbytes());
  file.commit();
}

std::vector<std::string> SafetensorsWriter::finish() {
  for (const auto& [name, place] : places_) {
    if (!place.written) {
      throw InvalidArgument("safetensors export: '" + name + "' was planned but never written");
    }
  }
  for (size_t i = 0; i < fds_.size(); ++i) {
    if (::fsync(fds_[i]) != 0) {
      throw CommunicationError("cannot sync '" + temporary_[i] + "': " + std::strerror(errno));
    }
  }
  std::vector<std::string> files;
  const size_t n = temporary_.size();
  std::vector<std::pair<std::string, std::string>> weight_map;
  for (size_t i = 0; i < n; ++i) {
    const std::string name = tensorfile::safetensorsFileName(i, n);
    fs::rename(temporary_[i], dir_ + "/" + name);
    for (const auto& tensor : names_[i]) weight_map.emplace_back(tensor, name);
    files.push_back(name);
  }
  if (n > 1) {
    tensorfile::writeSafetensorsIndex(dir_, total_bytes_, weight_map);
    files.push_back(kIndex);
  } else {
    std::error_code ec;
    fs::remove(dir_ + "/" + kIndex, ec);  // a stale one from a bigger export
  }
  fsyncDirectory(dir_);
  finished_ = true;
  return files;
}

void readSafetensors(const std::string& path,
                     const std::function<void(const std::string&, const torch::Tensor&)>& visit) {
  const SafetensorsReader reader(path);
  for (const auto& [name, entry] : reader.entries()) visit(name, reader.tensor(name));
}

}  // namespace cxxlaunch::runtime::checkpoint
