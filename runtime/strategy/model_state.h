#pragma once
// What every strategy does to a model before training: check that all ranks built the same one
// (a mismatch would otherwise hang or corrupt the first collective), then make rank 0's
// parameters and buffers everyone's.
//
// Collectives: every rank must call these, in the same order.

#include <torch/nn/module.h>

#include "runtime/comm/backend.h"

namespace cxxlaunch::runtime {

// Throws InvalidArgument naming rank 0 and the first rank whose parameters differ from rank 0's
// in count, elements, shapes or dtypes (PyTorch: "DDP expects same model across all ranks").
void checkSameModel(Backend& backend, const torch::nn::Module& model);

// Every rank's parameters and buffers become `root`'s.
void broadcastModuleState(Backend& backend, torch::nn::Module& model, int root);

}  // namespace cxxlaunch::runtime
