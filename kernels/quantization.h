// Block-wise 8-bit quantization with the dynamic ("tree") maps of Dettmers et al., 8-bit
// Optimizers via Block-wise Quantization (2022), as bitsandbytes' create_dynamic_map builds
// them. 8-bit optimizer states (kernels/adam8bit.h) are stored this way: one byte per element
// plus one f32 absmax per block.
//
// A map is 256 f32 values sorted ascending. Each positive value is a decade 10^-e
// (e = 6 … 0, the "dynamic exponent") times the midpoint of one of the equal slices of
// [0.1, 1] (the "linear fraction"); decade 10^-e gets twice as many slices as 10^-(e+1), so
// precision follows magnitude the way a float's does, and 0 and 1.0 are added. The signed map
// (for Adam's m) mirrors 127 values to the negative side: its smallest value is
// −(1 − 0.9/128) ≈ −0.99297, not −1. The unsigned map (for v ≥ 0) spends the sign bit on a
// second fraction bit.
#pragma once

#include <array>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/tensor.h"

namespace zt {

// 256 values in [−0.99297, 1], ascending: 127 negative, 0.0 (code kDynamicSignedZeroCode),
// 127 positive, 1.0 (code 255).
const std::array<float, 256>& DynamicMapSigned();
// 256 values in [0, 1], ascending: 0.0 (code 0), 254 positive values, 1.0 (code 255).
const std::array<float, 256>& DynamicMapUnsigned();

inline constexpr uint8_t kDynamicSignedZeroCode = 127;

enum class DynamicMap : uint8_t {
  kSigned,    // DynamicMapSigned(): values of either sign
  kUnsigned,  // DynamicMapUnsigned(): values ≥ 0 (negative ones quantize to 0)
};

// The block size rule shared by every block-quantized buffer: a power of two ≥ 64, so a
// block is whole cache lines of codes and shard boundaries can be cut at block boundaries.
absl::Status CheckQuantBlock(const char* op, int64_t block);

namespace internal {
// A block-quantized buffer on the context's device: `codes` u8 with `ref`'s element count,
// `absmax` f32 with one value per block (`block` already checked).
absl::Status CheckQuantizedBuffer(const char* op, const char* codes_arg, const Tensor& codes,
                                  const char* absmax_arg, const Tensor& absmax, const char* ref_arg,
                                  const Tensor& ref, int64_t block, const DeviceContext& ctx);
}  // namespace internal

// ceil(n / block): the number of absmax values of n elements.
inline int64_t NumQuantBlocks(int64_t n, int64_t block) { return (n + block - 1) / block; }

struct BlockQuantizeArgs {
  Tensor src;     // (n) f32
  Tensor codes;   // (n) u8, written
  Tensor absmax;  // (ceil(n / block)) f32, written: max |x| of each block
  int64_t block = 2048;
  DynamicMap map = DynamicMap::kSigned;
};
// For each block: absmax = max |x|; code = index of the map value nearest to the f32 ratio
// x / absmax, in exact arithmetic (an exact tie goes to the lower index). A block whose
// absmax is 0 gets the code of 0.0 everywhere. The last block may be partial.
absl::Status BlockQuantize(const DeviceContext& ctx, const BlockQuantizeArgs& args);

struct BlockDequantizeArgs {
  Tensor codes;   // (n) u8
  Tensor absmax;  // (ceil(n / block)) f32
  Tensor dst;     // (n) f32, written: map[code] · absmax of the element's block
  int64_t block = 2048;
  DynamicMap map = DynamicMap::kSigned;
};
absl::Status BlockDequantize(const DeviceContext& ctx, const BlockDequantizeArgs& args);

}  // namespace zt
