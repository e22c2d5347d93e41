// Entry point of kernels/rope.h: argument checks, then dispatch on the device kind.
#include "kernels/rope.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/arg_checks.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/rope.h"
#include "kernels/status_macros.h"

namespace zt {

absl::Status RopeApply(const DeviceContext& ctx, const RopeArgs& args) {
  constexpr const char* kOp = "RopeApply";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  if (args.n_head < 1 || args.n_kv_head < 1 || args.n_head % args.n_kv_head != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": n_head ", args.n_head, " and n_kv_head ", args.n_kv_head,
                     " must both be >= 1 with n_head a multiple of n_kv_head"));
  }
  if (!(args.theta > 0.0f) || !std::isfinite(args.theta)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": theta is ", args.theta, ", expected a finite value > 0"));
  }
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(kOp, "qkv", args.qkv, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckFloatDType(kOp, "qkv", args.qkv));
  const int64_t heads = args.n_head + 2 * static_cast<int64_t>(args.n_kv_head);
  const Tensor& qkv = args.qkv;
  if (qkv.ndim() != 3 || qkv.dim(2) == 0 || qkv.dim(2) % heads != 0 ||
      (qkv.dim(2) / heads) % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": qkv has shape ", qkv.DebugString(),
        ", expected [B, T, (n_head + 2·n_kv_head)·D] with n_head + 2·n_kv_head = ", heads,
        " and D even"));
  }
  const int64_t d = qkv.dim(2) / heads;
  if (!args.positions.empty()) {
    ZT_RETURN_IF_ERROR(internal::CheckTensor(kOp, "positions", args.positions, ctx, DType::kI32,
                                             {qkv.dim(0), qkv.dim(1)}));
  }
  if (ctx.device.kind == DeviceKind::kCuda) return ZT_CUDA_OP(kOp, cuda::RopeApply(ctx, args));
  if (d > cpu::kRopeMaxHeadDim) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": qkv has head size D = ", d,
                     ", the CPU kernel supports D <= ", cpu::kRopeMaxHeadDim));
  }
  cpu::RopeApply(ctx,
                 {.batch = qkv.dim(0),
                  .seq = qkv.dim(1),
                  .rotated_heads = args.n_head + args.n_kv_head,
                  .row = qkv.dim(2),
                  .head_dim = static_cast<int>(d)},
                 args);
  return absl::OkStatus();
}

}  // namespace zt
