#include "kernels/activation.h"

#include "absl/strings/str_cat.h"
#include "kernels/arg_checks.h"
#include "kernels/cpu/activation.h"
#include "kernels/cuda/activation.h"
#include "kernels/status_macros.h"

namespace zt {
namespace {

absl::Status CheckFloat(const char* op, const char* arg, const Tensor& t,
                        const DeviceContext& ctx) {
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, arg, t, ctx));
  return internal::CheckFloatDType(op, arg, t);
}

// The packed SwiGLU input: (N, 2F) with an even last dimension.
absl::Status CheckPacked(const char* op, const char* arg, const Tensor& t,
                         const DeviceContext& ctx) {
  ZT_RETURN_IF_ERROR(CheckFloat(op, arg, t, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckRank(op, arg, t, 2));
  if (t.dim(1) % 2 == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", arg, " has shape ", t.DebugString(),
                   "; its last dimension must be even ([gate | up])"));
}

}  // namespace

absl::Status GeluForward(const DeviceContext& ctx, const Tensor& inp, const Tensor& out) {
  constexpr const char* kOp = "GeluForward";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckFloat(kOp, "inp", inp, ctx));
  ZT_RETURN_IF_ERROR(CheckFloat(kOp, "out", out, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckSameShape(kOp, "out", out, "inp", inp));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::GeluForward(ctx, inp, out));
  }
  cpu::GeluForward(ctx, inp, out);
  return absl::OkStatus();
}

absl::Status GeluBackward(const DeviceContext& ctx, const Tensor& inp, const Tensor& dout,
                          const Tensor& dinp) {
  constexpr const char* kOp = "GeluBackward";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckFloat(kOp, "inp", inp, ctx));
  ZT_RETURN_IF_ERROR(CheckFloat(kOp, "dout", dout, ctx));
  ZT_RETURN_IF_ERROR(CheckFloat(kOp, "dinp", dinp, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckSameShape(kOp, "dout", dout, "inp", inp));
  ZT_RETURN_IF_ERROR(internal::CheckSameShape(kOp, "dinp", dinp, "inp", inp));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::GeluBackward(ctx, inp, dout, dinp));
  }
  cpu::GeluBackward(ctx, inp, dout, dinp);
  return absl::OkStatus();
}

absl::Status SwigluForward(const DeviceContext& ctx, const Tensor& inp, const Tensor& out) {
  constexpr const char* kOp = "SwigluForward";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckPacked(kOp, "inp", inp, ctx));
  const int64_t n = inp.dim(0), f = inp.dim(1) / 2;
  ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(kOp, "out", out, ctx, {n, f}));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::SwigluForward(ctx, inp, out));
  }
  cpu::SwigluForward(ctx, inp, out);
  return absl::OkStatus();
}

absl::Status SwigluBackward(const DeviceContext& ctx, const Tensor& inp, const Tensor& dout,
                            const Tensor& dinp) {
  constexpr const char* kOp = "SwigluBackward";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckPacked(kOp, "inp", inp, ctx));
  const int64_t n = inp.dim(0), f = inp.dim(1) / 2;
  ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(kOp, "dout", dout, ctx, {n, f}));
  ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(kOp, "dinp", dinp, ctx, {n, 2 * f}));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::SwigluBackward(ctx, inp, dout, dinp));
  }
  cpu::SwigluBackward(ctx, inp, dout, dinp);
  return absl::OkStatus();
}

}  // namespace zt
