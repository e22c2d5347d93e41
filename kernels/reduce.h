// Reductions used by the optimizer: the global gradient norm is the square root of the sum
// of SumOfSquares over every gradient buffer (of this rank, then across ranks).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "kernels/tensor.h"

namespace zt {

// On CUDA both ops return a host value, so they copy it back and wait for ctx's stream.

// Σ x² over the tensor (f32, bf16 or f16), accumulated in double over fixed-size chunks combined in
// a fixed order: the result is bitwise the same for any thread count.
absl::StatusOr<double> SumOfSquares(const DeviceContext& ctx, const Tensor& t);

// True when every element of the tensor (f32, bf16 or f16) is finite (no inf, no NaN): the
// loss scaler's overflow check on 16-bit gradients.
absl::StatusOr<bool> AllFinite(const DeviceContext& ctx, const Tensor& t);

// Bytes of ctx.workspace SumOfSquares and AllFinite need for a tensor of `numel` elements:
// 0 on the CPU; on CUDA the per-block partials of the two-pass reduction (at most ~8 KiB,
// well inside the GEMM workspace the memory plan already gives a CUDA context).
// FailedPrecondition from either op names both sizes when the workspace is smaller.
int64_t ReduceWorkspaceBytes(const DeviceContext& ctx, int64_t numel);

// The same two reductions, kept on the device: their result is added to an accumulator in
// ctx's memory instead of returned, so a step reads all its statistics back at once instead of
// waiting for the stream once per buffer. Neither synchronizes. Workspace as above.
//
// An f64 accumulator is an 8-byte-aligned f32 tensor of 2 elements holding the bits of one
// double (the layout comm.scalars carries doubles in, worker/shard/sharding_engine.cc).
// sum += SumOfSquares(t), added once, so the CPU's value is bitwise sum + SumOfSquares(t).
absl::Status AccumulateSumOfSquares(const DeviceContext& ctx, const Tensor& t, const Tensor& sum);
// flag (one f32) is set to 1 when some element of t is not finite, else left as it is.
absl::Status AccumulateNonFinite(const DeviceContext& ctx, const Tensor& t, const Tensor& flag);

}  // namespace zt
