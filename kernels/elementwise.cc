#include "kernels/elementwise.h"

#include "absl/strings/str_cat.h"
#include "kernels/arg_checks.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/status_macros.h"

namespace zt {
namespace {

absl::Status CheckFloatDType(const char* op, const char* arg, const Tensor& t) {
  return internal::CheckFloatDType(op, arg, t);
}

absl::Status CheckFloat(const char* op, const char* arg, const Tensor& t,
                        const DeviceContext& ctx) {
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, arg, t, ctx));
  return CheckFloatDType(op, arg, t);
}

}  // namespace

absl::Status Add(const DeviceContext& ctx, const Tensor& a, const Tensor& b, const Tensor& out) {
  constexpr const char* kOp = "Add";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckFloat(kOp, "a", a, ctx));
  ZT_RETURN_IF_ERROR(CheckFloat(kOp, "b", b, ctx));
  ZT_RETURN_IF_ERROR(CheckFloat(kOp, "out", out, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckSameNumel(kOp, "b", b, "a", a));
  ZT_RETURN_IF_ERROR(internal::CheckSameNumel(kOp, "out", out, "a", a));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::Add(ctx, a.raw(), a.dtype(), b.raw(), b.dtype(), out.raw(),
                                     out.dtype(), a.numel()));
  }
  cpu::Add(ctx, a.raw(), a.dtype(), b.raw(), b.dtype(), out.raw(), out.dtype(), a.numel());
  return absl::OkStatus();
}

absl::Status AddInPlace(const DeviceContext& ctx, const Tensor& acc, const Tensor& x) {
  constexpr const char* kOp = "AddInPlace";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckFloat(kOp, "acc", acc, ctx));
  ZT_RETURN_IF_ERROR(CheckFloat(kOp, "x", x, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckSameNumel(kOp, "x", x, "acc", acc));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::Add(ctx, acc.raw(), acc.dtype(), x.raw(), x.dtype(), acc.raw(),
                                     acc.dtype(), acc.numel()));
  }
  cpu::Add(ctx, acc.raw(), acc.dtype(), x.raw(), x.dtype(), acc.raw(), acc.dtype(), acc.numel());
  return absl::OkStatus();
}

absl::Status Scale(const DeviceContext& ctx, const Tensor& t, float s) {
  constexpr const char* kOp = "Scale";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckFloat(kOp, "t", t, ctx));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::Scale(ctx, t.raw(), t.dtype(), s, t.numel()));
  }
  cpu::Scale(ctx, t.raw(), t.dtype(), s, t.numel());
  return absl::OkStatus();
}

absl::Status Zero(const DeviceContext& ctx, const Tensor& t) {
  constexpr const char* kOp = "Zero";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(kOp, "t", t, ctx));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::ZeroBytes(ctx, t.raw(), t.size_bytes()));
  }
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
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp,
                      cuda::Cast(ctx, src.raw(), src.dtype(), dst.raw(), dst.dtype(), src.numel()));
  }
  cpu::Cast(ctx, src.raw(), src.dtype(), dst.raw(), dst.dtype(), src.numel());
  return absl::OkStatus();
}

absl::Status CastStochastic(const DeviceContext& ctx, const Tensor& src, const Tensor& dst,
                            uint64_t seed) {
  constexpr const char* kOp = "CastStochastic";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(kOp, "src", src, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(kOp, "dst", dst, ctx));
  ZT_RETURN_IF_ERROR(CheckDType(kOp, "src", src, DType::kF32));
  ZT_RETURN_IF_ERROR(CheckDType(kOp, "dst", dst, DType::kBF16));
  ZT_RETURN_IF_ERROR(internal::CheckSameNumel(kOp, "dst", dst, "src", src));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(
        kOp, cuda::CastStochastic(ctx, src.data<float>(), dst.data<uint16_t>(), seed, src.numel()));
  }
  cpu::CastStochastic(ctx, src.data<float>(), dst.data<uint16_t>(), seed, src.numel());
  return absl::OkStatus();
}

namespace {

// `t` (named `name`) lives on ctx's device, holds `dtype` and as many elements as `ref`.
absl::Status CheckOperand(const char* op, const DeviceContext& ctx, const char* name,
                          const Tensor& t, DType dtype, const char* ref_name, const Tensor& ref) {
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, name, t, ctx));
  ZT_RETURN_IF_ERROR(CheckDType(op, name, t, dtype));
  return internal::CheckSameNumel(op, name, t, ref_name, ref);
}

}  // namespace

absl::Status SplitMasterWeights(const DeviceContext& ctx, const Tensor& src, const Tensor& high,
                                const Tensor& low) {
  constexpr const char* kOp = "SplitMasterWeights";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckOperand(kOp, ctx, "src", src, DType::kF32, "src", src));
  ZT_RETURN_IF_ERROR(CheckOperand(kOp, ctx, "high", high, DType::kBF16, "src", src));
  // An empty `low` rounds without keeping the remainder (a rank's high half outside its range).
  if (!low.empty()) ZT_RETURN_IF_ERROR(CheckOperand(kOp, ctx, "low", low, DType::kI16, "src", src));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(
        kOp, cuda::SplitMasterWeights(ctx, src.data<float>(), high.data<uint16_t>(),
                                      low.empty() ? nullptr : low.data<int16_t>(), src.numel()));
  }
  cpu::SplitMasterWeights(ctx, src.data<float>(), high.data<uint16_t>(),
                          low.empty() ? nullptr : low.data<int16_t>(), src.numel());
  return absl::OkStatus();
}

absl::Status JoinMasterWeights(const DeviceContext& ctx, const Tensor& high, const Tensor& low,
                               const Tensor& dst) {
  constexpr const char* kOp = "JoinMasterWeights";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckOperand(kOp, ctx, "high", high, DType::kBF16, "high", high));
  ZT_RETURN_IF_ERROR(CheckOperand(kOp, ctx, "low", low, DType::kI16, "high", high));
  ZT_RETURN_IF_ERROR(CheckOperand(kOp, ctx, "dst", dst, DType::kF32, "high", high));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::JoinMasterWeights(ctx, high.data<uint16_t>(), low.data<int16_t>(),
                                                   dst.data<float>(), high.numel()));
  }
  cpu::JoinMasterWeights(ctx, high.data<uint16_t>(), low.data<int16_t>(), dst.data<float>(),
                         high.numel());
  return absl::OkStatus();
}

}  // namespace zt
