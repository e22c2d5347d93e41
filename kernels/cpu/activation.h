// CPU GELU and SwiGLU on f32/bf16/f16 tensors. Arguments are validated by
// kernels/activation.cc.
// Legend: N rows, F hidden width.
#pragma once

#include "kernels/device.h"
#include "kernels/tensor.h"

namespace zt::cpu {

void GeluForward(const DeviceContext& ctx, const Tensor& inp, const Tensor& out);
// dinp may alias dout.
void GeluBackward(const DeviceContext& ctx, const Tensor& inp, const Tensor& dout,
                  const Tensor& dinp);
// inp (N, 2F) = [gate | up], out (N, F).
void SwigluForward(const DeviceContext& ctx, const Tensor& inp, const Tensor& out);
// dinp (N, 2F) = [d gate | d up]; must not alias dout (N, F).
void SwigluBackward(const DeviceContext& ctx, const Tensor& inp, const Tensor& dout,
                    const Tensor& dinp);

}  // namespace zt::cpu
