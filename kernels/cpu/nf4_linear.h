// CPU frozen NF4 linear layer (kernels/nf4_linear.h): dequantize a tile of W into the
// workspace, multiply it in with the CPU GEMM (kernels/cpu/gemm.h), store the tile's outputs.
// Internal to kernels/: kernels/nf4_linear.cc has checked the arguments.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/nf4_linear.h"

namespace zt::cpu {

struct Nf4LinearDims {
  int64_t m = 0;
  int64_t k = 0;
  int64_t n = 0;
};

// Errors: FailedPrecondition for a workspace smaller than Nf4LinearWorkspaceBytes, InternalError
// from the GEMM library.
absl::Status Nf4LinearForward(const DeviceContext& ctx, const Nf4LinearDims& dims,
                              const Nf4LinearForwardArgs& args);
absl::Status Nf4LinearBackward(const DeviceContext& ctx, const Nf4LinearDims& dims,
                               const Nf4LinearBackwardArgs& args);
absl::StatusOr<int64_t> Nf4LinearWorkspaceBytes(const DeviceContext& ctx, const Nf4LinearDims& dims,
                                                const LinearDTypes& dtypes);

}  // namespace zt::cpu
