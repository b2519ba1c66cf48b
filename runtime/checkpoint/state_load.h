#pragma once
// One load of a strategy's state (state_view.h) from a checkpoint or an exported model: the
// strategy says where each range goes, this reads it there. Reads land in float32 host memory,
// straight in the destination where it is such memory, else through a host copy (HostStaging).
// State every rank holds whole (DDP) is read from the disk once over the ranks and broadcast.
//
//   checkpoint::StateLoad load(reader, backend);
//   strategy.fillState(load);
//   load.finish();  // throws the first read that failed, after every rank's collectives
//
// Thread-safety: one training thread.

#include <exception>
#include <utility>
#include <vector>

#include "runtime/comm/backend.h"
#include "runtime/state_view.h"
#include "tensorfile/reader.h"

namespace cxxlaunch::runtime::checkpoint {

// Where a load's reads land: float32 host memory. A tensor that is such memory (contiguous
// float32 on the CPU) is read into directly; any other (a GPU worker's, another dtype, a strided
// view) through a host copy of it that copyBack() copies in once everything was read.
class HostStaging {
 public:
  float* hostOf(const torch::Tensor& destination);
  void copyBack();

 private:
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies_;  // (destination, host)
};

class StateLoad final : public StateSource {
 public:
  // From a checkpoint: replicated state is read once over the ranks of `backend`.
  StateLoad(const tensorfile::Reader& reader, Backend& backend);
  // From an exported model (or any source): every rank reads what it needs.
  explicit StateLoad(const tensorfile::Source& source);

  bool has(const std::string& param, const std::string& array) const override;
  int64_t wholeCounter(const std::string& key, int64_t fallback) const override;
  void read(const std::vector<StateRead>& reads) override;
  void readReplicated(const std::vector<StateRead>& reads,
                      const std::vector<int>& readers) override;
  bool failed() const override { return failure_ != nullptr; }
  // Throws the first read that failed, if any.
  void finish();

 private:
  // Each rank reads the requests `readers` gives it and broadcasts them, one parameter read while
  // the last is sent. Every request is checked on every rank first, so that all of them refuse
  // a checkpoint that does not fit. A rank whose reading fails keeps its place in the
  // broadcasts; then every rank fails.
  void readShared(const std::vector<tensorfile::ReadRequest>& reads,
                  const std::vector<int>& readers);

  const tensorfile::Source& source_;
  const tensorfile::Reader* reader_ = nullptr;  // when the source is a checkpoint
  Backend* backend_ = nullptr;
  std::exception_ptr failure_;
};

}  // namespace cxxlaunch::runtime::checkpoint
