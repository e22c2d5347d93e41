// Element-wise ops on flat buffers: residual adds, fills, scaling and dtype casts.
// Every tensor argument is treated as a flat array of numel() elements.
#pragma once

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/tensor.h"

namespace zt {

// out = a + b (f32; out may alias a or b). The residual connection.
absl::Status Add(const DeviceContext& ctx, const Tensor& a, const Tensor& b, const Tensor& out);
// acc += x (f32).
absl::Status AddInPlace(const DeviceContext& ctx, const Tensor& acc, const Tensor& x);
// t *= s (f32).
absl::Status Scale(const DeviceContext& ctx, const Tensor& t, float s);
// Every element of t (any dtype) set to zero.
absl::Status Zero(const DeviceContext& ctx, const Tensor& t);
// dst = src converted between f32, bf16 and f16 (round to nearest even), equal numel.
absl::Status Cast(const DeviceContext& ctx, const Tensor& src, const Tensor& dst);

}  // namespace zt
