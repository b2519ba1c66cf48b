#pragma once
// State views: how a strategy describes the model state it holds, so that checkpoint/ can save,
// load and reshard it without knowing the strategy, and the strategy knows nothing of files
// (PyTorch DCP's planner / storage split). A view is one parameter's element range on this rank
// with its float32 arrays by name: "param" (the fp32 values), then the optimizer's (exp_avg,
// exp_avg_sq, ...). Because a view names the parameter and its elements, not a shard, state saved
// by any strategy at any world size loads into any other.
//
//   saving:  Strategy::stateStream(type)  this rank's views (every element in exactly one rank's),
//                                         or everything whole on rank 0; filled as it is written
//   loading: Strategy::fillState(source)  the strategy names where each range goes (StateRead);
//                                         the source (checkpoint/state_load.h) reads it there
//
// Thread-safety: one training thread.

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/env.h"  // StateDictType

namespace cxxlaunch::runtime {

// Elements [begin, end) of the flattened parameter `param` (whose whole shape is `shape`).
struct StateView {
  std::string param;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;
  std::vector<std::pair<std::string, torch::Tensor>> arrays;  // float32, end - begin elements
};

// A view without its arrays' data: what a file's header says before the data is streamed in.
struct StateLayout {
  std::string param;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;
  std::vector<std::string> arrays;
};

// This rank's part of a checkpoint as it is written: the layout of its file first, then produce()
// hands the layout's arrays in that order, each filled only then (read back from nvme, gathered
// from the shards), so that saving holds one unit's array at a time, not the whole state.
// produce() is a collective where the arrays are gathered (the full layout): every rank runs it,
// and on a rank whose layout is empty it hands nothing.
struct StateStream {
  std::vector<StateLayout> layout;
  std::function<void(const std::function<void(const torch::Tensor&)>& write)> produce;
  // Whether each array produce() hands stays as it is until the save is over (a view of the
  // state, not a buffer the next gather reuses): copies from it may then be queued (a GPU's).
  bool arrays_stay = false;
};
// The stream of views whose arrays are already in hand.
StateStream streamOf(std::vector<StateView> views);

// Counters saved beside the state, the same on every rank (the job's step counts and the like).
using StateCounters = std::map<std::string, std::string>;

// One range a load fills: elements [begin, end) of `array` of parameter `param` (whose shape
// must be `shape`) into `into` (end - begin elements of any dtype and device).
struct StateRead {
  std::string param, array;
  int64_t begin = 0, end = 0;
  std::vector<int64_t> shape;
  torch::Tensor into;
};

// What a strategy fills its state from: a checkpoint, or an exported model (parameters only).
// A read that fails (a corrupt or foreign checkpoint) is not thrown at the strategy: the source
// keeps the first failure and skips further reads, so that every rank finishes the load's
// collectives; whoever made the source throws it once fillState returns.
class StateSource {
 public:
  virtual ~StateSource() = default;
  virtual bool has(const std::string& param, const std::string& array) const = 0;
  // A counter as a number: `fallback` when there is none.
  virtual int64_t wholeCounter(const std::string& key, int64_t fallback) const = 0;
  // Reads every request (their destinations must not overlap); on return they hold it.
  virtual void read(const std::vector<StateRead>& reads) = 0;
  // The same for state every rank holds whole (DDP): a collective in which the storage delivers
  // each byte once, read by `readers[i]` and sent to the others, where the source can; every rank
  // passes the same requests and readers.
  virtual void readReplicated(const std::vector<StateRead>& reads,
                              const std::vector<int>& readers) = 0;
  // Whether a read failed: the strategy then leaves what it would install after the reads (an
  // optimizer's fresh state, its step count) as it was.
  virtual bool failed() const = 0;
};

}  // namespace cxxlaunch::runtime
