// CUDA element-wise ops on raw flat device buffers: the twins of kernels/cpu/elementwise.h,
// called by kernels/elementwise.cc after it has checked the arguments (and by the CUDA GEMM,
// which widens and narrows operands with Cast). No CUDA header here, so the entry points
// compile without nvcc. Each enqueues on StreamOf(ctx) and returns the launch's status.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/dtype.h"

namespace zt::cuda {

// out = a + b, each buffer f32, bf16 or f16; out may alias a or b (each element is read
// before it is written, by the same thread).
absl::Status Add(const DeviceContext& ctx, const void* a, DType a_dtype, const void* b,
                 DType b_dtype, void* out, DType out_dtype, int64_t n);
absl::Status Scale(const DeviceContext& ctx, void* t, DType dtype, float s, int64_t n);
// cudaMemsetAsync: all-zero bytes are +0 in every dtype.
absl::Status ZeroBytes(const DeviceContext& ctx, void* data, int64_t bytes);
// Between f32, bf16 and f16 with the CPU's bit rules (round to nearest even; a NaN keeps its
// sign and payload, quietened), so GPU and CPU casts agree bit for bit, NaNs included. src
// and dst must not overlap unless they are the same buffer of the same dtype.
absl::Status Cast(const DeviceContext& ctx, const void* src, DType src_dtype, void* dst,
                  DType dst_dtype, int64_t n);
// dst (bf16) = src rounded stochastically with the CPU's hash of (seed, element index): the
// same bits as cpu::CastStochastic.
absl::Status CastStochastic(const DeviceContext& ctx, const float* src, uint16_t* dst,
                            uint64_t seed, int64_t n);
// SplitMaster / JoinMaster (kernels/dtype.h) of each element, bit for bit; low may be null.
absl::Status SplitMasterWeights(const DeviceContext& ctx, const float* src, uint16_t* high,
                                int16_t* low, int64_t n);
absl::Status JoinMasterWeights(const DeviceContext& ctx, const uint16_t* high, const int16_t* low,
                               float* dst, int64_t n);

}  // namespace zt::cuda
