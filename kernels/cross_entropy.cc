#include "kernels/cross_entropy.h"

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

}  // namespace zt
