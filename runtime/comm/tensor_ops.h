#pragma once
// The Backend's collectives on at::Tensor: the dtype mapping and contiguity checks in one place.
// Internal helpers for the LibTorch layer of the runtime.

#include <ATen/ATen.h>

#include "runtime/comm/backend.h"

namespace cxxlaunch::runtime {

// Throws InvalidArgument for dtypes the backends do not carry (complex, bool...).
DType dtypeOf(const at::Tensor& tensor);

// In place; `tensor` must be contiguous.
WorkPtr allreduce(Backend& backend, at::Tensor& tensor, ReduceOp op);
WorkPtr broadcast(Backend& backend, at::Tensor& tensor, int root);

}  // namespace cxxlaunch::runtime
