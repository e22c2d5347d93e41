// CPU frozen NF4 linear layer. The forward walks W's rows (a (tile, K) tile gives out's columns
// [n0, n0 + tile)), the backward W's columns (an (N, tile) tile gives dinp's columns [k0, k0 +
// tile)), so every output element comes out of one GEMM and is rounded into its dtype once.
#include "kernels/cpu/nf4_linear.h"

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/load_store.h"
#include "kernels/cpu/nf4.h"
#include "kernels/status_macros.h"

namespace zt::cpu {

absl::Status Nf4LinearForward(const Nf4LinearScratch& s, const Nf4LinearDims& d,
                              const Nf4LinearForwardArgs& args) {
  const DeviceContext& ctx = s.gemm_ctx;
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

absl::Status Nf4LinearBackward(const Nf4LinearScratch& s, const Nf4LinearDims& d,
                               const Nf4LinearBackwardArgs& args) {
  const DeviceContext& ctx = s.gemm_ctx;
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
