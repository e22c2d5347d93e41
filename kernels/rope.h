// Rotary position embedding, Hugging Face's rotate-half convention (Llama):
//   for head vector x of size D and i < D/2, θ_i = pos · base^(-2i/D):
//   y[i]       = x[i] · cos θ_i − x[i + D/2] · sin θ_i
//   y[i + D/2] = x[i + D/2] · cos θ_i + x[i] · sin θ_i
// Applied in place to the query and key heads of a packed qkv buffer, stored as f32, bf16 or
// f16 (a 16-bit qkv is rotated in f32 and rounded to nearest even once).
// Legend: B batch, T sequence, H query heads, Hkv key/value heads, D head size (even).
#pragma once

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/tensor.h"

namespace zt {

enum class RopeDirection : uint8_t {
  kForward,  // rotate by +θ (the forward pass)
  kInverse,  // rotate by −θ: the backward pass applies it to dq, dk (a rotation's transpose)
};

struct RopeArgs {
  // (B, T, (H + 2·Hkv)·D) packed [q heads | k heads | v heads]; the first H + Hkv heads are
  // rotated in place, v is untouched.
  Tensor qkv;
  int n_head = 0;
  int n_kv_head = 0;
  float theta = 10000.0f;
  // (B, T) i32 positions, or empty for position = t (packed sequences pass their own).
  Tensor positions;
  RopeDirection direction = RopeDirection::kForward;
};
absl::Status RopeApply(const DeviceContext& ctx, const RopeArgs& args);

}  // namespace zt
