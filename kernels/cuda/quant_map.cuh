// A dynamic quantization map (kernels/quantization.h) on the device, for BlockQuantize,
// BlockDequantize and the 8-bit optimizers (kernels/cuda/{quantization,adam8bit}.cu).
//
// The host hands a kernel the CPU's own tables by value (kernel parameters, 2 KiB a map): the
// 256 map values and the 255 decision thresholds of cpu::CodeSearchFor (T_k: the midpoint of
// map[k] and map[k+1] rounded down to f32), so the device cannot disagree with the CPU about
// either. A kernel copies them to shared memory (its accesses are data-dependent), then the
// code of x is the number of thresholds below x — what cpu::NearestCode counts with its
// bucket table — found by a binary search over the sorted thresholds: the index of the
// nearest map value in exact arithmetic, an exact tie going to the lower index.
#pragma once

#include <cstdint>

#include "kernels/cpu/quantization.h"

namespace zt::cuda {

struct QuantMap {
  float values[256];
  float thresholds[256];  // T_0 … T_254, then +inf
};

// Host side.
inline QuantMap QuantMapOf(DynamicMap map) {
  QuantMap q;
  const float* values = cpu::MapValues(map);
  const cpu::CodeSearch& search = cpu::CodeSearchFor(map);
  for (int k = 0; k < 256; ++k) {
    q.values[k] = values[k];
    q.thresholds[k] = search.thresholds[k];
  }
  return q;
}

// Copies `q` into shared memory `s`; the caller syncs before using it.
__device__ __forceinline__ void LoadQuantMap(const QuantMap& q, QuantMap& s) {
  for (int k = threadIdx.x; k < 256; k += blockDim.x) {
    s.values[k] = q.values[k];
    s.thresholds[k] = q.thresholds[k];
  }
}

// The count of thresholds below x: a branch-free lower bound over T_0 … T_254 (T_255 = +inf
// is never probed: the largest index probed is 254). A NaN is above every threshold when its
// sign bit is clear and below them all when it is set, as cpu::NearestCode's buckets of the
// bit pattern place it (code 255 or 0).
__device__ __forceinline__ uint8_t NearestCode(const QuantMap& s, float x) {
  if (x != x) return (__float_as_uint(x) >> 31) != 0 ? 0 : 255;
  int pos = 0;
#pragma unroll
  for (int step = 128; step > 0; step >>= 1) {
    if (s.thresholds[pos + step - 1] < x) pos += step;
  }
  return static_cast<uint8_t>(pos);
}

// The code of the f32 quotient x / d (d > 0), as the CPU's x86 division and bucket search
// give it. The device's division returns a canonical (positive) NaN where x86 propagates a
// NaN operand with its sign, or gives its default NaN, whose sign bit is set, for inf / inf:
// so a NaN quotient takes the sign of a NaN x, and otherwise the code of a negative NaN.
__device__ __forceinline__ uint8_t QuotientCode(const QuantMap& s, float x, float d) {
  const float q = x / d;
  if (q != q) return x != x ? NearestCode(s, x) : 0;
  return NearestCode(s, q);
}

}  // namespace zt::cuda
