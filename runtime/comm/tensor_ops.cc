#include "runtime/comm/tensor_ops.h"

#include <string>

#include "common/error.h"

namespace cxxlaunch::runtime {

DType dtypeOf(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat:
      return DType::kFloat32;
    case at::kDouble:
      return DType::kFloat64;
    case at::kHalf:
      return DType::kFloat16;
    case at::kBFloat16:
      return DType::kBFloat16;
    case at::kInt:
      return DType::kInt32;
    case at::kLong:
      return DType::kInt64;
    case at::kByte:
      return DType::kUInt8;
    default:
      throw InvalidArgument(std::string("collectives do not carry tensors of type ") +
                            c10::toString(tensor.scalar_type()));
  }
}

WorkPtr allreduce(Backend& backend, at::Tensor& tensor, ReduceOp op) {
  TORCH_CHECK(tensor.is_contiguous(), "allreduce needs a contiguous tensor");
  return backend.allreduce(tensor.data_ptr(), static_cast<size_t>(tensor.numel()), dtypeOf(tensor),
                           op);
}

WorkPtr broadcast(Backend& backend, at::Tensor& tensor, int root) {
  TORCH_CHECK(tensor.is_contiguous(), "broadcast needs a contiguous tensor");
  return backend.broadcast(tensor.data_ptr(), static_cast<size_t>(tensor.numel()), dtypeOf(tensor),
                           root);
}

}  // namespace cxxlaunch::runtime
