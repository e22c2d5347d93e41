#include "kernels/reduce.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
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

namespace {

// An f64 accumulator: 2 f32 elements on the context's device, 8-byte aligned.
absl::Status CheckF64Accumulator(const char* op, const char* arg, const Tensor& t,
                                 const DeviceContext& ctx) {
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, arg, t, ctx));
  ZT_RETURN_IF_ERROR(CheckDType(op, arg, t, DType::kF32));
  if (t.numel() != 2 || reinterpret_cast<uintptr_t>(t.raw()) % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", arg, " ", t.DebugString(),
                     " must be 2 f32 elements, 8-byte aligned (the bits of one f64)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AccumulateSumOfSquares(const DeviceContext& ctx, const Tensor& t, const Tensor& sum) {
  constexpr const char* kOp = "AccumulateSumOfSquares";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(kOp, "t", t, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckFloatDType(kOp, "t", t));
  ZT_RETURN_IF_ERROR(CheckF64Accumulator(kOp, "sum", sum, ctx));
  auto* acc = static_cast<double*>(sum.raw());
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::AccumulateSumOfSquares(ctx, t.raw(), t.dtype(), t.numel(), acc));
  }
  cpu::AccumulateSumOfSquares(ctx, t.raw(), t.dtype(), t.numel(), acc);
  return absl::OkStatus();
}

absl::Status AccumulateNonFinite(const DeviceContext& ctx, const Tensor& t, const Tensor& flag) {
  constexpr const char* kOp = "AccumulateNonFinite";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(kOp, "t", t, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckFloatDType(kOp, "t", t));
  ZT_RETURN_IF_ERROR(internal::CheckTensor(kOp, "flag", flag, ctx, DType::kF32, {1}));
  auto* out = static_cast<float*>(flag.raw());
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::AccumulateNonFinite(ctx, t.raw(), t.dtype(), t.numel(), out));
  }
  cpu::AccumulateNonFinite(ctx, t.raw(), t.dtype(), t.numel(), out);
  return absl::OkStatus();
}

}  // namespace zt
