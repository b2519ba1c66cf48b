#include "runtime/reduce.h"

#include <algorithm>
#include <cstring>

#include "rendezvous/error.h"

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

template <typename T>
void reduceTyped(void* acc, const void* in, size_t count, ReduceOp op) {
  auto* a = static_cast<T*>(acc);
  const auto* b = static_cast<const T*>(in);
  for (size_t i = 0; i < count; ++i) a[i] = combine(a[i], b[i], op);
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
  for (size_t i = 0; i < count; ++i) d[i] = static_cast<T>(d[i] / static_cast<T>(n));
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void divide16(void* data, size_t count, int n) {
  auto* d = static_cast<uint16_t*>(data);
  for (size_t i = 0; i < count; ++i) d[i] = FromFloat(ToFloat(d[i]) / static_cast<float>(n));
}

}  // namespace

float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000 | (mantissa << 13);  // inf, nan
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exponent = 113;
    while ((mantissa & 0x400) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3ff) << 13);
  }
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

uint16_t floatToHalf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const int32_t exponent = static_cast<int32_t>((bits >> 23) & 0xff) - 127 + 15;
  uint32_t mantissa = bits & 0x7fffff;
  if (((bits >> 23) & 0xff) == 0xff) {  // inf, nan
    return static_cast<uint16_t>(sign | 0x7c00 | (mantissa != 0 ? 0x200 : 0));
  }
  if (exponent >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00);  // overflow to inf
  if (exponent <= 0) {                                                // subnormal or zero
    if (exponent < -10) return sign;
    mantissa |= 0x800000;
    const int shift = 14 - exponent;
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1) != 0)) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1) != 0)) ++half;  // may carry into inf: fine
  return static_cast<uint16_t>(sign | half);
}

float bfloat16ToFloat(uint16_t bf16) {
  const uint32_t bits = static_cast<uint32_t>(bf16) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

uint16_t floatToBfloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((bits >> 16) | 0x40);  // nan
  const uint32_t rounding = 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

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
