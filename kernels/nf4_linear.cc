// Entry points of kernels/nf4_linear.h: argument checks, then dispatch on the device kind.
#include "kernels/nf4_linear.h"

#include "absl/strings/str_cat.h"
#include "kernels/arg_checks.h"
#include "kernels/cpu/nf4_linear.h"
#include "kernels/status_macros.h"

namespace zt {
namespace {

// A 2-D f32/bf16/f16 matrix on the context's device.
absl::Status CheckMatrix(const char* op, const char* arg, const Tensor& t,
                         const DeviceContext& ctx) {
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, arg, t, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckFloatDType(op, arg, t));
  return internal::CheckRank(op, arg, t, 2);
}

// weight holds N·K elements.
absl::Status CheckWeight(const char* op, const Nf4Tensor& w, const DeviceContext& ctx, int64_t n,
                         int64_t k) {
  ZT_RETURN_IF_ERROR(CheckNf4Tensor(op, "weight", w, ctx));
  if (w.numel == n * k) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": weight.numel is ", w.numel,
                                                 ", the layer's W (N, K) = (", n, ", ", k, ") has ",
                                                 n * k, " elements"));
}

absl::Status NoCuda(const char* op) {
  return absl::UnimplementedError(absl::StrCat(op, ": no CUDA kernel in this build"));
}

}  // namespace

absl::Status Nf4LinearForward(const DeviceContext& ctx, const Nf4LinearForwardArgs& args) {
  constexpr const char* kOp = "Nf4LinearForward";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckMatrix(kOp, "inp", args.inp, ctx));
  ZT_RETURN_IF_ERROR(CheckMatrix(kOp, "out", args.out, ctx));
  const cpu::Nf4LinearDims d{.m = args.inp.dim(0), .k = args.inp.dim(1), .n = args.out.dim(1)};
  if (args.out.dim(0) != d.m) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": out has shape ", args.out.DebugString(),
                                                   ", inp has ", args.inp.DebugString(),
                                                   "; their rows M differ"));
  }
  ZT_RETURN_IF_ERROR(CheckWeight(kOp, args.weight, ctx, d.n, d.k));
  if (!args.bias.empty()) {
    ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(kOp, "bias", args.bias, ctx, {d.n}));
  }
  if (ctx.device.kind == DeviceKind::kCuda) return NoCuda(kOp);
  return cpu::Nf4LinearForward(ctx, d, args);
}

absl::Status Nf4LinearBackward(const DeviceContext& ctx, const Nf4LinearBackwardArgs& args) {
  constexpr const char* kOp = "Nf4LinearBackward";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckMatrix(kOp, "dout", args.dout, ctx));
  ZT_RETURN_IF_ERROR(CheckMatrix(kOp, "dinp", args.dinp, ctx));
  const cpu::Nf4LinearDims d{.m = args.dout.dim(0), .k = args.dinp.dim(1), .n = args.dout.dim(1)};
  if (args.dinp.dim(0) != d.m) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": dinp has shape ", args.dinp.DebugString(), ", dout has ",
                     args.dout.DebugString(), "; their rows M differ"));
  }
  ZT_RETURN_IF_ERROR(CheckWeight(kOp, args.weight, ctx, d.n, d.k));
  if (ctx.device.kind == DeviceKind::kCuda) return NoCuda(kOp);
  return cpu::Nf4LinearBackward(ctx, d, args);
}

absl::StatusOr<int64_t> Nf4LinearWorkspaceBytes(const DeviceContext& ctx, int64_t M, int64_t K,
                                                int64_t N, const LinearDTypes& dtypes) {
  constexpr const char* kOp = "Nf4LinearWorkspaceBytes";
  if (M < 0 || K < 1 || N < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": M = ", M, ", K = ", K, ", N = ", N, "; M must be >= 0, K and N >= 1"));
  }
  if (ctx.device.kind == DeviceKind::kCuda) return NoCuda(kOp);
  return cpu::Nf4LinearWorkspaceBytes(ctx, {.m = M, .k = K, .n = N}, dtypes);
}

}  // namespace zt
