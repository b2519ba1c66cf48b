#pragma once
// GradientReadiness: the gradient engine's bookkeeping, one for DDP and the sharded strategies.
//
// An engine reduces gradients in groups: DDP's buckets, ZeRO's and FSDP's shard units (both
// planned by planUnits, unit_plan.h). This component
//   - hooks every parameter's gradient accumulator: the hook runs once backward has added this
//     backward's gradient into param.grad(), which is where the engine must read it;
//   - counts, per group, the gradients this backward has not produced yet;
//   - refuses a second gradient for a parameter before the step's reduction (two backward passes
//     in one step: the first one's reduction may be on the wire, so the second would be lost or
//     torn);
//   - hands out complete groups in one launch order, the same on every rank, so that the ranks'
//     collectives match.
// What a gradient becomes (DDP: its place in the bucket; sharded: the unit's gradient buffer) and
// what a launch does stay with the engine.
//
// Not synchronised: the engine calls it under its own lock (autograd runs the hooks on its own
// threads).

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace torch::autograd {
struct Node;
}

namespace cxxlaunch::runtime {

class GradientReadiness {
 public:
  static constexpr size_t kNone = static_cast<size_t>(-1);
  // Called by the hook: the parameter is groups[group][member].
  using OnGradient = std::function<void(size_t group, size_t member)>;

  // groups: the parameters of each group; launch_order: every group once, in the order their
  // reductions launch on every rank.
  GradientReadiness(const std::vector<std::vector<torch::Tensor>>& groups,
                    std::vector<size_t> launch_order, OnGradient on_gradient);
  ~GradientReadiness();  // removes the hooks
  GradientReadiness(const GradientReadiness&) = delete;
  GradientReadiness& operator=(const GradientReadiness&) = delete;

  // Marks this member's gradient taken for this backward; returns whether that completed its
  // group. Throws InvalidArgument when it was taken already.
  bool markReady(size_t group, size_t member);
  // The next group in launch order whose gradients are all taken, now counted as launched; kNone
  // while the next one is incomplete, or after the last.
  size_t nextToLaunch();
  // The (group, member) pairs whose gradient this backward has not produced, in group order.
  std::vector<std::pair<size_t, size_t>> pending() const;
  // The next backward: every gradient pending again, launches from the first group.
  void reset();

 private:
  struct Hook {
    std::shared_ptr<torch::autograd::Node> accumulator;  // kept alive: it carries the hook
    uintptr_t key;                                       // add_post_hook's
  };

  std::vector<size_t> first_;    // group g's members are parameters first_[g] .. first_[g + 1] - 1
  std::vector<char> ready_;      // per parameter
  std::vector<size_t> missing_;  // per group: gradients not yet taken
  std::vector<size_t> launch_order_;
  size_t launched_ = 0;
  std::vector<Hook> hooks_;
  OnGradient on_gradient_;
};

}  // namespace cxxlaunch::runtime
