#include "kernels/elementwise.h"

#include "absl/strings/str_cat.h"
#include "kernels/arg_checks.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/status_macros.h"

namespace zt {
namespace {

constexpr DType kF32 = DType::kF32;

absl::Status CheckF32(const char* op, const char* arg, const Tensor& t, const DeviceContext& ctx) {
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, arg, t, ctx));
  return CheckDType(op, arg, t, kF32);
}

absl::Status CheckFloatDType(const char* op, const char* arg, const Tensor& t) {
  if (t.dtype() == DType::kF32 || t.dtype() == DType::kBF16 || t.dtype() == DType::kF16) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", arg, " has dtype ", DTypeName(t.dtype()),
                                                 ", expected one of f32, bf16, f16"));
}

}  // namespace

absl::Status Add(const DeviceContext& ctx, const Tensor& a, const Tensor& b, const Tensor& out) {
  constexpr const char* kOp = "Add";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckF32(kOp, "a", a, ctx));
  ZT_RETURN_IF_ERROR(CheckF32(kOp, "b", b, ctx));
  ZT_RETURN_IF_ERROR(CheckF32(kOp, "out", out, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckSameNumel(kOp, "b", b, "a", a));
  ZT_RETURN_IF_ERROR(internal::CheckSameNumel(kOp, "out", out, "a", a));
  if (ctx.device.kind == DeviceKind::kCuda) return internal::NoCudaKernel(kOp);
  cpu::Add(ctx, a.data<float>(), b.data<float>(), out.data<float>(), a.numel());
  return absl::OkStatus();
}

absl::Status AddInPlace(const DeviceContext& ctx, const Tensor& acc, const Tensor& x) {
  constexpr const char* kOp = "AddInPlace";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckF32(kOp, "acc", acc, ctx));
  ZT_RETURN_IF_ERROR(CheckF32(kOp, "x", x, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckSameNumel(kOp, "x", x, "acc", acc));
  if (ctx.device.kind == DeviceKind::kCuda) return internal::NoCudaKernel(kOp);
  cpu::Add(ctx, acc.data<float>(), x.data<float>(), acc.data<float>(), acc.numel());
  return absl::OkStatus();
}

absl::Status Scale(const DeviceContext& ctx, const Tensor& t, float s) {
  constexpr const char* kOp = "Scale";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckF32(kOp, "t", t, ctx));
  if (ctx.device.kind == DeviceKind::kCuda) return internal::NoCudaKernel(kOp);
  cpu::Scale(ctx, t.data<float>(), s, t.numel());
  return absl::OkStatus();
}

absl::Status Zero(const DeviceContext& ctx, const Tensor& t) {
  constexpr const char* kOp = "Zero";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(kOp, "t", t, ctx));
  if (ctx.device.kind == DeviceKind::kCuda) return internal::NoCudaKernel(kOp);
  cpu::ZeroBytes(ctx, t.raw(), t.size_bytes());
  return absl::OkStatus();
}

absl::Status Cast(const DeviceContext& ctx, const Tensor& src, const Tensor& dst) {
  constexpr const char* kOp = "Cast";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(kOp, "src", src, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(kOp, "dst", dst, ctx));
  ZT_RETURN_IF_ERROR(CheckFloatDType(kOp, "src", src));
  ZT_RETURN_IF_ERROR(CheckFloatDType(kOp, "dst", dst));
  ZT_RETURN_IF_ERROR(internal::CheckSameNumel(kOp, "dst", dst, "src", src));
  if (ctx.device.kind == DeviceKind::kCuda) return internal::NoCudaKernel(kOp);
  cpu::Cast(ctx, src.raw(), src.dtype(), dst.raw(), dst.dtype(), src.numel());
  return absl::OkStatus();
}

}  // namespace zt
