// CPU GELU and SwiGLU on raw f32 buffers. Arguments are validated by kernels/activation.cc.
// Legend: N rows, F hidden width, n elements.
#pragma once

#include <cstdint>

#include "kernels/device.h"

namespace zt::cpu {

void GeluForward(const DeviceContext& ctx, const float* inp, float* out, int64_t n);
// dinp may alias dout.
void GeluBackward(const DeviceContext& ctx, const float* inp, const float* dout, float* dinp,
                  int64_t n);
// inp (N, 2F) = [gate | up], out (N, F).
void SwigluForward(const DeviceContext& ctx, const float* inp, float* out, int64_t rows, int64_t f);
// dinp (N, 2F) = [d gate | d up]; must not alias dout (N, F).
void SwigluBackward(const DeviceContext& ctx, const float* inp, const float* dout, float* dinp,
                    int64_t rows, int64_t f);

}  // namespace zt::cpu
