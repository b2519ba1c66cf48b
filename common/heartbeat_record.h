#pragma once
// What a worker's heartbeat file holds: its training progress, for the launcher's progress line
// (docs/observability.md), `cxxlaunch status` and the run summary. The file's modification time
// stays the heartbeat itself (the launcher's --watchdog_timeout and status's "last progress"
// read only that), so a file without a record, or with one this launcher cannot read, is still a
// heartbeat.
//
// The record is one line of text of a fixed size, rewritten in place (pwrite at offset 0, no
// truncation, no rename): a reader never finds the file shorter than a record. A checksum at the
// end catches a read that raced a rewrite; such a read is dropped and the next one is used.
//
//   cxxlaunch-heartbeat 1 steps=120 total=600 step_us=52000 work_us=31000 loss=0.4312 sum=216f528f
//
// Fields a newer writer adds are ignored by an older reader; a missing field is unknown.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace cxxlaunch {

struct HeartbeatRecord {
  int64_t steps = 0;           // training steps done (accumulation cycles, a resumed run's too)
  int64_t total = 0;           // steps the run will take; 0: unknown
  std::optional<double> loss;  // the latest the trainer reported (to 9 digits: a float's)
  // Mean over the last steps (the runtime's window), in microseconds; 0: none yet. step_us is
  // wall time per step; work_us leaves out the time this rank waited in collectives for its
  // peers, so a straggler's is the largest (docs/observability.md).
  int64_t step_us = 0;
  int64_t work_us = 0;
  bool operator==(const HeartbeatRecord&) const = default;
};

// The size of every record, its newline included.
inline constexpr size_t kHeartbeatRecordBytes = 192;

// `record` as the kHeartbeatRecordBytes bytes a heartbeat file holds.
std::string formatHeartbeatRecord(const HeartbeatRecord& record);

// The record in `text` (a heartbeat file's contents); nullopt when there is none (an empty file,
// a torn read, another format).
std::optional<HeartbeatRecord> parseHeartbeatRecord(std::string_view text);

// Reads the heartbeat file at `path` (at most a record's worth); nullopt when it cannot be read
// or holds no record.
std::optional<HeartbeatRecord> readHeartbeatRecord(const std::string& path);

}  // namespace cxxlaunch
