#pragma once
// Activation checkpointing: a block's forward keeps none of its intermediate activations; its
// backward runs the forward again (with autograd on) and back-propagates through that. Memory
// for activations falls from every block's to one block's at a time, for about one more
// forward per step. LibTorch's C++ API has no torch.utils.checkpoint; this is it, reentrant
// style (PyTorch's use_reentrant=True):
//
//   x = cxxlaunch::runtime::checkpointActivations([&](const torch::Tensor& h) { return block(h); },
//   x);
//
// Shard units need no code for it: unitForward checkpoints the units that the config's
// fsdp_activation_checkpointing or Accelerator::checkpointActivations(module) selects.
//
// The recomputation sees what the first forward saw: the CPU random generator's state (and the
// CUDA one of the input's device), and the autocast state. Gradients flow to `input` and to
// every parameter `forward` uses; anything else `forward` reads is taken as a constant.
//
// Thread-safety: as autograd; the backward may run on autograd's threads.

#include <torch/types.h>

#include <functional>

namespace cxxlaunch::runtime {

using CheckpointedForward = std::function<torch::Tensor(const torch::Tensor&)>;

// `forward(input)`, without its activations kept for backward (they are recomputed). Outside
// autograd (no gradient wanted), just `forward(input)`.
torch::Tensor checkpointActivations(CheckpointedForward forward, const torch::Tensor& input);

}  // namespace cxxlaunch::runtime
