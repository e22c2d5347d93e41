#include "kernels/adam8bit.h"

#include "absl/strings/str_cat.h"
#include "kernels/arg_checks.h"
#include "kernels/cpu/adam8bit.h"
#include "kernels/cuda/adam8bit.h"
#include "kernels/quantization.h"
#include "kernels/status_macros.h"

namespace zt {
absl::Status AdamW8bitUpdate(const DeviceContext& ctx, const AdamW8bitArgs& args) {
  constexpr const char* kOp = "AdamW8bitUpdate";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckQuantBlock(kOp, args.block));
  ZT_RETURN_IF_ERROR(internal::CheckMaster(kOp, args.param, args.param_copy,
                                           args.stochastic_rounding, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckGrad(kOp, args.grad, args.param, ctx));
  ZT_RETURN_IF_ERROR(
      internal::CheckParamCopy(kOp, args.param_copy, args.stochastic_rounding, args.param, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckQuantizedBuffer(kOp, "m_codes", args.m_codes, "m_absmax",
                                                    args.m_absmax, "param", args.param, args.block,
                                                    ctx));
  ZT_RETURN_IF_ERROR(internal::CheckQuantizedBuffer(kOp, "v_codes", args.v_codes, "v_absmax",
                                                    args.v_absmax, "param", args.param, args.block,
                                                    ctx));
  ZT_RETURN_IF_ERROR(
      internal::CheckAdamHyperparameters(kOp, args.beta1, args.beta2, args.eps, args.step));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::AdamW8bitUpdate(ctx, args));
  }
  cpu::AdamW8bitUpdate(ctx, args);
  return absl::OkStatus();
}

}  // namespace zt
