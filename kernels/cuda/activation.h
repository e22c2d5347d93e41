// CUDA GELU and SwiGLU: the twins of kernels/cpu/activation.h, called by
// kernels/activation.cc after it has checked the arguments.
#pragma once

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/tensor.h"

namespace zt::cuda {

absl::Status GeluForward(const DeviceContext& ctx, const Tensor& inp, const Tensor& out);
// dinp may alias dout.
absl::Status GeluBackward(const DeviceContext& ctx, const Tensor& inp, const Tensor& dout,
                          const Tensor& dinp);
absl::Status SwigluForward(const DeviceContext& ctx, const Tensor& inp, const Tensor& out);
absl::Status SwigluBackward(const DeviceContext& ctx, const Tensor& inp, const Tensor& dout,
                            const Tensor& dinp);

}  // namespace zt::cuda
