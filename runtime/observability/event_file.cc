#include "runtime/observability/event_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "common/error.h"
#include "common/host.h"
#include "proto/tensorboard_event.h"
#include "tensorfile/files.h"

namespace cxxlaunch::runtime {
namespace {

void putLittleEndian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

uint32_t maskedCrc32c(std::string_view bytes) {
  const uint32_t crc = tensorfile::crc32c(0, bytes.data(), bytes.size());
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfRecord(std::string_view data) {
  std::string length;
  putLittleEndian(length, data.size(), 8);
  std::string record = length;
  putLittleEndian(record, maskedCrc32c(length), 4);
  record.append(data);
  putLittleEndian(record, maskedCrc32c(data), 4);
  return record;
}

EventFileWriter::EventFileWriter(int dir_fd, const std::string& dir) {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const double wall_time = std::chrono::duration<double>(now).count();
  char seconds[32];
  std::snprintf(
      seconds, sizeof(seconds), "%010lld",
      static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(now).count()));
  std::string name = "events.out.tfevents." + std::string(seconds) + "." + hostName();
  constexpr int kFlags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW;
  fd_ = ::openat(dir_fd, name.c_str(), kFlags, 0644);
  if (fd_ < 0 && errno == EEXIST) {
    name += "." + std::to_string(::getpid());
    fd_ = ::openat(dir_fd, name.c_str(), kFlags, 0644);
  }
  path_ = dir + "/" + name;
  if (fd_ < 0) throw SystemError("open " + path_, errno);
  append(tfRecord(tensorboard::fileVersionEvent(wall_time)));
}

EventFileWriter::~EventFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void EventFileWriter::writeScalars(double wall_time, int64_t step,
                                   const std::vector<std::pair<std::string, double>>& scalars) {
  append(tfRecord(tensorboard::scalarsEvent(wall_time, step, scalars)));
}

void EventFileWriter::append(const std::string& record) {
  size_t done = 0;
  while (done < record.size()) {
    const ssize_t n = ::write(fd_, record.data() + done, record.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw SystemError("write " + path_, errno);
    done += static_cast<size_t>(n);
  }
}

}  // namespace cxxlaunch::runtime
