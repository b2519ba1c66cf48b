#pragma once
// The Backend's collectives on at::Tensor: the dtype mapping and contiguity checks in one place.
// Internal helpers for the LibTorch layer of the runtime.

#include <ATen/ATen.h>

#include "runtime/comm/backend.h"

namespace cxxlaunch::runtime {

// The bytes a tensor's elements take; 0 for an undefined tensor.
inline size_t bytesOf(const at::Tensor& t) {
  return t.defined() ? static_cast<size_t>(t.numel()) * t.element_size() : 0;
}

// Throws InvalidArgument for dtypes the backends do not carry (complex, bool...).
DType dtypeOf(const at::Tensor& tensor);

// In place; `tensor` must be contiguous.
WorkPtr allreduce(Backend& backend, at::Tensor& tensor, ReduceOp op);
WorkPtr broadcast(Backend& backend, at::Tensor& tensor, int root);

}  // namespace cxxlaunch::runtime
