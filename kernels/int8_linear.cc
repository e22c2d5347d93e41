// Entry points of kernels/int8_linear.h: argument checks, then dispatch on the device kind.
#include "kernels/int8_linear.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/arg_checks.h"
#include "kernels/cpu/int8_linear.h"
#include "kernels/status_macros.h"

namespace zt {
namespace {

constexpr int64_t kAlign = 64;
int64_t AlignUp(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

absl::Status CheckMatrix(const char* op, const char* arg, const Tensor& t,
                         const DeviceContext& ctx) {
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, arg, t, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckFloatDType(op, arg, t));
  return internal::CheckRank(op, arg, t, 2);
}

// The weight's codes are (n, k) u8 and its scales (n) f32; k within the int32 bound.
absl::Status CheckWeight(const char* op, const Int8Weight& w, const DeviceContext& ctx, int64_t n,
                         int64_t k) {
  ZT_RETURN_IF_ERROR(internal::CheckTensor(op, "weight.codes", w.codes, ctx, DType::kU8, {n, k}));
  ZT_RETURN_IF_ERROR(internal::CheckTensor(op, "weight.scales", w.scales, ctx, DType::kF32, {n}));
  if (k <= kInt8MaxK) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": K is ", k, ", at most ", kInt8MaxK,
                                                 " (an int32 sum of K products of 127² must fit)"));
}

absl::Status CpuOnly(const char* op, const DeviceContext& ctx) {
  if (ctx.device.kind == DeviceKind::kCpu) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(op, ": no CUDA kernel in this build"));
}

}  // namespace

int64_t Int8LinearWorkspaceBytes(int64_t M, int64_t K) {
  return AlignUp(M * K) + AlignUp(4 * M) + AlignUp(4 * K);
}

absl::Status Int8QuantizeWeight(const DeviceContext& ctx, const Int8QuantizeWeightArgs& args) {
  constexpr const char* kOp = "Int8QuantizeWeight";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(kOp, "src", args.src, ctx));
  ZT_RETURN_IF_ERROR(CheckDType(kOp, "src", args.src, DType::kF32));
  ZT_RETURN_IF_ERROR(internal::CheckRank(kOp, "src", args.src, 2));
  ZT_RETURN_IF_ERROR(CheckWeight(kOp, args.dst, ctx, args.src.dim(0), args.src.dim(1)));
  ZT_RETURN_IF_ERROR(CpuOnly(kOp, ctx));
  return cpu::Int8QuantizeWeight(ctx, args);
}

absl::Status Int8DequantizeWeight(const DeviceContext& ctx, const Int8DequantizeWeightArgs& args) {
  constexpr const char* kOp = "Int8DequantizeWeight";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(kOp, "dst", args.dst, ctx));
  ZT_RETURN_IF_ERROR(CheckDType(kOp, "dst", args.dst, DType::kF32));
  ZT_RETURN_IF_ERROR(internal::CheckRank(kOp, "dst", args.dst, 2));
  ZT_RETURN_IF_ERROR(CheckWeight(kOp, args.src, ctx, args.dst.dim(0), args.dst.dim(1)));
  ZT_RETURN_IF_ERROR(CpuOnly(kOp, ctx));
  cpu::Int8DequantizeWeight(ctx, args);
  return absl::OkStatus();
}

absl::Status Int8LinearForward(const DeviceContext& ctx, const Int8LinearForwardArgs& args) {
  constexpr const char* kOp = "Int8LinearForward";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckMatrix(kOp, "inp", args.inp, ctx));
  ZT_RETURN_IF_ERROR(CheckMatrix(kOp, "out", args.out, ctx));
  const cpu::Int8LinearDims d{.m = args.inp.dim(0), .k = args.inp.dim(1), .n = args.out.dim(1)};
  if (args.out.dim(0) != d.m) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": out has shape ", args.out.DebugString(),
                                                   ", inp has ", args.inp.DebugString(),
                                                   "; their rows M differ"));
  }
  ZT_RETURN_IF_ERROR(CheckWeight(kOp, args.weight, ctx, d.n, d.k));
  if (!args.bias.empty()) {
    ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(kOp, "bias", args.bias, ctx, {d.n}));
  }
  if (!(args.outlier_threshold > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": outlier_threshold is ", args.outlier_threshold, ", must be > 0 (+inf: off)"));
  }
  ZT_RETURN_IF_ERROR(CpuOnly(kOp, ctx));
  const int64_t need = Int8LinearWorkspaceBytes(d.m, d.k);
  const int64_t have = ctx.workspace.data != nullptr ? ctx.workspace.bytes : 0;
  if (have < need) {
    return absl::FailedPreconditionError(absl::StrCat(kOp, ": the workspace holds ", have,
                                                      " bytes, this call needs ", need,
                                                      " (Int8LinearWorkspaceBytes)"));
  }
  cpu::Int8LinearForward(ctx, d, args);
  return absl::OkStatus();
}

absl::Status Int8LinearBackward(const DeviceContext& ctx, const Int8LinearBackwardArgs& args) {
  constexpr const char* kOp = "Int8LinearBackward";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckMatrix(kOp, "dout", args.dout, ctx));
  ZT_RETURN_IF_ERROR(CheckMatrix(kOp, "dinp", args.dinp, ctx));
  const cpu::Int8LinearDims d{.m = args.dout.dim(0), .k = args.dinp.dim(1), .n = args.dout.dim(1)};
  if (args.dinp.dim(0) != d.m) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": dinp has shape ", args.dinp.DebugString(), ", dout has ",
                     args.dout.DebugString(), "; their rows M differ"));
  }
  ZT_RETURN_IF_ERROR(CheckWeight(kOp, args.weight, ctx, d.n, d.k));
  ZT_RETURN_IF_ERROR(CpuOnly(kOp, ctx));
  cpu::Int8LinearBackward(ctx, d, args);
  return absl::OkStatus();
}

}  // namespace zt
