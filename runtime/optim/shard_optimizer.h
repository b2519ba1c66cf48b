#pragma once
// ShardOptimizer: the optimizer a trainer built (torch::optim::AdamW, Adam or SGD, FusedAdamW
// too), run as fused one-pass kernels (device_kernels.h: CPU or CUDA) on the flat float32 shards a
// sharded strategy owns. Hyperparameters and parameter groups come from the trainer's optimizer
// and are read again at every step, so an LR scheduler driving it keeps working; the trainer's
// optimizer itself never steps and holds no state.
//
// A shard mixes the elements of several parameters, so it is cut into segments of one parameter
// group each. Elementwise optimizers give the same result on any cut of the parameters; one that
// needs a whole parameter (LAMB, second-order methods) cannot be sharded and is refused.
//
// Thread-safety: one thread; on CPU step() splits its loops across LibTorch's intra-op threads.

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>
#include <vector>

namespace cxxlaunch::runtime {

class ShardOptimizer {
 public:
  enum class Kind { kAdamW, kAdam, kSgd };

  // Elements [begin, end) of a shard whose parameters belong to param group `group`.
  struct Segment {
    int64_t begin;
    int64_t end;
    size_t group;
  };

  // Throws InvalidArgument, naming the optimizers it can shard, for any other (or for amsgrad).
  explicit ShardOptimizer(torch::optim::Optimizer& optimizer);

  // The param group holding `param` (the same tensor the optimizer was built with); throws
  // InvalidArgument for a trainable parameter the optimizer does not know.
  size_t groupOf(const torch::Tensor& param) const;

  // Registers a shard of `numel` float32 elements in `device`'s memory (the parameters' device,
  // or the host for cpu offload: stepped by the CPU kernels then); its state (zeros, on the same
  // device) is allocated by allocateState, or at its first step, unless the caller keeps it (nvme
  // offload: `own_state` false). Returns its index for step().
  size_t addShard(int64_t numel, std::vector<Segment> segments, c10::Device device,
                  bool own_state = true);
  // Allocates the shard's state now (zeros) if it was not yet. A strategy calls it once the
  // shard's unit holds the memory it keeps at rest, as DeepSpeed's engine allocates its state
  // when it is built: a job that cannot hold the state fails in prepare, not after its first
  // backward, and a load reads into memory the job already has.
  void allocateState(size_t shard) { allocatedState(shard, /*zeroed=*/true); }
  // How many float32 arrays of a shard's numel its state is (Adam 2, SGD with momentum 1).
  size_t stateArrays() const;

  // Counts one optimizer step; call once before stepping the shards.
  void beginStep() { ++steps_; }
  // Updates `param` (numel of addShard's) in place from `grad`, with the shard's own state, or
  // with `state` (stateArrays() arrays of numel) for a shard whose state the caller keeps.
  void step(size_t shard, float* param, const float* grad, float* const* state = nullptr);
  // The same for elements [begin, end) of the shard only, `param`, `grad` and `state` pointing at
  // element `begin`: a shard streamed through memory in pieces (nvme offload) steps piece by
  // piece, with the same result as in one go (every optimizer here is elementwise).
  void stepRange(size_t shard, int64_t begin, int64_t end, float* param, const float* grad,
                 float* const* state = nullptr);

  Kind kind() const { return kind_; }
  // Checkpoints: the names of a shard's state arrays ("exp_avg", "exp_avg_sq"; SGD:
  // "momentum_buffer"), the shard's own state (allocated if it was not yet), the step count.
  std::vector<std::string> stateNames() const;
  std::vector<torch::Tensor> state(size_t shard);
  // The same, allocated uninitialized if it was not yet: for a load, which writes every element.
  std::vector<torch::Tensor> stateToOverwrite(size_t shard);
  void setSteps(int64_t steps) { steps_ = steps; }
  const char* name() const;
  int64_t steps() const { return steps_; }
  size_t stateBytes() const;

 private:
  struct Shard {
    int64_t numel;
    std::vector<Segment> segments;
    c10::Device device;  // where the shard and its state live: which kernels step it
    bool own_state;
    std::vector<torch::Tensor> state;  // Adam: exp_avg, exp_avg_sq; SGD with momentum: buffer
  };
  torch::optim::Optimizer& optimizer_;
  Kind kind_;
  int64_t steps_ = 0;
  std::vector<Shard> shards_;

  const std::vector<torch::Tensor>& allocatedState(size_t shard, bool zeroed);
};

}  // namespace cxxlaunch::runtime
