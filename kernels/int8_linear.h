// The LLM.int8() linear layer (Dettmers et al., "LLM.int8(): 8-bit Matrix Multiplication for
// Transformers at Scale", 2022) over a frozen int8 base weight: vector-wise absmax
// quantization with the mixed-precision decomposition for outlier features.
//
// Legend: M rows (tokens), K input channels, N output channels; W is (N, K) row-major.
//
// Weight: each output row n is quantized with its own scale, w_n = max_k |W[n, k]|:
//   Wq[n, k] = round(127 · W[n, k] / w_n) in [−127, 127] (to nearest, ties to even),
// read back as Wq · w_n / 127. Codes are int8 stored in a u8 tensor (two's complement bytes).
//
// Forward, out = inp · Wᵀ + bias:
//  1. Outlier features: the input columns k where some |inp[m, k]| ≥ outlier_threshold (the
//     paper's default 6.0). They are few but systematic in large models, and quantizing them
//     with the rest of a row would flatten every other feature of that row to 0.
//  2. Every other column is quantized per token (row m, scale x_m = max |inp[m, k]| over the
//     non-outlier k): Xq[m, k] = round(127 · inp[m, k] / x_m).
//  3. out[m, n] = (Σ_k Xq[m, k] · Wq[n, k], summed exactly in int32) · x_m · w_n / 127²
//                 + Σ_{k outlier} inp[m, k] · (Wq[n, k] · w_n / 127)     (in f32)
//                 + bias[n]
//     so an outlier column's activations take part unquantized, multiplied by the weight the
//     layer stores (its int8 column read back in f32: the base keeps no 16-bit copy).
// Backward: dinp = dout · W̃ with W̃ the read-back weight, in f32 (LLM.int8()'s backward for a
// frozen weight); no weight gradient.
//
// inp, out, dout, dinp, bias may each be f32, bf16 or f16 (computed in f32, rounded once).
// K is at most kInt8MaxK so that an int32 sum of K products of magnitude ≤ 127² cannot
// overflow. Scratch comes from ctx.workspace (Int8LinearWorkspaceBytes). Thread-safe for
// distinct contexts.
#pragma once

#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/linear.h"
#include "kernels/tensor.h"

namespace zt {

inline constexpr float kInt8OutlierThreshold = 6.0f;
// ⌊(2³¹ − 1) / 127²⌋.
inline constexpr int64_t kInt8MaxK = 133144;

struct Int8Weight {
  Tensor codes;   // (N, K) u8: int8 codes Wq
  Tensor scales;  // (N) f32: w_n = max_k |W[n, k]|
};

struct Int8QuantizeWeightArgs {
  Tensor src;  // (N, K) f32, finite
  Int8Weight dst;
};
// A row of zeros gets scale 0 and codes 0. InvalidArgument names a non-finite element.
absl::Status Int8QuantizeWeight(const DeviceContext& ctx, const Int8QuantizeWeightArgs& args);

struct Int8DequantizeWeightArgs {
  Int8Weight src;
  Tensor dst;  // (N, K) f32: W̃[n, k] = Wq[n, k] · (w_n / 127), the value the layer computes with
};
// The read-back weight, rounded as the forward's outlier term and the backward round it (the
// f32 product of the code and w_n / 127): a merge or a reference uses the very W̃ the layer
// used. For export and tests; the layer itself never dequantizes the whole weight.
absl::Status Int8DequantizeWeight(const DeviceContext& ctx, const Int8DequantizeWeightArgs& args);

struct Int8LinearForwardArgs {
  Tensor inp;  // (M, K)
  Int8Weight weight;
  Tensor bias;  // (N) or empty
  Tensor out;   // (M, N), written
  // > 0; +inf turns the decomposition off (every column quantized), as a comparison point.
  float outlier_threshold = kInt8OutlierThreshold;
};
absl::Status Int8LinearForward(const DeviceContext& ctx, const Int8LinearForwardArgs& args);

struct Int8LinearBackwardArgs {
  Tensor dout;  // (M, N)
  Int8Weight weight;
  Tensor dinp;  // (M, K): = or += dout · W̃
  Accumulate dinp_mode = Accumulate::kOverwrite;
};
absl::Status Int8LinearBackward(const DeviceContext& ctx, const Int8LinearBackwardArgs& args);

// Scratch bytes the forward needs for M rows and K inputs: the int8 activations (M·K), their
// scales (M f32) and the outlier flags (K); the backward needs none.
int64_t Int8LinearWorkspaceBytes(int64_t M, int64_t K);

}  // namespace zt
