#include "runtime/backend.h"

namespace cxxlaunch::runtime {

size_t dtypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kUInt8:
      return 1;
  }
  return 1;
}

const char* dtypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kUInt8:
      return "uint8";
  }
  return "?";
}

}  // namespace cxxlaunch::runtime
