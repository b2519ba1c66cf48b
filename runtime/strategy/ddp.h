#pragma once
// DistributedDataParallel: PyTorch's DDP for a LibTorch module.
//
//   1. At construction, rank 0's parameters and buffers are broadcast to every rank.
//   2. Parameters are grouped into buckets of about 25 MB, in reverse registration order (the
//      order backward produces gradients), each bucket one flat buffer: the sharded strategies'
//      plan (planUnits without module units), and their gradient engine's hooks and readiness
//      (gradient_readiness.h), so that DDP and ZeRO group and launch reductions alike. Where the
//      backend has memory the ranks share (Backend::sharedBuffer: Gloo with every rank on this
//      host), the buckets live there, so the all-reduce reads the peers' gradients in place and
//      writes the average where the optimizer reads it: no copy in or out.
//   3. Gradients live in the buckets (PyTorch's gradient_as_bucket_view): after the first step,
//      param.grad() is a tensor over the parameter's place in its bucket, and autograd
//      accumulates into it. A hook after each parameter's gradient accumulation marks it ready
//      (copying it in only when it lives elsewhere: the first step, or after grads were set to
//      none); when a bucket is complete it is all-reduced (averaged) in place, asynchronously, in
//      bucket order, while the backward goes on. No second copy of the gradients exists.
//   4. finishBackward() (after loss.backward()) fills buckets whose parameters got no gradient
//      (unused in this forward: their share is zero, so no rank waits forever) and waits for
//      every bucket: param.grad() then holds the averaged gradient. With find_unused_parameters
//      one more small all-reduce tells which parameters no rank used: their gradients stay as
//      they were (undefined), as in PyTorch, so optimizers skip them; without it (the default,
//      one collective fewer per step) they get a zero gradient.
//   5. Inside noSync() gradients only accumulate locally; the next synchronised backward reduces
//      the accumulated sum.
//
// Thread-safety: one training thread; autograd may call the hooks from its own threads.

#include <torch/nn/module.h>

#include <memory>
#include <mutex>
#include <vector>

#include "runtime/comm/backend.h"
#include "runtime/strategy/gradient_readiness.h"

namespace cxxlaunch::runtime {

struct DdpOptions {
  size_t bucket_bytes = 25u << 20;
  bool broadcast_initial_state = true;
  bool find_unused_parameters = false;
};

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                          std::shared_ptr<Backend> backend, DdpOptions options = {});
  ~DistributedDataParallel();  // removes the hooks
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Completes the gradient all-reduce of this backward (no-op inside noSync()).
  void finishBackward();

  // While the guard lives, backward passes do not communicate.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  NoSync noSync() { return NoSync(*this); }
  bool syncing() const { return sync_; }

  // Makes every rank's parameters and buffers equal to `root`'s.
  void broadcastState(int root = 0);

  size_t numBuckets() const { return buckets_.size(); }
  // Whether the buckets (and so the gradients) live in memory the ranks share, reduced in place.
  bool bucketsShared() const { return shared_ != nullptr; }
  torch::nn::Module& module() { return *module_; }

 private:
  struct Slot {
    torch::Tensor param;
    int64_t offset;         // in its bucket's flat buffer
    torch::Tensor place{};  // that part of the bucket, shaped like param: its gradient's home
    bool used = false;      // got a gradient on this rank in this backward
  };
  struct Bucket {
    torch::Tensor flat;
    std::vector<size_t> slots;
    WorkPtr work;
  };

  void onGradientReady(size_t bucket, size_t member);  // autograd's hook
  static bool livesInBucket(const Slot& slot);
  static void moveIntoBucket(Slot& slot);  // param.grad() (or zeros) to its place in the bucket
  void launchReadyBuckets();               // under mu_
  void allocateBuckets();                  // the buckets' flat buffers, shared where possible

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<Backend> backend_;
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  std::shared_ptr<void> shared_;  // the buckets' memory, when the backend gives shared memory
  bool find_unused_;
  torch::Tensor used_;  // int32 per slot, all-reduced (max) in finishBackward
  std::unique_ptr<GradientReadiness> readiness_;
  bool sync_ = true;
  std::mutex mu_;
};

}  // namespace cxxlaunch::runtime
