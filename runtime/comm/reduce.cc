#include "runtime/comm/reduce.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "common/error.h"
#include "runtime/kernels/element_math.h"

namespace cxxlaunch::runtime {
namespace {

template <typename T>
T combine(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return static_cast<T>(a + b);
    case ReduceOp::kMax:
      return std::max(a, b);
    case ReduceOp::kMin:
      return std::min(a, b);
  }
  return a;
}

template <typename T, ReduceOp kOp>
void reduceLoop(T* __restrict a, const T* __restrict b, size_t count) {
  for (size_t i = 0; i < count; ++i) a[i] = combine(a[i], b[i], kOp);
}

// One loop per operation: with the switch inside the loop GCC vectorised none of them.
template <typename T>
void reduceTyped(void* acc, const void* in, size_t count, ReduceOp op) {
  auto* a = static_cast<T*>(acc);
  const auto* b = static_cast<const T*>(in);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return reduceLoop<T, ReduceOp::kSum>(a, b, count);
    case ReduceOp::kMax:
      return reduceLoop<T, ReduceOp::kMax>(a, b, count);
    case ReduceOp::kMin:
      return reduceLoop<T, ReduceOp::kMin>(a, b, count);
  }
}

// 16-bit floats reduce in float, one element at a time.
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void reduce16(void* acc, const void* in, size_t count, ReduceOp op) {
  auto* a = static_cast<uint16_t*>(acc);
  const auto* b = static_cast<const uint16_t*>(in);
  for (size_t i = 0; i < count; ++i) a[i] = FromFloat(combine(ToFloat(a[i]), ToFloat(b[i]), op));
}

template <typename T>
void divideTyped(void* data, size_t count, int n) {
  auto* d = static_cast<T*>(data);
  if constexpr (std::is_floating_point_v<T>) {
    // By a power of two, a product with its reciprocal (exact) is the same number as the
    // quotient, and a vector division costs ten times a multiplication.
    if ((n & (n - 1)) == 0) {
      const T reciprocal = T(1) / static_cast<T>(n);
      for (size_t i = 0; i < count; ++i) d[i] *= reciprocal;
      return;
    }
  }
  for (size_t i = 0; i < count; ++i) d[i] = static_cast<T>(d[i] / static_cast<T>(n));
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void divide16(void* data, size_t count, int n) {
  auto* d = static_cast<uint16_t*>(data);
  for (size_t i = 0; i < count; ++i) d[i] = FromFloat(ToFloat(d[i]) / static_cast<float>(n));
}

template <typename T, ReduceOp kOp, bool kHalve>
T pairValue(T x, T y) {
  T value = combine(x, y, kOp);
  if constexpr (kHalve) {
    if constexpr (std::is_floating_point_v<T>) {
      value *= T(0.5);  // exactly value / 2
    } else {
      value = static_cast<T>(value / 2);
    }
  }
  return value;
}

// Into both inputs, or (kInto) into `out`: one loop each, as their pointers alias differently.
template <typename T, ReduceOp kOp, bool kHalve>
void pairLoop(T* __restrict a, T* __restrict b, size_t count) {
  for (size_t i = 0; i < count; ++i) a[i] = b[i] = pairValue<T, kOp, kHalve>(a[i], b[i]);
}

template <typename T, ReduceOp kOp, bool kHalve>
void pairIntoLoop(T* __restrict out, const T* __restrict a, const T* __restrict b, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = pairValue<T, kOp, kHalve>(a[i], b[i]);
}

template <typename T, ReduceOp kOp, bool kHalve, bool kInto>
void pairRun(void* out, void* a, void* b, size_t count) {
  if constexpr (kInto) {
    pairIntoLoop<T, kOp, kHalve>(static_cast<T*>(out), static_cast<const T*>(a),
                                 static_cast<const T*>(b), count);
  } else {
    pairLoop<T, kOp, kHalve>(static_cast<T*>(a), static_cast<T*>(b), count);
  }
}

template <typename T, bool kInto>
void pairTyped(void* out, void* a, void* b, size_t count, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return pairRun<T, ReduceOp::kSum, false, kInto>(out, a, b, count);
    case ReduceOp::kAvg:
      return pairRun<T, ReduceOp::kSum, true, kInto>(out, a, b, count);
    case ReduceOp::kMax:
      return pairRun<T, ReduceOp::kMax, false, kInto>(out, a, b, count);
    case ReduceOp::kMin:
      return pairRun<T, ReduceOp::kMin, false, kInto>(out, a, b, count);
  }
}

// Rounded to 16 bits after the combination and again after the halving, as reduce16 and
// divide16 round.
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float), bool kInto>
void pair16(void* out, void* a, void* b, size_t count, ReduceOp op) {
  auto* x = static_cast<uint16_t*>(a);
  auto* y = static_cast<uint16_t*>(b);
  auto* o = static_cast<uint16_t*>(out);
  for (size_t i = 0; i < count; ++i) {
    uint16_t value = FromFloat(combine(ToFloat(x[i]), ToFloat(y[i]), op));
    if (op == ReduceOp::kAvg) value = FromFloat(ToFloat(value) / 2.0F);
    if constexpr (kInto) {
      o[i] = value;
    } else {
      x[i] = y[i] = value;
    }
  }
}

template <bool kInto>
void pairOf(void* out, void* a, void* b, size_t count, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kFloat32:
      return pairTyped<float, kInto>(out, a, b, count, op);
    case DType::kFloat64:
      return pairTyped<double, kInto>(out, a, b, count, op);
    case DType::kInt32:
      return pairTyped<int32_t, kInto>(out, a, b, count, op);
    case DType::kInt64:
      return pairTyped<int64_t, kInto>(out, a, b, count, op);
    case DType::kUInt8:
      return pairTyped<uint8_t, kInto>(out, a, b, count, op);
    case DType::kFloat16:
      return pair16<halfToFloat, floatToHalf, kInto>(out, a, b, count, op);
    case DType::kBFloat16:
      return pair16<bfloat16ToFloat, floatToBfloat16, kInto>(out, a, b, count, op);
  }
}

}  // namespace

// One conversion for the whole runtime: kernels/element_math.h's, which the CUDA kernels share
// and the kernel tests check against LibTorch's c10::Half / c10::BFloat16.
float halfToFloat(uint16_t half) { return kernels::halfToFloat(half); }
uint16_t floatToHalf(float value) { return kernels::floatToHalf(value); }
float bfloat16ToFloat(uint16_t bf16) { return kernels::bfloat16ToFloat(bf16); }
uint16_t floatToBfloat16(float value) { return kernels::floatToBFloat16(value); }

void reduceInto(void* acc, const void* in, size_t count, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kFloat32:
      return reduceTyped<float>(acc, in, count, op);
    case DType::kFloat64:
      return reduceTyped<double>(acc, in, count, op);
    case DType::kInt32:
      return reduceTyped<int32_t>(acc, in, count, op);
    case DType::kInt64:
      return reduceTyped<int64_t>(acc, in, count, op);
    case DType::kUInt8:
      return reduceTyped<uint8_t>(acc, in, count, op);
    case DType::kFloat16:
      return reduce16<halfToFloat, floatToHalf>(acc, in, count, op);
    case DType::kBFloat16:
      return reduce16<bfloat16ToFloat, floatToBfloat16>(acc, in, count, op);
  }
}

void reducePair(void* a, void* b, size_t count, DType dtype, ReduceOp op) {
  pairOf<false>(nullptr, a, b, count, dtype, op);
}

void reducePairInto(void* out, const void* a, const void* b, size_t count, DType dtype,
                    ReduceOp op) {
  // Only read: the kernels that write into `a` and `b` are the other instantiation.
  pairOf<true>(out, const_cast<void*>(a), const_cast<void*>(b), count, dtype, op);
}

void divideBy(void* data, size_t count, DType dtype, int n) {
  switch (dtype) {
    case DType::kFloat32:
      return divideTyped<float>(data, count, n);
    case DType::kFloat64:
      return divideTyped<double>(data, count, n);
    case DType::kInt32:
      return divideTyped<int32_t>(data, count, n);
    case DType::kInt64:
      return divideTyped<int64_t>(data, count, n);
    case DType::kUInt8:
      return divideTyped<uint8_t>(data, count, n);
    case DType::kFloat16:
      return divide16<halfToFloat, floatToHalf>(data, count, n);
    case DType::kBFloat16:
      return divide16<bfloat16ToFloat, floatToBfloat16>(data, count, n);
  }
}

}  // namespace cxxlaunch::runtime
