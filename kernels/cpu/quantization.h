// CPU block-wise quantization. Arguments are validated by kernels/quantization.cc. The inline
// search is shared with the 8-bit optimizers (kernels/cpu/adam8bit.cc), which requantize their
// states block by block inside their own update loops.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>

#include "kernels/quantization.h"

namespace zt::cpu {

void BlockQuantize(const DeviceContext& ctx, const BlockQuantizeArgs& args);
void BlockDequantize(const DeviceContext& ctx, const BlockDequantizeArgs& args);

// The nearest-value search of one map, as a count: the code of x is the number of decision
// thresholds below it, where T_k, the midpoint of map[k] and map[k+1] rounded down to f32, is
// the largest f32 no farther from map[k] than from map[k+1]. So the code is the index of the
// nearest map value in exact arithmetic, an exact tie going to the lower index.
//
// Counting uses buckets of x's bit pattern: sign, then magnitude cut at every 2^-8 of a binade
// (magnitudes below 2^-23, where no map has two thresholds, share the first bucket; 1.0 and
// above, NaN included, share the last). Every bucket holds at most one threshold (the tests
// probe each one), so the count is the thresholds below the bucket plus one comparison: one
// table load and one threshold load per element, branch-free, which a `simd` loop turns into
// gathers. The table is 46 KiB per map.
struct CodeSearch {
  static constexpr uint32_t kMinBits = 0x34000000u;  // the f32 bits of 2^-23
  static constexpr int kShift = 23 - 8;              // keep 8 mantissa bits
  static constexpr int32_t kPerSign = ((0x3F800000u - kMinBits) >> kShift) + 1;

  std::array<float, 256> thresholds;  // T_0 … T_254, then +inf
  // Per bucket, negative magnitudes descending then positive ascending: the number of
  // thresholds below the bucket's lowest value.
  std::array<int32_t, 2 * kPerSign> first;
};

const CodeSearch& CodeSearchFor(DynamicMap map);

inline uint8_t NearestCode(const CodeSearch& s, float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  const uint32_t bucket = std::min<uint32_t>(
      (std::max(magnitude, CodeSearch::kMinBits) - CodeSearch::kMinBits) >> CodeSearch::kShift,
      CodeSearch::kPerSign - 1);
  const int32_t b = static_cast<int32_t>(bucket);
  const int32_t index = (bits >> 31) != 0 ? CodeSearch::kPerSign - 1 - b : CodeSearch::kPerSign + b;
  const int32_t below = s.first[index];
  return static_cast<uint8_t>(below + (s.thresholds[below] < x ? 1 : 0));
}

// The map value nearest to 0 is exactly 0.0 in both maps; its code.
inline uint8_t ZeroCode(DynamicMap map) {
  return map == DynamicMap::kSigned ? kDynamicSignedZeroCode : 0;
}

inline const float* MapValues(DynamicMap map) {
  return map == DynamicMap::kSigned ? DynamicMapSigned().data() : DynamicMapUnsigned().data();
}

}  // namespace zt::cpu
