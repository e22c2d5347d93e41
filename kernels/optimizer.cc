#include "kernels/optimizer.h"

#include "absl/strings/str_cat.h"
#include "kernels/arg_checks.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/cuda/optimizer.h"
#include "kernels/status_macros.h"

namespace zt {
namespace {

// An optimizer buffer: f32 on the context's device with param's element count.
absl::Status CheckBuffer(const char* op, const char* arg, const Tensor& t, const Tensor& param,
                         const DeviceContext& ctx) {
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, arg, t, ctx));
  ZT_RETURN_IF_ERROR(CheckDType(op, arg, t, DType::kF32));
  return internal::CheckSameNumel(op, arg, t, "param", param);
}

}  // namespace

absl::Status AdamWUpdate(const DeviceContext& ctx, const AdamWArgs& args) {
  constexpr const char* kOp = "AdamWUpdate";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckMaster(kOp, args.param, args.param_copy,
                                           args.stochastic_rounding, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckGrad(kOp, args.grad, args.param, ctx));
  ZT_RETURN_IF_ERROR(
      internal::CheckParamCopy(kOp, args.param_copy, args.stochastic_rounding, args.param, ctx));
  ZT_RETURN_IF_ERROR(CheckBuffer(kOp, "m", args.m, args.param, ctx));
  ZT_RETURN_IF_ERROR(CheckBuffer(kOp, "v", args.v, args.param, ctx));
  ZT_RETURN_IF_ERROR(
      internal::CheckAdamHyperparameters(kOp, args.beta1, args.beta2, args.eps, args.step));
  if (ctx.device.kind == DeviceKind::kCuda) return ZT_CUDA_OP(kOp, cuda::AdamWUpdate(ctx, args));
  cpu::AdamWUpdate(ctx, args);
  return absl::OkStatus();
}

absl::Status SgdUpdate(const DeviceContext& ctx, const SgdArgs& args) {
  constexpr const char* kOp = "SgdUpdate";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckMaster(kOp, args.param, args.param_copy,
                                           args.stochastic_rounding, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckGrad(kOp, args.grad, args.param, ctx));
  ZT_RETURN_IF_ERROR(
      internal::CheckParamCopy(kOp, args.param_copy, args.stochastic_rounding, args.param, ctx));
  if (!args.momentum.empty()) {
    ZT_RETURN_IF_ERROR(CheckBuffer(kOp, "momentum", args.momentum, args.param, ctx));
  } else if (args.momentum_factor != 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": momentum is empty but momentum_factor is ", args.momentum_factor,
                     "; a buffer is required when it is not 0"));
  }
  if (ctx.device.kind == DeviceKind::kCuda) return ZT_CUDA_OP(kOp, cuda::SgdUpdate(ctx, args));
  cpu::SgdUpdate(ctx, args);
  return absl::OkStatus();
}

}  // namespace zt
