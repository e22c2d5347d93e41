// Pointwise activations of the MLP.
// Legend: N rows (B·T), F hidden width.
// GELU is the tanh approximation GPT-2 uses:
//   gelu(x) = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
// SwiGLU (Llama) takes a packed (N, 2F) input [gate | up] and gives silu(gate) · up.
// Accumulation rule: input gradients are written (=). Backward may run in place
// (dinp aliasing dout) where the shapes agree.
#pragma once

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/tensor.h"

namespace zt {

// Each tensor may be f32, bf16 or f16 independently: elements are loaded to f32, computed as
// the f32 path computes them and rounded once when stored.

// out = gelu(inp); inp and out any equal shape.
absl::Status GeluForward(const DeviceContext& ctx, const Tensor& inp, const Tensor& out);
// dinp = gelu'(inp) · dout.
absl::Status GeluBackward(const DeviceContext& ctx, const Tensor& inp, const Tensor& dout,
                          const Tensor& dinp);

// inp (N, 2F) = [gate | up] per row; out (N, F) = silu(gate) · up.
absl::Status SwigluForward(const DeviceContext& ctx, const Tensor& inp, const Tensor& out);
// dinp (N, 2F) = [d gate | d up].
absl::Status SwigluBackward(const DeviceContext& ctx, const Tensor& inp, const Tensor& dout,
                            const Tensor& dinp);

}  // namespace zt
