// CPU reductions on raw f32/bf16/f16 buffers. Arguments are validated by kernels/reduce.cc.
#pragma once

#include <cstdint>

#include "kernels/device.h"
#include "kernels/dtype.h"

namespace zt::cpu {

// Σ x², bitwise the same for any thread count.
double SumOfSquares(const DeviceContext& ctx, const void* x, DType dtype, int64_t n);
bool AllFinite(const DeviceContext& ctx, const void* x, DType dtype, int64_t n);

// *sum += Σ x² (one addition); *flag = 1 when some element is not finite.
void AccumulateSumOfSquares(const DeviceContext& ctx, const void* x, DType dtype, int64_t n,
                            double* sum);
void AccumulateNonFinite(const DeviceContext& ctx, const void* x, DType dtype, int64_t n,
                         float* flag);

}  // namespace zt::cpu
