// LayerNorm and RMSNorm on the CPU.
// Legend: N rows (B·T), C channels.
// Accumulation rule: dweight/dbias +=; dinp = or += by dinp_mode.
// Row statistics and dinp are row-local and parallelize over rows. dweight and dbias sum over
// rows; they parallelize over blocks of channels instead, each block summing its rows in
// order, so they are bitwise the same for any thread count with no scratch buffer.
#include "kernels/cpu/norm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace zt::cpu {
namespace {

// Channels per parameter-gradient work item: their partial sums stay in registers, and
// C = 768 still splits into 12 items.
constexpr int64_t kChannelBlock = 64;

// (x − mean)·rstd for one row's block of channels, accumulated over rows into dw (and db).
// mean is 0 for RMSNorm; db is null there.
inline void AccumulateParamGrads(const float* x, const float* dy, float mean, float rstd, int64_t n,
                                 float* dw, float* db) {
  if (db == nullptr) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dw[i] += dy[i] * ((x[i] - mean) * rstd);
    return;
  }
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    dw[i] += dy[i] * ((x[i] - mean) * rstd);
    db[i] += dy[i];
  }
}

// dweight (+ dbias) += Σ_rows dout ∘ xhat (and Σ_rows dout), by channel blocks. Called from
// inside a parallel region.
void ParamGrads(int64_t rows, int64_t c, const float* inp, const float* dout, const float* mean,
                const float* rstd, float* dweight, float* dbias) {
  const int64_t blocks = (c + kChannelBlock - 1) / kChannelBlock;
#pragma omp for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kChannelBlock;
    const int64_t n = std::min(kChannelBlock, c - c0);
    float dw[kChannelBlock] = {};
    float db[kChannelBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      AccumulateParamGrads(inp + r * c + c0, dout + r * c + c0, mean ? mean[r] : 0.0f, rstd[r], n,
                           dw, dbias ? db : nullptr);
    }
    for (int64_t i = 0; i < n; ++i) dweight[c0 + i] += dw[i];
    if (dbias != nullptr) {
      for (int64_t i = 0; i < n; ++i) dbias[c0 + i] += db[i];
    }
  }
}

// dinp = or += rstd·(dnorm − a − xhat·b) for one row, dnorm = dout ∘ weight, with a = mean
// of dnorm (0 for RMSNorm, which has no mean to differentiate) and b = mean of dnorm ∘ xhat.
inline void RowInputGrad(int64_t c, const float* x, const float* dy, const float* w, float mean,
                         float rstd, bool subtract_mean, Accumulate mode, float* dx) {
  float sum_dn = 0, sum_dn_xhat = 0;
#pragma omp simd reduction(+ : sum_dn, sum_dn_xhat)
  for (int64_t i = 0; i < c; ++i) {
    const float dn = dy[i] * w[i];
    sum_dn += dn;
    sum_dn_xhat += dn * ((x[i] - mean) * rstd);
  }
  const float a = subtract_mean ? sum_dn / static_cast<float>(c) : 0.0f;
  const float b = sum_dn_xhat / static_cast<float>(c);
  if (mode == Accumulate::kAdd) {
#pragma omp simd
    for (int64_t i = 0; i < c; ++i) {
      dx[i] += (dy[i] * w[i] - a - ((x[i] - mean) * rstd) * b) * rstd;
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < c; ++i) {
      dx[i] = (dy[i] * w[i] - a - ((x[i] - mean) * rstd) * b) * rstd;
    }
  }
}

}  // namespace

void LayerNormForward(const DeviceContext& ctx, const LayerNormForwardArgs& args) {
  const int64_t rows = args.inp.dim(0), c = args.inp.dim(1);
  const float* inp = args.inp.data<float>();    // (N, C)
  const float* w = args.weight.data<float>();   // (C)
  const float* bias = args.bias.data<float>();  // (C)
  float* out = args.out.data<float>();          // (N, C)
  float* mean_out = args.mean.data<float>();    // (N)
  float* rstd_out = args.rstd.data<float>();    // (N)
  const float inv_c = 1.0f / static_cast<float>(c);

#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = inp + r * c;
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < c; ++i) sum += x[i];
    const float mean = sum * inv_c;
    // Two passes: Σ(x − mean)² does not cancel the way Σx² − C·mean² does.
    float var = 0;
#pragma omp simd reduction(+ : var)
    for (int64_t i = 0; i < c; ++i) var += (x[i] - mean) * (x[i] - mean);
    const float rstd = 1.0f / std::sqrt(var * inv_c + args.eps);
    float* y = out + r * c;
#pragma omp simd
    for (int64_t i = 0; i < c; ++i) y[i] = (x[i] - mean) * rstd * w[i] + bias[i];
    mean_out[r] = mean;
    rstd_out[r] = rstd;
  }
}

void LayerNormBackward(const DeviceContext& ctx, const LayerNormBackwardArgs& args) {
  const int64_t rows = args.inp.dim(0), c = args.inp.dim(1);
  const float* inp = args.inp.data<float>();    // (N, C)
  const float* dout = args.dout.data<float>();  // (N, C)
  const float* w = args.weight.data<float>();   // (C)
  const float* mean = args.mean.data<float>();  // (N)
  const float* rstd = args.rstd.data<float>();  // (N)
  float* dinp = args.dinp.data<float>();        // (N, C) = or +=

#pragma omp parallel num_threads(ctx.num_threads)
  {
    // Parameters first: the barrier after it lets dinp overwrite dout in place.
    ParamGrads(rows, c, inp, dout, mean, rstd, args.dweight.data<float>(),
               args.dbias.data<float>());
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      RowInputGrad(c, inp + r * c, dout + r * c, w, mean[r], rstd[r], /*subtract_mean=*/true,
                   args.dinp_mode, dinp + r * c);
    }
  }
}

void RmsNormForward(const DeviceContext& ctx, const RmsNormForwardArgs& args) {
  const int64_t rows = args.inp.dim(0), c = args.inp.dim(1);
  const float* inp = args.inp.data<float>();   // (N, C)
  const float* w = args.weight.data<float>();  // (C)
  float* out = args.out.data<float>();         // (N, C)
  float* rstd_out = args.rstd.data<float>();   // (N)
  const float inv_c = 1.0f / static_cast<float>(c);

#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = inp + r * c;
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < c; ++i) ss += x[i] * x[i];
    const float rstd = 1.0f / std::sqrt(ss * inv_c + args.eps);
    float* y = out + r * c;
#pragma omp simd
    for (int64_t i = 0; i < c; ++i) y[i] = x[i] * rstd * w[i];
    rstd_out[r] = rstd;
  }
}

void RmsNormBackward(const DeviceContext& ctx, const RmsNormBackwardArgs& args) {
  const int64_t rows = args.inp.dim(0), c = args.inp.dim(1);
  const float* inp = args.inp.data<float>();    // (N, C)
  const float* dout = args.dout.data<float>();  // (N, C)
  const float* w = args.weight.data<float>();   // (C)
  const float* rstd = args.rstd.data<float>();  // (N)
  float* dinp = args.dinp.data<float>();        // (N, C) = or +=

#pragma omp parallel num_threads(ctx.num_threads)
  {
    ParamGrads(rows, c, inp, dout, /*mean=*/nullptr, rstd, args.dweight.data<float>(),
               /*dbias=*/nullptr);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      RowInputGrad(c, inp + r * c, dout + r * c, w, /*mean=*/0.0f, rstd[r],
                   /*subtract_mean=*/false, args.dinp_mode, dinp + r * c);
    }
  }
}

}  // namespace zt::cpu
