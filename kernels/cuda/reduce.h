// CUDA reductions: the twins of kernels/cpu/reduce.h, called by kernels/reduce.cc after it
// has checked the arguments. No CUDA header here, so the entry points (and the workspace
// sizing the memory plan calls) compile without nvcc.
#pragma once

#include <algorithm>
#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "kernels/dtype.h"

namespace zt::cuda {

// The first pass runs ReduceBlocks(n) blocks of kReduceThreads threads — a function of n
// alone, never of the device, so the summation order (and the bits) are the same on every
// run and every GPU. ~kReduceItemsPerThread elements per thread keep the partials few;
// kReduceMaxBlocks (8 per SM on an H100's 132) is enough to saturate memory bandwidth.
inline constexpr int kReduceThreads = 256;
inline constexpr int64_t kReduceItemsPerThread = 16;
inline constexpr int64_t kReduceMaxBlocks = 1024;

inline int64_t ReduceBlocks(int64_t n) {
  const int64_t per_block = kReduceThreads * kReduceItemsPerThread;
  return std::clamp<int64_t>((n + per_block - 1) / per_block, 1, kReduceMaxBlocks);
}

// ctx.workspace bytes SumOfSquares and AllFinite need for n elements: one f64 partial per
// block and the f64 result (AllFinite uses 4 of them).
inline int64_t ReduceWorkspaceBytes(int64_t n) { return (ReduceBlocks(n) + 1) * 8; }

// Σ x² in f64: per-thread sums over a fixed stride, a fixed tree in each block, then one
// block adds the block partials in a fixed tree. The result is a host value, so these two
// ops copy it back and wait for ctx's stream: the one place an op synchronizes. The step
// loop calls them once per gradient buffer after the backward pass, where it waits anyway.
absl::StatusOr<double> SumOfSquares(const DeviceContext& ctx, const void* x, DType dtype,
                                    int64_t n);
// No element has an all-ones exponent field (inf or NaN).
absl::StatusOr<bool> AllFinite(const DeviceContext& ctx, const void* x, DType dtype, int64_t n);

// The same reductions without the read-back: the last pass adds Σ x² to the device f64 at
// `sum`, or sets the device f32 at `flag` to 1. Nothing waits.
absl::Status AccumulateSumOfSquares(const DeviceContext& ctx, const void* x, DType dtype, int64_t n,
                                    double* sum);
absl::Status AccumulateNonFinite(const DeviceContext& ctx, const void* x, DType dtype, int64_t n,
                                 float* flag);

}  // namespace zt::cuda
