// Entry points of kernels/nf4_linear.h: argument checks, then dispatch on the device kind.
#include "kernels/nf4_linear.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/arg_checks.h"
#include "kernels/cpu/nf4_linear.h"
#include "kernels/cuda/nf4_linear.h"
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

constexpr int64_t kAlign = 64;
int64_t AlignUp(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Workspace layout, the same on both backends, each piece 64-byte aligned:
//   [ W tile, f32: max(tile·K, N·tile) ][ GEMM result, f32: M·tile ][ the GEMM's own scratch ]
// The GEMM's part is the most any GEMM of the layer needs on the context's backend: forward
// (M, t, K) against the tile transposed, backward (M, t, N), for t a full tile and the last
// partial one.
struct WorkspacePlan {
  int64_t tile_bytes = 0;
  int64_t result_bytes = 0;
  int64_t gemm_bytes = 0;
  int64_t total() const { return tile_bytes + result_bytes + gemm_bytes; }
};

absl::StatusOr<WorkspacePlan> PlanWorkspace(const DeviceContext& ctx, const cpu::Nf4LinearDims& d,
                                            const LinearDTypes& dtypes) {
  const int64_t fwd_tile = std::min(kNf4LinearTile, d.n);
  const int64_t bwd_tile = std::min(kNf4LinearTile, d.k);
  WorkspacePlan p;
  p.tile_bytes = AlignUp(4 * std::max(fwd_tile * d.k, d.n * bwd_tile));
  p.result_bytes = AlignUp(4 * d.m * std::max(fwd_tile, bwd_tile));
  for (const int64_t t : {fwd_tile, d.n % kNf4LinearTile}) {
    if (t == 0) continue;
    ZT_ASSIGN_OR_RETURN(
        const int64_t bytes,
        GemmWorkspaceBytes(
            ctx, {.m = d.m, .n = t, .k = d.k, .trans_b = Transpose::kYes, .a_dtype = dtypes.inp}));
    p.gemm_bytes = std::max(p.gemm_bytes, bytes);
  }
  for (const int64_t t : {bwd_tile, d.k % kNf4LinearTile}) {
    if (t == 0) continue;
    ZT_ASSIGN_OR_RETURN(
        const int64_t bytes,
        GemmWorkspaceBytes(ctx, {.m = d.m, .n = t, .k = d.n, .a_dtype = dtypes.dout}));
    p.gemm_bytes = std::max(p.gemm_bytes, bytes);
  }
  return p;
}

// The workspace cut by the plan, after checking it holds it.
absl::StatusOr<cpu::Nf4LinearScratch> SplitWorkspace(const char* op, const DeviceContext& ctx,
                                                     const cpu::Nf4LinearDims& d,
                                                     const LinearDTypes& dtypes) {
  ZT_ASSIGN_OR_RETURN(const WorkspacePlan p, PlanWorkspace(ctx, d, dtypes));
  const int64_t have = ctx.workspace.data != nullptr ? ctx.workspace.bytes : 0;
  if (have < p.total()) {
    return absl::FailedPreconditionError(absl::StrCat(op, ": the workspace holds ", have,
                                                      " bytes, this call needs ", p.total(),
                                                      " (Nf4LinearWorkspaceBytes)"));
  }
  auto* base = static_cast<uint8_t*>(ctx.workspace.data);
  cpu::Nf4LinearScratch s{.tile = reinterpret_cast<float*>(base),
                          .result = reinterpret_cast<float*>(base + p.tile_bytes),
                          .gemm_ctx = ctx};
  s.gemm_ctx.workspace = {.data = base + p.tile_bytes + p.result_bytes,
                          .bytes = have - p.tile_bytes - p.result_bytes};
  return s;
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
  ZT_ASSIGN_OR_RETURN(
      const cpu::Nf4LinearScratch scratch,
      SplitWorkspace(kOp, ctx, d, {.inp = args.inp.dtype(), .out = args.out.dtype()}));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::Nf4LinearForward(scratch, d, args));
  }
  return cpu::Nf4LinearForward(scratch, d, args);
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
  ZT_ASSIGN_OR_RETURN(
      const cpu::Nf4LinearScratch scratch,
      SplitWorkspace(kOp, ctx, d, {.dout = args.dout.dtype(), .dinp = args.dinp.dtype()}));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::Nf4LinearBackward(scratch, d, args));
  }
  return cpu::Nf4LinearBackward(scratch, d, args);
}

absl::StatusOr<int64_t> Nf4LinearWorkspaceBytes(const DeviceContext& ctx, int64_t M, int64_t K,
                                                int64_t N, const LinearDTypes& dtypes) {
  constexpr const char* kOp = "Nf4LinearWorkspaceBytes";
  if (M < 0 || K < 1 || N < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": M = ", M, ", K = ", K, ", N = ", N, "; M must be >= 0, K and N >= 1"));
  }
  ZT_ASSIGN_OR_RETURN(const WorkspacePlan p, PlanWorkspace(ctx, {.m = M, .k = K, .n = N}, dtypes));
  return p.total();
}

}  // namespace zt
