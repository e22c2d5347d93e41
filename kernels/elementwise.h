// Element-wise ops on flat buffers: residual adds, fills, scaling and dtype casts.
// Every tensor argument is treated as a flat array of numel() elements.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/tensor.h"

namespace zt {

// Arithmetic ops take f32, bf16 or f16 for each tensor independently: elements are loaded to
// f32, computed in f32 and rounded once (to nearest even) when stored, so f16 overflows to
// ±inf as on a GPU.

// out = a + b (out may alias a or b). The residual connection.
absl::Status Add(const DeviceContext& ctx, const Tensor& a, const Tensor& b, const Tensor& out);
// acc += x.
absl::Status AddInPlace(const DeviceContext& ctx, const Tensor& acc, const Tensor& x);
// t *= s.
absl::Status Scale(const DeviceContext& ctx, const Tensor& t, float s);
// Every element of t (any dtype) set to zero.
absl::Status Zero(const DeviceContext& ctx, const Tensor& t);
// dst = src converted between f32, bf16 and f16 (round to nearest even), equal numel.
absl::Status Cast(const DeviceContext& ctx, const Tensor& src, const Tensor& dst);
// dst (bf16) = src (f32) rounded stochastically: up with probability equal to the discarded
// fraction of a bf16 ulp, so the rounding is unbiased. The random bits come from a hash of
// (seed, element index): the same seed gives the same bits for any thread count.
absl::Status CastStochastic(const DeviceContext& ctx, const Tensor& src, const Tensor& dst,
                            uint64_t seed);
// A split fp32 master (SplitMaster in kernels/dtype.h): high (bf16) and low (i16) of src
// (f32), equal numel. low may be empty: the high halves alone, which are src rounded to
// nearest (ties away from zero) — what every rank holding the bf16 parameters writes, while
// only the rank owning an element keeps its low half.
absl::Status SplitMasterWeights(const DeviceContext& ctx, const Tensor& src, const Tensor& high,
                                const Tensor& low);
// dst (f32) = the master whose halves are high (bf16) and low (i16), equal numel.
absl::Status JoinMasterWeights(const DeviceContext& ctx, const Tensor& high, const Tensor& low,
                               const Tensor& dst);

}  // namespace zt
