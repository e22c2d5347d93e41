// CPU frozen NF4 linear layer. Workspace layout, each piece 64-byte aligned:
//   [ W tile, f32: max(tile·K, N·tile) ][ GEMM result, f32: M·tile ][ the GEMM's own scratch ]
// The forward walks W's rows (a (tile, K) tile gives out's columns [n0, n0 + tile)), the
// backward W's columns (an (N, tile) tile gives dinp's columns [k0, k0 + tile)), so every
// output element comes out of one GEMM and is rounded into its dtype once.
#include "kernels/cpu/nf4_linear.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/load_store.h"
#include "kernels/cpu/nf4.h"
#include "kernels/status_macros.h"

namespace zt::cpu {
namespace {

constexpr int64_t kAlign = 64;

int64_t AlignUp(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

struct WorkspacePlan {
  int64_t tile_bytes = 0;
  int64_t result_bytes = 0;
  int64_t gemm_bytes = 0;
  int64_t total() const { return tile_bytes + result_bytes + gemm_bytes; }
};

// The GEMMs that run: forward (M, t, K) with Wᵀ for t = a full tile and the last partial one,
// backward (M, t, N) likewise over K.
absl::StatusOr<WorkspacePlan> PlanWorkspace(const DeviceContext& ctx, const Nf4LinearDims& d,
                                            const LinearDTypes& dtypes) {
  const int64_t fwd_tile = std::min(kNf4LinearTile, d.n);
  const int64_t bwd_tile = std::min(kNf4LinearTile, d.k);
  WorkspacePlan p;
  p.tile_bytes = AlignUp(4 * std::max(fwd_tile * d.k, d.n * bwd_tile));
  p.result_bytes = AlignUp(4 * d.m * std::max(fwd_tile, bwd_tile));
  for (int64_t t : {fwd_tile, d.n % kNf4LinearTile}) {
    if (t == 0) continue;
    ZT_ASSIGN_OR_RETURN(
        const int64_t bytes,
        cpu::GemmWorkspaceBytes(
            ctx, {.m = d.m, .n = t, .k = d.k, .trans_b = Transpose::kYes, .a_dtype = dtypes.inp}));
    p.gemm_bytes = std::max(p.gemm_bytes, bytes);
  }
  for (int64_t t : {bwd_tile, d.k % kNf4LinearTile}) {
    if (t == 0) continue;
    ZT_ASSIGN_OR_RETURN(
        const int64_t bytes,
        cpu::GemmWorkspaceBytes(ctx, {.m = d.m, .n = t, .k = d.n, .a_dtype = dtypes.dout}));
    p.gemm_bytes = std::max(p.gemm_bytes, bytes);
  }
  return p;
}

// The workspace split into its pieces, after checking it holds the plan.
struct Scratch {
  float* tile = nullptr;
  float* result = nullptr;
  DeviceContext gemm_ctx;  // ctx with the GEMM's piece as its workspace
};

absl::StatusOr<Scratch> SplitWorkspace(const char* op, const DeviceContext& ctx,
                                       const Nf4LinearDims& d, const LinearDTypes& dtypes) {
  ZT_ASSIGN_OR_RETURN(const WorkspacePlan p, PlanWorkspace(ctx, d, dtypes));
  const int64_t have = ctx.workspace.data != nullptr ? ctx.workspace.bytes : 0;
  if (have < p.total()) {
    return absl::FailedPreconditionError(absl::StrCat(op, ": the workspace holds ", have,
                                                      " bytes, this call needs ", p.total(),
                                                      " (Nf4LinearWorkspaceBytes)"));
  }
  auto* base = static_cast<uint8_t*>(ctx.workspace.data);
  Scratch s{.tile = reinterpret_cast<float*>(base),
            .result = reinterpret_cast<float*>(base + p.tile_bytes),
            .gemm_ctx = ctx};
  s.gemm_ctx.workspace = {.data = base + p.tile_bytes + p.result_bytes,
                          .bytes = have - p.tile_bytes - p.result_bytes};
  return s;
}

}  // namespace

absl::StatusOr<int64_t> Nf4LinearWorkspaceBytes(const DeviceContext& ctx, const Nf4LinearDims& dims,
                                                const LinearDTypes& dtypes) {
  ZT_ASSIGN_OR_RETURN(const WorkspacePlan p, PlanWorkspace(ctx, dims, dtypes));
  return p.total();
}

absl::Status Nf4LinearForward(const DeviceContext& ctx, const Nf4LinearDims& d,
                              const Nf4LinearForwardArgs& args) {
  const LinearDTypes dtypes{.inp = args.inp.dtype(), .out = args.out.dtype()};
  ZT_ASSIGN_OR_RETURN(const Scratch s, SplitWorkspace("Nf4LinearForward", ctx, d, dtypes));
  const DType out_t = args.out.dtype();
  for (int64_t n0 = 0; n0 < d.n; n0 += kNf4LinearTile) {
    const int64_t nt = std::min(kNf4LinearTile, d.n - n0);
    // (nt, K) = rows [n0, n0 + nt) of W.
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
    for (int64_t r = 0; r < nt; ++r) {
      Nf4DequantizeTile(args.weight, d.k, n0 + r, n0 + r + 1, 0, d.k, s.tile + r * d.k, d.k);
    }
    // result (M, nt) = inp (M, K) · tileᵀ
    ZT_RETURN_IF_ERROR(Gemm(s.gemm_ctx, {.trans_b = Transpose::kYes,
                                         .m = d.m,
                                         .n = nt,
                                         .k = d.k,
                                         .a = {args.inp.raw(), args.inp.dtype(), d.k},
                                         .b = {s.tile, DType::kF32, d.k},
                                         .c = {s.result, DType::kF32, nt}}));
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
    for (int64_t m = 0; m < d.m; ++m) {
      const float* row = s.result + m * nt;
      for (int64_t j = 0; j < nt; ++j) {
        float bias = 0.0f;
        if (!args.bias.empty()) {
          // The bias as its value in out's dtype (exact for f32).
          bias = Load(args.bias.raw(), args.bias.dtype(), n0 + j);
          if (out_t == DType::kBF16) bias = FromBf16(ToBf16(bias));
          if (out_t == DType::kF16) bias = FromHalf(ToHalf(bias));
        }
        Store(args.out.raw(), out_t, m * d.n + n0 + j, row[j] + bias);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Nf4LinearBackward(const DeviceContext& ctx, const Nf4LinearDims& d,
                               const Nf4LinearBackwardArgs& args) {
  const LinearDTypes dtypes{.dout = args.dout.dtype(), .dinp = args.dinp.dtype()};
  ZT_ASSIGN_OR_RETURN(const Scratch s, SplitWorkspace("Nf4LinearBackward", ctx, d, dtypes));
  const DType dinp_t = args.dinp.dtype();
  const bool add = args.dinp_mode == Accumulate::kAdd;
  for (int64_t k0 = 0; k0 < d.k; k0 += kNf4LinearTile) {
    const int64_t kt = std::min(kNf4LinearTile, d.k - k0);
    // (N, kt) = columns [k0, k0 + kt) of W.
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
    for (int64_t r = 0; r < d.n; ++r) {
      Nf4DequantizeTile(args.weight, d.k, r, r + 1, k0, k0 + kt, s.tile + r * kt, kt);
    }
    // result (M, kt) = dout (M, N) · tile (N, kt)
    ZT_RETURN_IF_ERROR(Gemm(s.gemm_ctx, {.m = d.m,
                                         .n = kt,
                                         .k = d.n,
                                         .a = {args.dout.raw(), args.dout.dtype(), d.n},
                                         .b = {s.tile, DType::kF32, kt},
                                         .c = {s.result, DType::kF32, kt}}));
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
    for (int64_t m = 0; m < d.m; ++m) {
      const float* row = s.result + m * kt;
      for (int64_t j = 0; j < kt; ++j) {
        const int64_t at = m * d.k + k0 + j;
        Store(args.dinp.raw(), dinp_t, at,
              add ? Load(args.dinp.raw(), dinp_t, at) + row[j] : row[j]);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace zt::cpu
