// LayerNorm and RMSNorm over the last dimension.
// Legend: N rows (B·T), C channels.
// Storage: every tensor but mean/rstd (always f32) may be f32, bf16 or f16 independently;
// elements are loaded to f32, computed as the f32 path does and rounded once when stored
// (dweight/dbias accumulate in their own dtype).
// Accumulation rule: dweight/dbias +=; dinp written or added as the caller says (a norm's
// input is the residual stream, whose gradient usually accumulates).
#pragma once

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/linear.h"
#include "kernels/tensor.h"

namespace zt {

struct LayerNormForwardArgs {
  Tensor inp;     // (N, C)
  Tensor weight;  // (C)
  Tensor bias;    // (C)
  Tensor out;     // (N, C)
  Tensor mean;    // (N) saved for backward
  Tensor rstd;    // (N) saved for backward: 1/sqrt(var + eps)
  float eps = 1e-5f;
};
absl::Status LayerNormForward(const DeviceContext& ctx, const LayerNormForwardArgs& args);

struct LayerNormBackwardArgs {
  Tensor dout;     // (N, C)
  Tensor inp;      // (N, C)
  Tensor weight;   // (C)
  Tensor mean;     // (N)
  Tensor rstd;     // (N)
  Tensor dinp;     // (N, C)
  Tensor dweight;  // (C) +=
  Tensor dbias;    // (C) +=
  Accumulate dinp_mode = Accumulate::kOverwrite;
};
absl::Status LayerNormBackward(const DeviceContext& ctx, const LayerNormBackwardArgs& args);

// Scratch that LayerNormBackward takes from ctx.workspace on a device of `kind` for N rows of
// C channels: 0 on the CPU; on CUDA, f32 per-block partial sums of dweight and dbias
// (min(N, 256) blocks × C each), added in a fixed order by a second pass, so dweight and
// dbias are the same bits on every run without float atomics. FailedPrecondition when the
// context's workspace is smaller.
int64_t LayerNormBackwardWorkspaceBytes(DeviceKind kind, int64_t rows, int64_t channels);

struct RmsNormForwardArgs {
  Tensor inp;     // (N, C)
  Tensor weight;  // (C)
  Tensor out;     // (N, C) = inp · rstd · weight
  Tensor rstd;    // (N) saved: 1/sqrt(mean(inp²) + eps)
  float eps = 1e-5f;
};
absl::Status RmsNormForward(const DeviceContext& ctx, const RmsNormForwardArgs& args);

struct RmsNormBackwardArgs {
  Tensor dout;     // (N, C)
  Tensor inp;      // (N, C)
  Tensor weight;   // (C)
  Tensor rstd;     // (N)
  Tensor dinp;     // (N, C)
  Tensor dweight;  // (C) +=
  Accumulate dinp_mode = Accumulate::kOverwrite;
};
absl::Status RmsNormBackward(const DeviceContext& ctx, const RmsNormBackwardArgs& args);

// As LayerNormBackwardWorkspaceBytes, for dweight only.
int64_t RmsNormBackwardWorkspaceBytes(DeviceKind kind, int64_t rows, int64_t channels);

}  // namespace zt
