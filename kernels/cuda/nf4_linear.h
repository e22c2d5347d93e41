// CUDA frozen NF4 linear layer: the twin of kernels/cpu/nf4_linear.h, called by
// kernels/nf4_linear.cc after it has checked the arguments and cut the workspace (the same
// layout on both backends). Each tile of W is dequantized by a kernel into the workspace —
// bit for bit the CPU's dequantized values — and multiplied in with cuBLASLt (kernels/cuda/
// linear.h). No CUDA header here, so the entry points compile without nvcc.
#pragma once

#include "absl/status/status.h"
#include "kernels/cpu/nf4_linear.h"
#include "kernels/nf4_linear.h"

namespace zt::cuda {

absl::Status Nf4LinearForward(const cpu::Nf4LinearScratch& scratch, const cpu::Nf4LinearDims& dims,
                              const Nf4LinearForwardArgs& args);
absl::Status Nf4LinearBackward(const cpu::Nf4LinearScratch& scratch, const cpu::Nf4LinearDims& dims,
                               const Nf4LinearBackwardArgs& args);

}  // namespace zt::cuda
