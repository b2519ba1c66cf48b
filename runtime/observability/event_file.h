#pragma once
// TensorBoard event files: `events.out.tfevents.<seconds>.<host>` holding TFRecords, each
//   uint64 length | uint32 masked CRC-32C of the length | data | uint32 masked CRC-32C of data
// (little-endian), whose data is an Event message (proto/tensorboard.proto). The first record
// is the file-version event TensorBoard looks for; each log() appends one event of scalars and
// hands it to the kernel at once, so TensorBoard shows a running job's values as they come.
//
// Thread-safety: one writer per object.

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cxxlaunch::runtime {

// TFRecord's checksum: CRC-32C rotated right by 15 bits plus a constant, so that a CRC of data
// that holds CRCs is not degenerate.
uint32_t maskedCrc32c(std::string_view bytes);

// `data` framed as one TFRecord.
std::string tfRecord(std::string_view data);

class EventFileWriter {
 public:
  // Creates a new event file in the open folder `dir_fd`, whose path is `dir` (never
  // overwriting a file and never following a symlink: a second writer within the same second
  // gets the pid appended). Throws SystemError naming the path.
  EventFileWriter(int dir_fd, const std::string& dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  void writeScalars(double wall_time, int64_t step,
                    const std::vector<std::pair<std::string, double>>& scalars);
  const std::string& path() const { return path_; }

 private:
  void append(const std::string& record);
  std::string path_;
  int fd_ = -1;
};

}  // namespace cxxlaunch::runtime
