#include "kernels/cross_entropy.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/arg_checks.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/status_macros.h"

namespace zt {

absl::Status SoftmaxCrossEntropy(const DeviceContext& ctx, const CrossEntropyArgs& args) {
  constexpr const char* kOp = "SoftmaxCrossEntropy";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(kOp, "logits", args.logits, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckFloatDType(kOp, "logits", args.logits));
  ZT_RETURN_IF_ERROR(internal::CheckRank(kOp, "logits", args.logits, 2));
  const int64_t n = args.logits.dim(0);
  ZT_RETURN_IF_ERROR(internal::CheckTensor(kOp, "targets", args.targets, ctx, DType::kI32, {n}));
  ZT_RETURN_IF_ERROR(internal::CheckTensor(kOp, "losses", args.losses, ctx, DType::kF32, {n}));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::SoftmaxCrossEntropy(ctx, args));
  }
  return cpu::SoftmaxCrossEntropy(ctx, args);
}

absl::Status AccumulateMeanLoss(const DeviceContext& ctx, const MeanLossArgs& args) {
  constexpr const char* kOp = "AccumulateMeanLoss";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  const int64_t n = args.losses.numel();
  ZT_RETURN_IF_ERROR(internal::CheckTensor(kOp, "losses", args.losses, ctx, DType::kF32, {n}));
  ZT_RETURN_IF_ERROR(internal::CheckTensor(kOp, "targets", args.targets, ctx, DType::kI32, {n}));
  ZT_RETURN_IF_ERROR(internal::CheckTensor(kOp, "sum", args.sum, ctx, DType::kF32, {2}));
  if (reinterpret_cast<uintptr_t>(args.sum.raw()) % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": sum must be 8-byte aligned (it holds the bits of one f64)"));
  }
  if (!(args.divisor > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": divisor is ", args.divisor, ", must be positive"));
  }
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::AccumulateMeanLoss(ctx, args));
  }
  cpu::AccumulateMeanLoss(args);
  return absl::OkStatus();
}

}  // namespace zt
