// AdamW with 8-bit block-wise states (Dettmers et al., 8-bit Optimizers via Block-wise
// Quantization, 2022): m and v are kept as one byte per parameter in the dynamic maps of
// kernels/quantization.h (m signed, v unsigned) plus one f32 absmax per block of each: 2 bytes
// per parameter + 8 bytes per block, against AdamW's 8 bytes per parameter.
//
// An all-zero state (codes 0, absmax 0) is the zero state AdamW starts from: an absmax of 0
// dequantizes every code of its block to 0, so a zero-filled arena needs no initialization.
//
// The gradient may be f32, bf16 or f16, and param_copy, stochastic_rounding and seed work as
// in AdamWArgs (kernels/optimizer.h): the updated f32 parameter is also written, rounded, to a
// 16-bit copy, with the stochastic hash's counter the element index within the tensor.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/tensor.h"

namespace zt {

// The range [0, n) is quantized in blocks of `block` elements starting at element 0; the last
// block may be partial. A caller that updates a sub-range of a larger buffer (a ZeRO shard)
// must start it at a block boundary so that its blocks are the buffer's blocks: shard
// boundaries are cut at multiples of `block`.
struct AdamW8bitArgs {
  Tensor param;          // (n) f32 (or i16, a split master: kernels/optimizer.h), updated
  Tensor grad;           // (n) f32, bf16 or f16
  Tensor m_codes;        // (n) u8, first moment in DynamicMapSigned(), updated
  Tensor m_absmax;       // (ceil(n / block)) f32, updated
  Tensor v_codes;        // (n) u8, second moment in DynamicMapUnsigned(), updated
  Tensor v_absmax;       // (ceil(n / block)) f32, updated
  int64_t block = 2048;  // a power of two ≥ 64
  float lr = 0;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0;
  int64_t step = 1;                  // 1-based step count, for bias correction
  float grad_scale = 1.0f;           // applied to grad before use
  Tensor param_copy;                 // (n) bf16 or f16 = the updated param, or empty
  bool stochastic_rounding = false;  // bf16 param_copy only
  uint64_t seed = 0;                 // of the stochastic rounding
};
// For each block: m, v = map[code] · absmax; then AdamWUpdate's rule with those m and v (the
// parameter moves with the new m and v before they are rounded to 8 bits); then m and v are
// requantized with the block's new absmax values. Blocks are independent.
absl::Status AdamW8bitUpdate(const DeviceContext& ctx, const AdamW8bitArgs& args);

}  // namespace zt
