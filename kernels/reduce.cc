#include "kernels/reduce.h"

#include "kernels/arg_checks.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda/reduce.h"
#include "kernels/status_macros.h"

namespace zt {

absl::StatusOr<double> SumOfSquares(const DeviceContext& ctx, const Tensor& t) {
  constexpr const char* kOp = "SumOfSquares";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(kOp, "t", t, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckFloatDType(kOp, "t", t));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::SumOfSquares(ctx, t.raw(), t.dtype(), t.numel()));
  }
  return cpu::SumOfSquares(ctx, t.raw(), t.dtype(), t.numel());
}

absl::StatusOr<bool> AllFinite(const DeviceContext& ctx, const Tensor& t) {
  constexpr const char* kOp = "AllFinite";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(kOp, "t", t, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckFloatDType(kOp, "t", t));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::AllFinite(ctx, t.raw(), t.dtype(), t.numel()));
  }
  return cpu::AllFinite(ctx, t.raw(), t.dtype(), t.numel());
}

int64_t ReduceWorkspaceBytes(const DeviceContext& ctx, int64_t numel) {
  if (ctx.device.kind != DeviceKind::kCuda || numel <= 0) return 0;
  return cuda::ReduceWorkspaceBytes(numel);
}

}  // namespace zt
