#include "kernels/norm.h"

#include "absl/strings/str_cat.h"
#include "kernels/arg_checks.h"
#include "kernels/cpu/norm.h"
#include "kernels/cuda/norm.h"
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

// ctx.workspace holds `need` bytes.
absl::Status CheckWorkspace(const char* op, const DeviceContext& ctx, int64_t need,
                            const char* sizer) {
  if (ctx.workspace.bytes >= need && (need == 0 || ctx.workspace.data != nullptr)) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(op, ": ctx.workspace holds ",
                                                    ctx.workspace.bytes, " bytes, this call needs ",
                                                    need, " (", sizer, ")"));
}

int64_t ParamGradWorkspaceBytes(DeviceKind kind, int64_t rows, int64_t channels, int sums) {
  if (kind != DeviceKind::kCuda || rows <= 0 || channels <= 0) return 0;
  return cuda::NormBackwardBlocks(rows) * channels * sums * static_cast<int64_t>(sizeof(float));
}

}  // namespace

int64_t LayerNormBackwardWorkspaceBytes(DeviceKind kind, int64_t rows, int64_t channels) {
  return ParamGradWorkspaceBytes(kind, rows, channels, /*sums=*/2);
}

int64_t RmsNormBackwardWorkspaceBytes(DeviceKind kind, int64_t rows, int64_t channels) {
  return ParamGradWorkspaceBytes(kind, rows, channels, /*sums=*/1);
}

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
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::LayerNormForward(ctx, args));
  }
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
  if (ctx.device.kind == DeviceKind::kCuda) {
    ZT_RETURN_IF_ERROR(CheckWorkspace(kOp, ctx,
                                      LayerNormBackwardWorkspaceBytes(ctx.device.kind, n, c),
                                      "LayerNormBackwardWorkspaceBytes"));
    return ZT_CUDA_OP(kOp, cuda::LayerNormBackward(ctx, args));
  }
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
  if (ctx.device.kind == DeviceKind::kCuda) return ZT_CUDA_OP(kOp, cuda::RmsNormForward(ctx, args));
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
  if (ctx.device.kind == DeviceKind::kCuda) {
    ZT_RETURN_IF_ERROR(CheckWorkspace(kOp, ctx,
                                      RmsNormBackwardWorkspaceBytes(ctx.device.kind, n, c),
                                      "RmsNormBackwardWorkspaceBytes"));
    return ZT_CUDA_OP(kOp, cuda::RmsNormBackward(ctx, args));
  }
  cpu::RmsNormBackward(ctx, args);
  return absl::OkStatus();
}

}  // namespace zt
