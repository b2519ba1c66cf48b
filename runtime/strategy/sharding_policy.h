#pragma once
// ShardingPolicy: what a ZeRO stage or an FSDP sharding strategy asks of the data-parallel engine
// (strategy/sharded.h), decided once from its options so that the scheduler asks these questions
// instead of comparing stage numbers:
//
//                           ddp, fsdp_no_shard  zero1  zero2, shard_grad_op  zero3, full_shard
//   shard_optimizer                  -            x              x                   x
//   shard_gradients                  -            -              x                   x
//   reshard_after_forward            -            -              -                   x
//
// and where the fp32 shards and the optimizer state rest between steps (offload placement).
// ShardingPolicy::of is the only place that reads the stage.
//
// Thread-safety: a value, read only after construction.

#include <c10/core/Device.h>

namespace cxxlaunch::runtime {

struct ShardingOptions;

// Where a kind of fp32 array rests between steps (strategy/shard_store.h).
enum class Placement {
  kDevice,  // the model's device
  kHost,    // host memory, pinned for a GPU model (cpu offload); the optimizer steps there
  kNvme,    // swap files, streamed through memory at each step (ZeRO-Infinity)
};

struct ShardingPolicy {
  // Each rank steps its 1/world of every unit and all-gathers the parameters after the step;
  // otherwise every rank holds and steps everything (one "shard": the whole unit).
  bool shard_optimizer = false;
  // A unit's gradient is reduce-scattered into an accumulating fp32 shard as soon as backward
  // completes it, and the full gradient freed; otherwise it is all-reduced whole, in place, at
  // the synchronising backward (noSync steps accumulate in param.grad()).
  bool shard_gradients = false;
  // Parameters sharded at rest: the wrap policy's modules are units, each gathered around its
  // forward and its backward and freed after (unit.h's unitForward); the model is built unit by
  // unit, never whole on a rank.
  bool reshard_after_forward = false;

  // Offload placement.
  Placement master = Placement::kDevice;           // the fp32 master shards
  Placement optimizer_state = Placement::kDevice;  // the optimizer's state arrays
  Placement gradient_shards = Placement::kDevice;  // the fp32 gradient shards the optimizer reads
  // cpu offload of the optimizer only, parameters sharded at rest: the device keeps each unit's
  // shard in the compute dtype as its gathers' input (offload_params_to_host keeps none).
  bool device_keeps_shard = false;

  // Memory the arrays need of their own, rather than views of the units' buffers: the master
  // shard (parameters sharded at rest, mixed precision, cpu offload) and the fp32 gradient shard
  // (sharded gradients, mixed precision, cpu offload).
  bool own_master = false;
  bool own_gradient_shard = false;
  // ZeRO-2 on CPU without hybrid groups: full gradients lent from memory the ranks share
  // (shared_gradients.h); ZeRO-3 keeps its pooled buffers (measured no faster, 400 MiB more).
  bool share_full_gradients = false;
  // ZeRO-3 on CPU: gathered buffers and gradients reused through size classes
  // (flat/buffer_pool.h); a GPU's caching allocator does it there.
  bool pool_buffers = false;
  // Memory is the point (parameters sharded at rest, nvme offload): freed host memory goes back
  // to the kernel (host_memory.h).
  bool return_freed_memory = false;

  // Checks the options (stage 0-3; the trainer's optimizer only where nothing is sharded, in the
  // model's dtype, nothing offloaded) and throws InvalidArgument otherwise.
  static ShardingPolicy of(const ShardingOptions& options, c10::Device device);
};

}  // namespace cxxlaunch::runtime
