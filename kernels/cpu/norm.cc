// LayerNorm and RMSNorm on the CPU.
// Legend: N rows (B·T), C channels.
// Accumulation rule: dweight/dbias +=; dinp = or += by dinp_mode.
// Row statistics and dinp are row-local and parallelize over rows. dweight and dbias sum over
// rows; they parallelize over blocks of channels instead, each block summing its rows in
// order, so they are bitwise the same for any thread count with no scratch buffer.
// Data tensors may be f32, bf16 or f16 (mean/rstd stay f32): 16-bit rows are converted into
// per-thread f32 rows, computed exactly as the f32 path and rounded once when stored.
#include "kernels/cpu/norm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/load_store.h"

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

// grad[c0, c0 + n) += sum, in grad's dtype.
inline void AddToParamGrad(const float* sum, int64_t n, const Tensor& grad, int64_t c0) {
  if (grad.dtype() == DType::kF32) {
    float* g = grad.data<float>() + c0;
    for (int64_t i = 0; i < n; ++i) g[i] += sum[i];
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    Store(grad.raw(), grad.dtype(), c0 + i, Load(grad.raw(), grad.dtype(), c0 + i) + sum[i]);
  }
}

// dweight (+ dbias) += Σ_rows dout ∘ xhat (and Σ_rows dout), by channel blocks. Called from
// inside a parallel region. 16-bit inp/dout blocks are converted into stack buffers; the
// sums stay in f32 and are added to dweight/dbias in their own dtype, rounded once.
void ParamGrads(int64_t rows, int64_t c, const Tensor& inp, const Tensor& dout, const float* mean,
                const float* rstd, const Tensor& dweight, const Tensor* dbias) {
  const int64_t blocks = (c + kChannelBlock - 1) / kChannelBlock;
  const bool f32_rows = inp.dtype() == DType::kF32 && dout.dtype() == DType::kF32;
#pragma omp for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kChannelBlock;
    const int64_t n = std::min(kChannelBlock, c - c0);
    float dw[kChannelBlock] = {};
    float db[kChannelBlock] = {};
    float xb[kChannelBlock], dyb[kChannelBlock];
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = xb;
      const float* dy = dyb;
      if (f32_rows) {
        x = inp.data<float>() + r * c + c0;
        dy = dout.data<float>() + r * c + c0;
      } else {
        LoadRow(inp.raw(), inp.dtype(), r * c + c0, n, xb);
        LoadRow(dout.raw(), dout.dtype(), r * c + c0, n, dyb);
      }
      AccumulateParamGrads(x, dy, mean ? mean[r] : 0.0f, rstd[r], n, dw, dbias ? db : nullptr);
    }
    AddToParamGrad(dw, n, dweight, c0);
    if (dbias != nullptr) AddToParamGrad(db, n, *dbias, c0);
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
  const Tensor& inp = args.inp;               // (N, C)
  const Tensor& out = args.out;               // (N, C)
  float* mean_out = args.mean.data<float>();  // (N)
  float* rstd_out = args.rstd.data<float>();  // (N)
  const float inv_c = 1.0f / static_cast<float>(c);

#pragma omp parallel num_threads(ctx.num_threads)
  {
    const float* w = ReadRow(args.weight.raw(), args.weight.dtype(), 0, c, 0);  // (C)
    const float* bias = ReadRow(args.bias.raw(), args.bias.dtype(), 0, c, 1);   // (C)
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = ReadRow(inp.raw(), inp.dtype(), r * c, c, 2);
      float sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t i = 0; i < c; ++i) sum += x[i];
      const float mean = sum * inv_c;
      // Two passes: Σ(x − mean)² does not cancel the way Σx² − C·mean² does.
      float var = 0;
#pragma omp simd reduction(+ : var)
      for (int64_t i = 0; i < c; ++i) var += (x[i] - mean) * (x[i] - mean);
      const float rstd = 1.0f / std::sqrt(var * inv_c + args.eps);
      float* y = WriteRow(out.raw(), out.dtype(), r * c, c, 3, /*load=*/false);
#pragma omp simd
      for (int64_t i = 0; i < c; ++i) y[i] = (x[i] - mean) * rstd * w[i] + bias[i];
      FinishRow(y, c, out.raw(), out.dtype(), r * c);
      mean_out[r] = mean;
      rstd_out[r] = rstd;
    }
  }
}

// dinp rows: inp, dout and weight converted to f32 as needed, dinp computed in f32 (loaded
// first when it accumulates) and stored once. Called from inside a parallel region.
void InputGrads(int64_t rows, int64_t c, const Tensor& inp, const Tensor& dout,
                const Tensor& weight, const float* mean, const float* rstd, bool subtract_mean,
                Accumulate mode, const Tensor& dinp) {
  const float* w = ReadRow(weight.raw(), weight.dtype(), 0, c, 0);
#pragma omp for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = ReadRow(inp.raw(), inp.dtype(), r * c, c, 1);
    const float* dy = ReadRow(dout.raw(), dout.dtype(), r * c, c, 2);
    // Loaded after dout: with dinp aliasing dout the row is read before it is overwritten.
    float* dx = WriteRow(dinp.raw(), dinp.dtype(), r * c, c, 3, mode == Accumulate::kAdd);
    RowInputGrad(c, x, dy, w, mean ? mean[r] : 0.0f, rstd[r], subtract_mean, mode, dx);
    FinishRow(dx, c, dinp.raw(), dinp.dtype(), r * c);
  }
}

void LayerNormBackward(const DeviceContext& ctx, const LayerNormBackwardArgs& args) {
  const int64_t rows = args.inp.dim(0), c = args.inp.dim(1);
  const float* mean = args.mean.data<float>();  // (N)
  const float* rstd = args.rstd.data<float>();  // (N)

#pragma omp parallel num_threads(ctx.num_threads)
  {
    // Parameters first: the barrier after it lets dinp overwrite dout in place.
    ParamGrads(rows, c, args.inp, args.dout, mean, rstd, args.dweight, &args.dbias);
    InputGrads(rows, c, args.inp, args.dout, args.weight, mean, rstd, /*subtract_mean=*/true,
               args.dinp_mode, args.dinp);
  }
}

void RmsNormForward(const DeviceContext& ctx, const RmsNormForwardArgs& args) {
  const int64_t rows = args.inp.dim(0), c = args.inp.dim(1);
  const Tensor& inp = args.inp;               // (N, C)
  const Tensor& out = args.out;               // (N, C)
  float* rstd_out = args.rstd.data<float>();  // (N)
  const float inv_c = 1.0f / static_cast<float>(c);

#pragma omp parallel num_threads(ctx.num_threads)
  {
    const float* w = ReadRow(args.weight.raw(), args.weight.dtype(), 0, c, 0);  // (C)
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = ReadRow(inp.raw(), inp.dtype(), r * c, c, 1);
      float ss = 0;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < c; ++i) ss += x[i] * x[i];
      const float rstd = 1.0f / std::sqrt(ss * inv_c + args.eps);
      float* y = WriteRow(out.raw(), out.dtype(), r * c, c, 2, /*load=*/false);
#pragma omp simd
      for (int64_t i = 0; i < c; ++i) y[i] = x[i] * rstd * w[i];
      FinishRow(y, c, out.raw(), out.dtype(), r * c);
      rstd_out[r] = rstd;
    }
  }
}

void RmsNormBackward(const DeviceContext& ctx, const RmsNormBackwardArgs& args) {
  const int64_t rows = args.inp.dim(0), c = args.inp.dim(1);
  const float* rstd = args.rstd.data<float>();  // (N)

#pragma omp parallel num_threads(ctx.num_threads)
  {
    ParamGrads(rows, c, args.inp, args.dout, /*mean=*/nullptr, rstd, args.dweight,
               /*dbias=*/nullptr);
    InputGrads(rows, c, args.inp, args.dout, args.weight, /*mean=*/nullptr, rstd,
               /*subtract_mean=*/false, args.dinp_mode, args.dinp);
  }
}

}  // namespace zt::cpu
