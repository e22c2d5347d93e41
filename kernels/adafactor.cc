#include "kernels/adafactor.h"

#include "absl/strings/str_cat.h"
#include "kernels/arg_checks.h"
#include "kernels/cpu/adafactor.h"
#include "kernels/status_macros.h"

namespace zt {
namespace {

// An optional f32 state buffer: must be present (with `numel` elements) exactly when `want`.
absl::Status CheckState(const char* op, const char* arg, const Tensor& t, bool want, int64_t numel,
                        const char* rule, const DeviceContext& ctx) {
  if (!want) {
    if (t.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", arg, " ", t.DebugString(), " is given but must be empty: ", rule));
  }
  if (t.empty() && numel != 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", arg, " is empty: ", rule));
  }
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, arg, t, ctx));
  ZT_RETURN_IF_ERROR(CheckDType(op, arg, t, DType::kF32));
  if (t.numel() == numel) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", arg, " ", t.DebugString(), " has ",
                                                 t.numel(), " elements, must have ", numel, ": ",
                                                 rule));
}

absl::Status CheckHyperparameters(const char* op, const AdafactorArgs& a) {
  const auto bad = [op](const char* field, float value, const char* rule) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", field, " is ", value, ", ", rule));
  };
  if (a.step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": step is ", a.step, ", must be at least 1 (it is 1-based)"));
  }
  if (!(a.beta1 >= 0.0f && a.beta1 < 1.0f)) return bad("beta1", a.beta1, "must be in [0, 1)");
  if (a.m.empty() && a.beta1 != 0.0f) {
    return bad("beta1", a.beta1,
               "but m is empty; a first-moment buffer is required unless beta1 is 0");
  }
  if (!(a.decay_rate < 0.0f)) {
    return bad("decay_rate", a.decay_rate, "must be < 0 (beta2 at step t is 1 - t^decay_rate)");
  }
  if (!(a.eps1 > 0.0f)) return bad("eps1", a.eps1, "must be > 0");
  if (!(a.eps2 >= 0.0f)) return bad("eps2", a.eps2, "must be >= 0");
  if (!(a.clip_threshold > 0.0f)) return bad("clip_threshold", a.clip_threshold, "must be > 0");
  if (!(a.lr >= 0.0f)) return bad("lr", a.lr, "must be >= 0");
  if (a.relative_step && a.lr != 0.0f) {
    return bad("lr", a.lr,
               "but relative_step is set, which computes the step size; set lr to 0 or "
               "relative_step to false");
  }
  if (a.warmup_init && !a.relative_step) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": warmup_init is set but relative_step is not; it requires it"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AdafactorUpdate(const DeviceContext& ctx, const AdafactorArgs& args) {
  constexpr const char* kOp = "AdafactorUpdate";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(kOp, "param", args.param, ctx));
  ZT_RETURN_IF_ERROR(CheckDType(kOp, "param", args.param, DType::kF32));
  const int ndim = args.param.ndim();
  if (ndim != 1 && ndim != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": param has shape ", args.param.DebugString(),
                     ", must be a vector (n) or a matrix (rows, cols); pass (product of leading "
                     "dims, last dim)"));
  }
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(kOp, "grad", args.grad, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckFloatDType(kOp, "grad", args.grad));
  ZT_RETURN_IF_ERROR(internal::CheckSameShape(kOp, "grad", args.grad, "param", args.param));
  ZT_RETURN_IF_ERROR(
      internal::CheckParamCopy(kOp, args.param_copy, args.stochastic_rounding, args.param, ctx));
  const bool factored = ndim == 2;
  const int64_t rows = factored ? args.param.dim(0) : 0, cols = factored ? args.param.dim(1) : 0;
  ZT_RETURN_IF_ERROR(CheckState(kOp, "row_state", args.row_state, factored, rows,
                                "a matrix param needs one per row, a vector none", ctx));
  ZT_RETURN_IF_ERROR(CheckState(kOp, "col_state", args.col_state, factored, cols,
                                "a matrix param needs one per column, a vector none", ctx));
  ZT_RETURN_IF_ERROR(CheckState(kOp, "full_state", args.full_state, !factored, args.param.numel(),
                                "a vector param needs one per element, a matrix none", ctx));
  ZT_RETURN_IF_ERROR(CheckState(kOp, "m", args.m, !args.m.empty(), args.param.numel(),
                                "one per parameter element", ctx));
  ZT_RETURN_IF_ERROR(CheckHyperparameters(kOp, args));
  if (ctx.device.kind == DeviceKind::kCuda) return internal::NoCudaKernel(kOp);
  // An empty shard has nothing to update (and no RMS to take).
  if (args.param.numel() == 0) return absl::OkStatus();
  cpu::AdafactorUpdate(ctx, args);
  return absl::OkStatus();
}

}  // namespace zt
