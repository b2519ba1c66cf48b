#pragma once
// ShardStore: where the sharded engine's fp32 shards rest between uses, behind one interface, so
// that ShardedStrategy schedules its units without asking where their memory is. Per unit, three
// kinds of array:
//   master    this rank's fp32 master weights (ShardUnit::master() while it is in memory);
//   state     the optimizer's state arrays (Adam's two moments), ShardOptimizer's in memory;
//   gradient  the fp32 gradient shard the optimizer reads (ShardUnit::gradientShard() in memory).
//             Stage 2-3: the reductions' shards are added into it; stage 0-1: the strategy
//             fills it from the all-reduced buffer.
// Three places, as DeepSpeed and FSDP offer them:
//   device  the model's device (the default)                               MemoryStore
//   host    pinned host memory (cpu offload: offload_optimizer_device and   MemoryStore
//           offload_param_device cpu, FSDP's CPUOffload); the optimizer steps there
//   nvme    swap files (ZeRO-Infinity: offload_optimizer_device nvme for    NvmeStore
//           the state and, at stage 2-3, the gradient; offload_param_device nvme for the master
//           at stage 3), the step streamed through three staging pieces
// An NvmeStore keeps whichever kind has no file in memory, as a MemoryStore does.
//
// Thread-safety: none; the strategy's lock guards every call.

#include <torch/types.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/offload/nvme_file.h"
#include "runtime/optim/shard_optimizer.h"
#include "runtime/reports.h"
#include "runtime/strategy/shard_unit.h"

namespace cxxlaunch::runtime {

class ShardStore {
 public:
  virtual ~ShardStore() = default;

  // Where in-memory shards are made: the model's device, or (pinned) host memory.
  virtual torch::TensorOptions options() const = 0;
  // Whether ShardOptimizer keeps the units' state arrays (false: the store does, in a file).
  virtual bool optimizerKeepsState() const = 0;
  // A unit just built holds its master in u.master(): it moves where it rests.
  virtual void settle(ShardUnit& u) = 0;

  // The master and the optimizer state in memory now: the arrays themselves where they are in
  // memory, read back into buffers the tensors own where they rest in a file.
  virtual torch::Tensor master(ShardUnit& u) = 0;
  virtual std::vector<torch::Tensor> state(ShardUnit& u) = 0;
  // A load: arrays to read the new values into, then put() where they rest.
  virtual torch::Tensor masterToOverwrite(ShardUnit& u) = 0;
  virtual std::vector<torch::Tensor> stateToOverwrite(ShardUnit& u) = 0;
  virtual void put(ShardUnit& u, const torch::Tensor& master,
                   const std::vector<torch::Tensor>& state) = 0;

  // The gradient shard: a reduction's shard added in (stage 2-3); its sum of squares; whether it
  // is all finite; scaled (clipping, unscaling); zeroed (zeroGrad).
  virtual void addGradient(ShardUnit& u, const torch::Tensor& incoming) = 0;
  virtual double gradientSquares(ShardUnit& u) = 0;
  virtual bool gradientFinite(ShardUnit& u) = 0;
  virtual void scaleGradient(ShardUnit& u, float factor) = 0;
  virtual void zeroGradient(ShardUnit& u) = 0;

  // The optimizer over every unit's shard (ShardOptimizer::beginStep already called).
  virtual void step(std::vector<ShardUnit>& units) = 0;
  // What the store holds beyond the units' tensors: files, staging.
  virtual void report(MemoryReport& report) const = 0;
};

// On the model's device, or in host memory (pinned when the model is on a GPU).
class MemoryStore : public ShardStore {
 public:
  // free_gradients_between_steps: zeroGradient frees the shard (ShardingOptions says when).
  MemoryStore(ShardOptimizer& optimizer, torch::TensorOptions options,
              bool free_gradients_between_steps);

  torch::TensorOptions options() const override { return options_; }
  bool optimizerKeepsState() const override { return true; }
  void settle(ShardUnit& /*u*/) override {}
  torch::Tensor master(ShardUnit& u) override { return u.master(); }
  std::vector<torch::Tensor> state(ShardUnit& u) override;
  torch::Tensor masterToOverwrite(ShardUnit& u) override { return u.master(); }
  std::vector<torch::Tensor> stateToOverwrite(ShardUnit& u) override;
  void put(ShardUnit& /*u*/, const torch::Tensor& /*master*/,
           const std::vector<torch::Tensor>& /*state*/) override {}  // read in place
  void addGradient(ShardUnit& u, const torch::Tensor& incoming) override;
  double gradientSquares(ShardUnit& u) override;
  bool gradientFinite(ShardUnit& u) override;
  void scaleGradient(ShardUnit& u, float factor) override;
  void zeroGradient(ShardUnit& u) override;
  void step(std::vector<ShardUnit>& units) override;
  void report(MemoryReport& /*report*/) const override {}

 protected:
  torch::Tensor gradShard(ShardUnit& u);  // sharded gradients: made (zeroed) at first use

  ShardOptimizer& optimizer_;

 private:
  torch::TensorOptions options_;
  bool free_gradients_;
};

// Swap files in the offload directories; in memory what has none.
class NvmeStore final : public MemoryStore {
 public:
  // optimizer_dir: the state, and with `gradients_too` the gradient; param_dir: the master.
  // Either may be empty. `shard_numels`: each unit's, in the order of `units`, whose regions the
  // files reserve and allocate now (a disk that cannot hold them fails here). The units are
  // known by their address from then on: `units` must not be moved or grown.
  NvmeStore(ShardOptimizer& optimizer, torch::TensorOptions options, bool gradients_too,
            const std::string& optimizer_dir, const std::string& param_dir,
            const std::vector<ShardUnit>& units, const std::vector<int64_t>& shard_numels);

  bool optimizerKeepsState() const override { return !state_file_; }
  void settle(ShardUnit& u) override;
  torch::Tensor master(ShardUnit& u) override;
  std::vector<torch::Tensor> state(ShardUnit& u) override;
  torch::Tensor masterToOverwrite(ShardUnit& u) override;
  std::vector<torch::Tensor> stateToOverwrite(ShardUnit& u) override;
  void put(ShardUnit& u, const torch::Tensor& master,
           const std::vector<torch::Tensor>& state) override;
  void addGradient(ShardUnit& u, const torch::Tensor& incoming) override;
  double gradientSquares(ShardUnit& u) override;
  bool gradientFinite(ShardUnit& u) override;
  void scaleGradient(ShardUnit& u, float factor) override;
  void zeroGradient(ShardUnit& u) override;
  void step(std::vector<ShardUnit>& units) override;
  void report(MemoryReport& report) const override;

 private:
  // A unit's places in the files, and what clipping and the loss scaler need of its gradient
  // (read back only by the step, which applies `factor` as it reads).
  struct Regions {
    int64_t master = -1;    // in the param file
    int64_t state = -1;     // in the state file: the arrays one after another
    int64_t gradient = -1;  // in the gradient file
    bool written = false;   // the gradient file holds a gradient since zeroGradient (else zeros)
    double squares = 0;     // sum of squares of the values in the file
    bool finite = true;     // no inf or NaN among them
    float factor = 1;       // clipping and unscaling, applied as the values are read back
  };
  Regions& regions(const ShardUnit& u) { return regions_.at(&u); }
  size_t pieceBytes() const;  // what one array of a piece the step streams takes

  std::unique_ptr<NvmeFile> param_file_, state_file_, grad_file_;
  std::unordered_map<const ShardUnit*, Regions> regions_;
  int64_t largest_shard_ = 0;               // elements of the biggest unit's shard
  std::vector<AlignedBuffer> slots_;        // staging: piece k+1 read, k updated, k-1 written
  std::vector<AlignedBuffer> grad_pieces_;  // addGradient's: one made while one is written
};

}  // namespace cxxlaunch::runtime
