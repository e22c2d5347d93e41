#include "kernels/norm.h"

#include "absl/strings/str_cat.h"
#include "kernels/arg_checks.h"
#include "kernels/cpu/norm.h"
#include "kernels/status_macros.h"

namespace zt {
namespace {

using internal::CheckTensor;
constexpr DType kF32 = DType::kF32;

// inp is (N, C) f32; every other argument is sized from it.
absl::Status CheckInput(const char* op, const DeviceContext& ctx, const Tensor& inp) {
  ZT_RETURN_IF_ERROR(internal::CheckContext(op, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, "inp", inp, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckFloatDType(op, "inp", inp));
  return internal::CheckRank(op, "inp", inp, 2);
}

absl::Status CheckEps(const char* op, float eps) {
  if (eps > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": eps is ", eps, ", must be > 0"));
}

}  // namespace

absl::Status LayerNormForward(const DeviceContext& ctx, const LayerNormForwardArgs& args) {
  constexpr const char* kOp = "LayerNormForward";
  ZT_RETURN_IF_ERROR(CheckInput(kOp, ctx, args.inp));
  const int64_t n = args.inp.dim(0), c = args.inp.dim(1);
  ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(kOp, "weight", args.weight, ctx, {c}));
  ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(kOp, "bias", args.bias, ctx, {c}));
  ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(kOp, "out", args.out, ctx, {n, c}));
  ZT_RETURN_IF_ERROR(CheckTensor(kOp, "mean", args.mean, ctx, kF32, {n}));
  ZT_RETURN_IF_ERROR(CheckTensor(kOp, "rstd", args.rstd, ctx, kF32, {n}));
  ZT_RETURN_IF_ERROR(CheckEps(kOp, args.eps));
  if (ctx.device.kind == DeviceKind::kCuda) return internal::NoCudaKernel(kOp);
  cpu::LayerNormForward(ctx, args);
  return absl::OkStatus();
}

absl::Status LayerNormBackward(const DeviceContext& ctx, const LayerNormBackwardArgs& args) {
  constexpr const char* kOp = "LayerNormBackward";
  ZT_RETURN_IF_ERROR(CheckInput(kOp, ctx, args.inp));
  const int64_t n = args.inp.dim(0), c = args.inp.dim(1);
  ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(kOp, "dout", args.dout, ctx, {n, c}));
  ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(kOp, "weight", args.weight, ctx, {c}));
  ZT_RETURN_IF_ERROR(CheckTensor(kOp, "mean", args.mean, ctx, kF32, {n}));
  ZT_RETURN_IF_ERROR(CheckTensor(kOp, "rstd", args.rstd, ctx, kF32, {n}));
  ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(kOp, "dinp", args.dinp, ctx, {n, c}));
  ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(kOp, "dweight", args.dweight, ctx, {c}));
  ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(kOp, "dbias", args.dbias, ctx, {c}));
  if (ctx.device.kind == DeviceKind::kCuda) return internal::NoCudaKernel(kOp);
  cpu::LayerNormBackward(ctx, args);
  return absl::OkStatus();
}

absl::Status RmsNormForward(const DeviceContext& ctx, const RmsNormForwardArgs& args) {
  constexpr const char* kOp = "RmsNormForward";
  ZT_RETURN_IF_ERROR(CheckInput(kOp, ctx, args.inp));
  const int64_t n = args.inp.dim(0), c = args.inp.dim(1);
  ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(kOp, "weight", args.weight, ctx, {c}));
  ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(kOp, "out", args.out, ctx, {n, c}));
  ZT_RETURN_IF_ERROR(CheckTensor(kOp, "rstd", args.rstd, ctx, kF32, {n}));
  ZT_RETURN_IF_ERROR(CheckEps(kOp, args.eps));
  if (ctx.device.kind == DeviceKind::kCuda) return internal::NoCudaKernel(kOp);
  cpu::RmsNormForward(ctx, args);
  return absl::OkStatus();
}

absl::Status RmsNormBackward(const DeviceContext& ctx, const RmsNormBackwardArgs& args) {
  constexpr const char* kOp = "RmsNormBackward";
  ZT_RETURN_IF_ERROR(CheckInput(kOp, ctx, args.inp));
  const int64_t n = args.inp.dim(0), c = args.inp.dim(1);
  ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(kOp, "dout", args.dout, ctx, {n, c}));
  ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(kOp, "weight", args.weight, ctx, {c}));
  ZT_RETURN_IF_ERROR(CheckTensor(kOp, "rstd", args.rstd, ctx, kF32, {n}));
  ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(kOp, "dinp", args.dinp, ctx, {n, c}));
  ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(kOp, "dweight", args.dweight, ctx, {c}));
  if (ctx.device.kind == DeviceKind::kCuda) return internal::NoCudaKernel(kOp);
  cpu::RmsNormBackward(ctx, args);
  return absl::OkStatus();
}

}  // namespace zt
