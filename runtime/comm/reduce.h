#pragma once
// Element-wise reductions on type-erased CPU buffers: what the Fake backend computes, and what
// the Gloo backend uses where Gloo has no kernel (bf16, average). Internal to runtime/.

#include <cstddef>
#include <cstdint>

#include "runtime/comm/backend.h"

namespace cxxlaunch::runtime {

// acc[i] = op(acc[i], in[i]); kAvg accumulates a sum (divide afterwards).
void reduceInto(void* acc, const void* in, size_t count, DType dtype, ReduceOp op);

// a[i] = b[i] = op(a[i], b[i]), halved for kAvg: two ranks' data reduced into both in one pass
// over memory. The same bits as reduceInto and then divideBy(2) into a copy of `a`.
void reducePair(void* a, void* b, size_t count, DType dtype, ReduceOp op);
// out[i] = op(a[i], b[i]), halved for kAvg, in one pass; `out` overlaps neither input. The same
// bits as copying `a` to `out`, reduceInto(out, b) and divideBy(out, 2).
void reducePairInto(void* out, const void* a, const void* b, size_t count, DType dtype,
                    ReduceOp op);

// data[i] /= n (integer types: truncating division).
void divideBy(void* data, size_t count, DType dtype, int n);

float halfToFloat(uint16_t half);
uint16_t floatToHalf(float value);  // round to nearest even
float bfloat16ToFloat(uint16_t bf16);
uint16_t floatToBfloat16(float value);  // round to nearest even

}  // namespace cxxlaunch::runtime
