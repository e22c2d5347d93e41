// CPU NF4 quantization (kernels/nf4.h), and the inline readers that the NF4 linear layer
// (kernels/cpu/nf4_linear.cc) dequantizes its weight tiles with. Internal to kernels/: the
// entry points in kernels/nf4.cc have checked the buffers.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/nf4.h"
#include "kernels/quantization.h"

namespace zt::cpu {

absl::Status Nf4Quantize(const DeviceContext& ctx, const Nf4QuantizeArgs& args);
void Nf4Dequantize(const DeviceContext& ctx, const Nf4DequantizeArgs& args);

// The 15 decision thresholds between neighbouring levels: T_k is the largest f32 no larger
// than the exact midpoint of levels k and k+1, so the code of r, the number of thresholds
// below r, is the nearest level in exact arithmetic (an exact tie going to the lower code).
const std::array<float, 15>& Nf4Thresholds();

inline uint8_t Nf4NearestCode(const float* thresholds, float r) {
  int code = 0;
  for (int k = 0; k < 15; ++k) code += thresholds[k] < r ? 1 : 0;
  return static_cast<uint8_t>(code);
}

// The scale A_b of block b as dequantization uses it (kernels/nf4.h).
inline float Nf4BlockScale(const Nf4Tensor& t, int64_t b) {
  if (t.format == Nf4Absmax::kF32) return t.absmax.data<float>()[b];
  // The group of the whole weight's block that block b is (kGroupIndexed), or of block b.
  const int64_t whole_block =
      t.format == Nf4Absmax::kGroupIndexed
          ? t.block_base.data<int32_t>()[b / t.share.row_blocks] + b % t.share.row_blocks
          : b;
  return std::fma(DynamicMapSigned()[t.absmax.data<uint8_t>()[b]],
                  t.absmax_scale.data<float>()[whole_block / kNf4AbsmaxGroup],
                  t.absmax_offset.data<float>()[0]);
}

// The 4-bit code of element i: the high nibble for even i, the low one for odd i.
inline uint8_t Nf4CodeAt(const uint8_t* codes, int64_t i) {
  const uint8_t byte = codes[i >> 1];
  return (i & 1) != 0 ? byte & 0x0F : byte >> 4;
}

// dst[r − r0][c − c0] (row stride ld) = element (r, c) of t viewed as a row-major
// (rows, cols) matrix, for r in [r0, r1) and c in [c0, c1). Runs on the calling thread.
inline void Nf4DequantizeTile(const Nf4Tensor& t, int64_t cols, int64_t r0, int64_t r1, int64_t c0,
                              int64_t c1, float* dst, int64_t ld) {
  const float* levels = Nf4Levels().data();
  const uint8_t* codes = t.codes.data<uint8_t>();
  for (int64_t r = r0; r < r1; ++r) {
    float* out = dst + (r - r0) * ld;
    int64_t i = r * cols + c0;
    const int64_t end = r * cols + c1;
    while (i < end) {
      const int64_t b = i / kNf4Block;
      const int64_t stop = std::min(end, (b + 1) * kNf4Block);
      const float scale = Nf4BlockScale(t, b);
      for (; i < stop; ++i) *out++ = levels[Nf4CodeAt(codes, i)] * scale;
    }
  }
}

}  // namespace zt::cpu
