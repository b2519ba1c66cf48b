#include "common/heartbeat_record.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>

namespace cxxlaunch {
namespace {

constexpr std::string_view kMagic = "cxxlaunch-heartbeat 1 ";
constexpr std::string_view kSum = " sum=";

uint32_t fnv1a(std::string_view text) {
  uint32_t hash = 2166136261u;
  for (unsigned char c : text) hash = (hash ^ c) * 16777619u;
  return hash;
}

bool parseInt(std::string_view text, int64_t& out) {
  if (text.empty() || text.size() > 19) return false;
  int64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + (c - '0');
  }
  out = value;
  return true;
}

}  // namespace

std::string formatHeartbeatRecord(const HeartbeatRecord& r) {
  char body[kHeartbeatRecordBytes];
  int n = std::snprintf(
      body, sizeof(body),
      "%.*ssteps=%" PRId64 " total=%" PRId64 " step_us=%" PRId64 " work_us=%" PRId64,
      static_cast<int>(kMagic.size()), kMagic.data(), r.steps, r.total, r.step_us, r.work_us);
  if (r.loss && n > 0 && static_cast<size_t>(n) < sizeof(body)) {
    n += std::snprintf(body + n, sizeof(body) - static_cast<size_t>(n), " loss=%.9g", *r.loss);
  }
  std::string line(body, static_cast<size_t>(std::max(0, n)));
  char sum[32];
  std::snprintf(sum, sizeof(sum), "%.*s%08" PRIx32, static_cast<int>(kSum.size()), kSum.data(),
                fnv1a(line));
  line += sum;
  // Padded to the fixed size: a shorter record overwrites all of a longer one.
  line.resize(kHeartbeatRecordBytes - 1, ' ');
  line.push_back('\n');
  return line;
}

std::optional<HeartbeatRecord> parseHeartbeatRecord(std::string_view text) {
  const size_t newline = text.find('\n');
  if (newline == std::string_view::npos || !text.starts_with(kMagic)) return std::nullopt;
  std::string_view line = text.substr(0, newline);
  while (!line.empty() && line.back() == ' ') line.remove_suffix(1);
  const size_t at = line.rfind(kSum);
  if (at == std::string_view::npos) return std::nullopt;
  char expected[16];
  std::snprintf(expected, sizeof(expected), "%08" PRIx32, fnv1a(line.substr(0, at)));
  if (line.substr(at + kSum.size()) != expected) return std::nullopt;

  HeartbeatRecord r;
  std::string_view fields = line.substr(kMagic.size(), at - kMagic.size());
  while (!fields.empty()) {
    const size_t space = fields.find(' ');
    const std::string_view field = fields.substr(0, space);
    fields = space == std::string_view::npos ? std::string_view() : fields.substr(space + 1);
    const size_t eq = field.find('=');
    if (eq == std::string_view::npos) return std::nullopt;
    const std::string_view key = field.substr(0, eq), value = field.substr(eq + 1);
    bool ok = true;
    if (key == "steps") {
      ok = parseInt(value, r.steps);
    } else if (key == "total") {
      ok = parseInt(value, r.total);
    } else if (key == "step_us") {
      ok = parseInt(value, r.step_us);
    } else if (key == "work_us") {
      ok = parseInt(value, r.work_us);
    } else if (key == "loss") {
      const std::string copy(value);
      char* end = nullptr;
      const double loss = std::strtod(copy.c_str(), &end);
      ok = !copy.empty() && end == copy.c_str() + copy.size();
      r.loss = loss;
    }  // else: a newer writer's field
    if (!ok) return std::nullopt;
  }
  return r;
}

std::optional<HeartbeatRecord> readHeartbeatRecord(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd == -1) return std::nullopt;
  char buffer[2 * kHeartbeatRecordBytes];
  const ssize_t n = ::pread(fd, buffer, sizeof(buffer), 0);
  ::close(fd);
  if (n <= 0) return std::nullopt;
  return parseHeartbeatRecord(std::string_view(buffer, static_cast<size_t>(n)));
}

}  // namespace cxxlaunch
