// CPU frozen NF4 linear layer (kernels/nf4_linear.h): dequantize a tile of W into the
// workspace, multiply it in with the CPU GEMM (kernels/cpu/gemm.h), store the tile's outputs.
// Internal to kernels/: kernels/nf4_linear.cc has checked the arguments and split the
// workspace. The dimensions and the split are shared with the CUDA twin.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/nf4_linear.h"

namespace zt::cpu {

struct Nf4LinearDims {
  int64_t m = 0;
  int64_t k = 0;
  int64_t n = 0;
};

// ctx.workspace cut into its three pieces (64-byte aligned): the f32 W tile,
// max(tile·K, N·tile) floats; the GEMM's f32 (M, tile) result; and the rest, the GEMM's own
// scratch, as gemm_ctx's workspace.
struct Nf4LinearScratch {
  float* tile = nullptr;
  float* result = nullptr;
  DeviceContext gemm_ctx;
};

// Errors: InternalError from the GEMM library.
absl::Status Nf4LinearForward(const Nf4LinearScratch& scratch, const Nf4LinearDims& dims,
                              const Nf4LinearForwardArgs& args);
absl::Status Nf4LinearBackward(const Nf4LinearScratch& scratch, const Nf4LinearDims& dims,
                               const Nf4LinearBackwardArgs& args);

}  // namespace zt::cpu
