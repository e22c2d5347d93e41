// The frozen NF4 linear layer of QLoRA: out = inp · Wᵀ + bias with W stored NF4
// (kernels/nf4.h, double-quantized or not), and the backward's input gradient
// dinp = dout · W. W is frozen: it has no gradient (nor does its bias); the trainable LoRA
// adapters beside it are ordinary linear layers (kernels/linear.h).
//
// Legend: M rows (B·T tokens), K input channels, N output channels; W is (N, K) row-major,
// [out, in] as torch.nn.Linear stores it, its N·K elements quantized as one flat NF4 tensor
// (blocks of 64 may cross rows).
//
// W is never dequantized whole: the forward dequantizes kNf4LinearTile rows of W at a time
// (a (tile, K) f32 tile) and multiplies it in, the backward kNf4LinearTile columns at a time
// (an (N, tile) tile). Each output element is produced by one GEMM and rounded once to its
// dtype, so the result equals the f32 linear layer over the dequantized W up to the GEMM's
// own summation order. Scratch (the tile, the GEMM's (M, tile) f32 result, the GEMM's own
// scratch) comes from ctx.workspace, sized by Nf4LinearWorkspaceBytes: bounded by
// tile·max(K, N) + M·tile floats plus the GEMM's, whatever N·K is.
//
// Accumulation rule: out is written (=); dinp is written or added to, as the caller says.
// inp, out, dout, dinp and bias may each be f32, bf16 or f16 (computed in f32). Thread-safe
// for distinct contexts (each with its own workspace).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "kernels/linear.h"
#include "kernels/nf4.h"
#include "kernels/tensor.h"

namespace zt {

// Rows (forward) or columns (backward) of W dequantized per tile: a multiple of the NF4 block
// so that, when K is a multiple of 64 too, every tile covers whole blocks; 512 so that each
// tile's GEMM is wide enough to run near the full GEMM's speed (bench/quantized_kernels_bench
// on the shared 2-core machine, noisy: 128 took 2.4–2.8× the f32 layer's time, 512 1.4–1.7×),
// at 8–22 MiB of f32 tile for Llama-7B's layers.
inline constexpr int64_t kNf4LinearTile = 512;

struct Nf4LinearForwardArgs {
  Tensor inp;        // (M, K)
  Nf4Tensor weight;  // W (N, K), weight.numel == N·K
  Tensor bias;       // (N) or empty; added as its value in out's dtype, as LinearForward does
  Tensor out;        // (M, N), written
};
// InvalidArgument names a mismatched shape (weight.numel must be out's N times inp's K) or
// buffer; FailedPrecondition names both sizes when ctx.workspace is smaller than
// Nf4LinearWorkspaceBytes.
absl::Status Nf4LinearForward(const DeviceContext& ctx, const Nf4LinearForwardArgs& args);

struct Nf4LinearBackwardArgs {
  Tensor dout;       // (M, N)
  Nf4Tensor weight;  // W (N, K)
  Tensor dinp;       // (M, K): = or += dout · W
  Accumulate dinp_mode = Accumulate::kOverwrite;
};
absl::Status Nf4LinearBackward(const DeviceContext& ctx, const Nf4LinearBackwardArgs& args);

// Scratch bytes Nf4LinearForward and Nf4LinearBackward need in ctx.workspace for a layer of M
// rows, K inputs, N outputs (dtypes.inp, .out, .dout, .dinp say the activations' storage;
// .weight and .dweight are ignored). Errors as GemmWorkspaceBytes's.
absl::StatusOr<int64_t> Nf4LinearWorkspaceBytes(const DeviceContext& ctx, int64_t M, int64_t K,
                                                int64_t N, const LinearDTypes& dtypes = {});

}  // namespace zt
