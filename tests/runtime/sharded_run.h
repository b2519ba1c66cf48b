#pragma once
// What the sharded-strategy tests share: one training run of the tower (tower.h) under a
// strategy, ranks as threads over the Fake backend, and the measures that compare two runs.

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/accelerator.h"
#include "tower.h"

namespace cxxlaunch::runtime::testing {

struct Run {
  std::string strategy = "ddp";
  int world = 2;
  std::string optimizer = "adamw";
  int accumulation = 1;
  double clipping = 0;
  WrapPolicy wrap_policy = WrapPolicy::kTransformerBased;
  std::vector<std::string> unit_types = {"Block"};
  int64_t min_num_params = 100000000;  // SIZE_BASED_WRAP
  BackwardPrefetch backward_prefetch = BackwardPrefetch::kPre;
  bool forward_prefetch = false;
  int64_t d = 11, layers = 3;
  int64_t steps = 4;
  bool evaluate = false;  // a forward without autograd after every step (an evaluation pass)
  int64_t batch = 4;      // examples per rank per micro-step
  std::string precision = "no";
  bool loss_scaling = false;
  bool checkpointing = false;    // fsdp_activation_checkpointing
  int nodes = 1;                 // simulated: ranks [k * world / nodes, ...) are node k
  bool wrap_blocks = false;      // Accelerator::wrap on every block (sharded from prepare on)
  bool unit_handles = false;     // the same, the blocks then called through wrap's handles
  std::string nvme_optimizer{};  // offload directories
  std::string nvme_params{};
  int64_t overflow_rank = -1, overflow_step = -1;  // that rank's loss is inf at that micro-step
};

struct Result {
  std::map<std::string, torch::Tensor> params;  // rank 0's whole parameters
  std::vector<MemoryReport> memory;             // per rank, after the last step
  std::string description;
  std::vector<bool> skipped;  // rank 0: whether each optimizer step was skipped
  double loss_scale = 1;
};

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(Tower& net, const std::string& kind);

// Trains `run` and returns rank 0's whole parameters; checks that every rank ends with them.
Result train(const Run& run);

// The largest difference of a parameter between `a` and `b`, relative to `b`'s largest value.
double maxRelativeDifference(const Result& a, const Result& b);

// How far `a`'s parameter updates (from `initial`) are from `b`'s, relative to `b`'s: the measure
// for low precision, where the parameters themselves agree to far more digits than the updates.
double maxRelativeUpdateDifference(const Result& a, const Result& b,
                                   const std::map<std::string, torch::Tensor>& initial);

// The tower's parameters as every run starts from (rank 0's).
std::map<std::string, torch::Tensor> initialParameters(const Run& run);

inline const std::vector<std::string> kShardedStrategies = {
    "zero1", "zero2", "zero3", "fsdp_full_shard", "fsdp_shard_grad_op", "fsdp_no_shard"};

}  // namespace cxxlaunch::runtime::testing
