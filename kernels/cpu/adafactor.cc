// CPU Adafactor. Every reduction (Σ param², the row and column means of g², Σ U²) is summed in
// double: within a chunk, a row or a column tile by one thread, then across chunks serially in
// a fixed order, with chunk boundaries that depend on the sizes only — so any thread count
// gives the same bits. The update U is computed twice (once for its RMS, once to apply it),
// which keeps the op free of scratch buffers.
//
// Matrix passes over g: row means, column means, Σ U², apply. Vector passes: Σ U² (updating
// V on the way), apply. The gradient's dtype and the parameter copy's rounding are template
// arguments (kernels/cpu/param_copy.h): a 16-bit gradient is loaded to f32 in every pass and
// the copy is written in the apply pass, with no per-element switch.
//
// Sharded, the same passes run over the shard's range only, and each whole-tensor reduction
// stops at a partial sum (double, in the same fixed orders) written as f32 to reduce_scratch,
// summed across the group, then used as the unsharded path uses its own sum.
#include "kernels/cpu/adafactor.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/load_store.h"
#include "kernels/cpu/param_copy.h"
#include "kernels/status_macros.h"

namespace zt::cpu {
namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kMinParallel = 1 << 15;
// Fixed-order sums split [0, n) into at most kMaxChunks chunks of at least kMinChunk elements.
constexpr int64_t kMaxChunks = 256;
constexpr int64_t kMinChunk = 4096;
// Columns whose sums one thread accumulates while it walks down the rows: 2 KiB of doubles,
// and 1 KiB of each row of g read contiguously.
constexpr int64_t kColTile = 256;

// Σ chunk_sum(begin, end) over fixed chunks of [0, n), combined in chunk order.
template <typename ChunkSum>
double FixedOrderSum(const DeviceContext& ctx, int64_t n, const ChunkSum& chunk_sum) {
  const int64_t chunk = std::max(kMinChunk, (n + kMaxChunks - 1) / kMaxChunks);
  const int64_t num_chunks = (n + chunk - 1) / chunk;
  std::array<double, kMaxChunks> partial{};
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
  for (int64_t c = 0; c < num_chunks; ++c) {
    partial[c] = chunk_sum(c * chunk, std::min(n, (c + 1) * chunk));
  }
  double sum = 0;
  for (int64_t c = 0; c < num_chunks; ++c) sum += partial[c];
  return sum;
}

// Σ param² of the master parameters [begin, end), in double.
template <CopyMode kC>
double SumSquares(const MasterParams<kC>& master, int64_t begin, int64_t end) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = begin; i < end; ++i) {
    const double p = master.Load(i);
    s += p * p;
  }
  return s;
}

// Σ param² of the first n master parameters, in the fixed order.
template <CopyMode kC>
double MasterSumSquares(const DeviceContext& ctx, const MasterParams<kC>& master, int64_t n) {
  return FixedOrderSum(ctx, n,
                       [&](int64_t begin, int64_t end) { return SumSquares(master, begin, end); });
}

// Everything the apply pass needs besides the buffers.
struct Apply {
  float scale;     // α / max(1, RMS(U) / clip_threshold)
  float beta1;     // used only with a first moment
  float wd_alpha;  // weight_decay · α
};

// m = β1·m + (1 − β1)·scale·U (when m is present); returns p − weight_decay·α·p − step.
inline float ApplyOne(const Apply& a, float u, float* m, float p) {
  float step = a.scale * u;
  if (m != nullptr) {
    *m = a.beta1 * *m + (1.0f - a.beta1) * step;
    step = *m;
  }
  return (p - a.wd_alpha * p) - step;
}

// The matrix case: row and column statistics, then U_ij = g_ij · √(mean(R) / R_i) / √C_j.
// Returns after applying; `alpha` is the step size α. kG is grad's dtype, kC the copy's mode.
template <DType kG, CopyMode kC>
void FactoredUpdate(const DeviceContext& ctx, const AdafactorArgs& args, float beta2t,
                    double alpha) {
  const int64_t rows = args.param.dim(0), cols = args.param.dim(1), n = rows * cols;
  const MasterParams<kC> master = MasterParamsOf<kC>(args.param, args.param_copy, args.seed);
  const void* grad = args.grad.raw();
  float* row_state = args.row_state.data<float>();
  float* col_state = args.col_state.data<float>();
  float* m = args.m.empty() ? nullptr : args.m.data<float>();
  const float gs = args.grad_scale;
  const double eps1 = args.eps1, b2t = beta2t;

#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
  for (int64_t i = 0; i < rows; ++i) {
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < cols; ++j) {
      const float gj = LoadAs<kG>(grad, i * cols + j) * gs;
      s += static_cast<double>(gj) * gj;
    }
    const double mean = s / static_cast<double>(cols) + eps1;
    row_state[i] = static_cast<float>(b2t * row_state[i] + (1.0 - b2t) * mean);
  }

  const int64_t num_tiles = (cols + kColTile - 1) / kColTile;
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
  for (int64_t tile = 0; tile < num_tiles; ++tile) {
    const int64_t j0 = tile * kColTile, width = std::min(kColTile, cols - j0);
    std::array<double, kColTile> acc{};
    for (int64_t i = 0; i < rows; ++i) {
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) {
        const float gj = LoadAs<kG>(grad, i * cols + j0 + j) * gs;
        acc[j] += static_cast<double>(gj) * gj;
      }
    }
    for (int64_t j = 0; j < width; ++j) {
      const double mean = acc[j] / static_cast<double>(rows) + eps1;
      col_state[j0 + j] = static_cast<float>(b2t * col_state[j0 + j] + (1.0 - b2t) * mean);
    }
  }

  double row_sum = 0;
  for (int64_t i = 0; i < rows; ++i) row_sum += row_state[i];
  const double row_mean = row_sum / static_cast<double>(rows);
  const auto row_factor = [&](int64_t i) {
    return static_cast<float>(std::sqrt(row_mean / static_cast<double>(row_state[i])));
  };

  // Σ U² over flat chunks, each walking the row segments it covers.
  const double u_sq = FixedOrderSum(ctx, n, [&](int64_t begin, int64_t end) {
    double s = 0;
    for (int64_t i = begin / cols; i * cols < end; ++i) {
      const int64_t j0 = std::max<int64_t>(begin - i * cols, 0);
      const int64_t j1 = std::min<int64_t>(end - i * cols, cols);
      const float rf = row_factor(i);
#pragma omp simd reduction(+ : s)
      for (int64_t j = j0; j < j1; ++j) {
        const float u = (LoadAs<kG>(grad, i * cols + j) * gs) * rf / std::sqrt(col_state[j]);
        s += static_cast<double>(u) * u;
      }
    }
    return s;
  });
  const double clip = std::max(1.0, std::sqrt(u_sq / static_cast<double>(n)) / args.clip_threshold);
  const Apply a{.scale = static_cast<float>(alpha / clip),
                .beta1 = args.beta1,
                .wd_alpha = static_cast<float>(args.weight_decay * alpha)};

#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
  for (int64_t i = 0; i < rows; ++i) {
    const MasterParams<kC> p = master.At(i * cols);
    float* mi = m == nullptr ? nullptr : m + i * cols;
    const float rf = row_factor(i);
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) {
      const float u = (LoadAs<kG>(grad, i * cols + j) * gs) * rf / std::sqrt(col_state[j]);
      p.Store(j, ApplyOne(a, u, mi == nullptr ? nullptr : mi + j, p.Load(j)), i * cols + j);
    }
  }
}

// The vector case: a full second moment V, U = g / √V.
template <DType kG, CopyMode kC>
void FullUpdate(const DeviceContext& ctx, const AdafactorArgs& args, float beta2t, double alpha) {
  const int64_t n = args.param.numel();
  const MasterParams<kC> master = MasterParamsOf<kC>(args.param, args.param_copy, args.seed);
  const void* grad = args.grad.raw();
  float* v = args.full_state.data<float>();
  float* m = args.m.empty() ? nullptr : args.m.data<float>();
  const float gs = args.grad_scale, eps1 = args.eps1, b2t = beta2t;

  const double u_sq = FixedOrderSum(ctx, n, [&](int64_t begin, int64_t end) {
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = begin; i < end; ++i) {
      const float g = LoadAs<kG>(grad, i) * gs;
      v[i] = b2t * v[i] + (1.0f - b2t) * (g * g + eps1);
      const float u = g / std::sqrt(v[i]);
      s += static_cast<double>(u) * u;
    }
    return s;
  });
  const double clip = std::max(1.0, std::sqrt(u_sq / static_cast<double>(n)) / args.clip_threshold);
  const Apply a{.scale = static_cast<float>(alpha / clip),
                .beta1 = args.beta1,
                .wd_alpha = static_cast<float>(args.weight_decay * alpha)};

#pragma omp parallel for simd num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
  for (int64_t i = 0; i < n; ++i) {
    const float u = (LoadAs<kG>(grad, i) * gs) / std::sqrt(v[i]);
    master.Store(i, ApplyOne(a, u, m == nullptr ? nullptr : m + i, master.Load(i)));
  }
}

// ρ, the step size before parameter scaling.
double RelativeOrAbsoluteStep(const AdafactorArgs& args) {
  const double t = static_cast<double>(args.step);
  return args.relative_step ? std::min(args.warmup_init ? 1e-6 * t : 1e-2, 1.0 / std::sqrt(t))
                            : static_cast<double>(args.lr);
}

float Beta2At(const AdafactorArgs& args) {
  const double t = static_cast<double>(args.step);
  return static_cast<float>(1.0 - std::pow(t, static_cast<double>(args.decay_rate)));
}

// ---- Sharded updates: elements [begin, end) of the whole tensor's flattening. ----

// A shard stores its element at local index k with the stochastic counter of its index in the
// whole tensor, so that sharded and unsharded runs draw the same rounding.

// Sums data[0, n) across the shard group, naming the phase in an error.
absl::Status SumAcross(const AdafactorArgs& args, float* data, int64_t n, const char* phase) {
  absl::Status st = args.shard->sum_across_shards(data, n);
  if (st.ok()) return st;
  return absl::Status(st.code(), absl::StrCat("AdafactorUpdate: sum_across_shards of the ", phase,
                                              " failed: ", st.message()));
}

// The update's scaling for a sharded tensor, from ρ and the group's sums over the whole
// tensor's `whole` elements: α from Σ param², the clip from Σ U².
Apply ShardedApply(const AdafactorArgs& args, double rho, float param_sq, float u_sq,
                   int64_t whole) {
  const double alpha =
      args.scale_parameter
          ? std::max(static_cast<double>(args.eps2),
                     std::sqrt(static_cast<double>(param_sq) / static_cast<double>(whole))) *
                rho
          : rho;
  const double clip = std::max(
      1.0, std::sqrt(static_cast<double>(u_sq) / static_cast<double>(whole)) / args.clip_threshold);
  return {.scale = static_cast<float>(alpha / clip),
          .beta1 = args.beta1,
          .wd_alpha = static_cast<float>(args.weight_decay * alpha)};
}

// Σ param² of the shard's elements (0 unless scale_parameter needs it).
template <CopyMode kC>
double ShardParamSquares(const DeviceContext& ctx, const AdafactorArgs& args, int64_t n) {
  if (!args.scale_parameter || n == 0) return 0.0;
  return MasterSumSquares(ctx, MasterParamsOf<kC>(args.param, args.param_copy, args.seed), n);
}

// Whether row i of a tensor-parallel part counts in the group's sums: not when another rank's
// identical copy of it counts instead (Shard::uncounted_rows; a handful of ranges at most).
bool RowCounted(const AdafactorArgs::Shard& sh, int64_t i) {
  for (const auto& [first, last] : sh.uncounted_rows) {
    if (i < first) return true;
    if (i < last) return false;
  }
  return true;
}

// Σ param² of the shard's elements in counted rows (0 unless scale_parameter needs it): every
// element, in the fixed order, when no row is left out; else row segment by row segment.
template <CopyMode kC>
double CountedParamSquares(const DeviceContext& ctx, const AdafactorArgs& args, int64_t n) {
  const AdafactorArgs::Shard& sh = *args.shard;
  if (sh.uncounted_rows.empty()) return ShardParamSquares<kC>(ctx, args, n);
  if (!args.scale_parameter || n == 0) return 0.0;
  const MasterParams<kC> master = MasterParamsOf<kC>(args.param, args.param_copy, args.seed);
  const int64_t cols = sh.cols, begin = sh.begin, end = sh.end;
  double s = 0;
  for (int64_t i = begin / cols; i * cols < end; ++i) {
    if (!RowCounted(sh, i)) continue;
    const int64_t j0 = std::max<int64_t>(begin - i * cols, 0);
    const int64_t j1 = std::min<int64_t>(end - i * cols, cols);
    s += SumSquares(master, i * cols - begin + j0, i * cols - begin + j1);
  }
  return s;
}

// The matrix case on a shard. Phase 1 sums [Σ_j g² per row | Σ_i g² per column | Σ param²]
// across the group; every rank then updates the whole R and C identically. Phase 2 sums ΣU².
template <DType kG, CopyMode kC>
absl::Status ShardedFactoredUpdate(const DeviceContext& ctx, const AdafactorArgs& args,
                                   float beta2t, double rho) {
  const AdafactorArgs::Shard& sh = *args.shard;
  const int64_t rows = sh.rows, cols = sh.cols, begin = sh.begin, end = sh.end;
  const int64_t n = end - begin;
  // The logical matrix's rows and element count (tensor parallelism: this is one part of it).
  // A row's mean of g² is over the logical columns, a column's over the logical rows.
  const int64_t logical_rows = sh.logical_rows > 0 ? sh.logical_rows : rows;
  const int64_t logical_cols = sh.logical_cols > 0 ? sh.logical_cols : cols;
  const int64_t whole = logical_rows * logical_cols;
  float* row_sum = args.reduce_scratch.data<float>();  // (rows)
  float* col_sum = row_sum + rows;                     // (cols)
  float* param_sq = col_sum + cols;                    // (1)
  float* u_sq = param_sq + 1;                          // (1)
  std::fill(row_sum, u_sq + 1, 0.0f);
  const void* grad = args.grad.raw();
  const float gs = args.grad_scale;
  // Below, (i, j) is the whole tensor's element i · cols + j: the shard's element
  // i · cols + j − begin, so grad and the shard's buffers are indexed from a row's `base`.

  if (n > 0) {
    const int64_t first_row = begin / cols, row_end = (end + cols - 1) / cols;
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
    for (int64_t i = first_row; i < row_end; ++i) {
      const int64_t j0 = std::max<int64_t>(begin - i * cols, 0);
      const int64_t j1 = std::min<int64_t>(end - i * cols, cols);
      const int64_t base = i * cols - begin;
      double s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t j = j0; j < j1; ++j) {
        const float gj = LoadAs<kG>(grad, base + j) * gs;
        s += static_cast<double>(gj) * gj;
      }
      row_sum[i] = static_cast<float>(s);
    }

    const int64_t num_tiles = (cols + kColTile - 1) / kColTile;
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
    for (int64_t tile = 0; tile < num_tiles; ++tile) {
      const int64_t t0 = tile * kColTile, t1 = std::min(cols, t0 + kColTile);
      std::array<double, kColTile> acc{};
      for (int64_t i = first_row; i < row_end; ++i) {
        if (!RowCounted(sh, i)) continue;
        const int64_t j0 = std::max({begin - i * cols, t0, int64_t{0}});
        const int64_t j1 = std::min({end - i * cols, t1, cols});
        const int64_t base = i * cols - begin;
#pragma omp simd
        for (int64_t j = j0; j < j1; ++j) {
          const float gj = LoadAs<kG>(grad, base + j) * gs;
          acc[j - t0] += static_cast<double>(gj) * gj;
        }
      }
      for (int64_t j = t0; j < t1; ++j) col_sum[j] = static_cast<float>(acc[j - t0]);
    }
  }
  *param_sq = static_cast<float>(CountedParamSquares<kC>(ctx, args, n));
  ZT_RETURN_IF_ERROR(SumAcross(args, row_sum, rows + cols + 1, "row, column and parameter sums"));

  // An empty shard may hold no statistics; one that holds them keeps them in step. A tensor
  // of no elements has no means to take (the unsharded path leaves its states alone too).
  float* row_state = args.row_state.empty() || whole == 0 ? nullptr : args.row_state.data<float>();
  float* col_state = args.col_state.empty() || whole == 0 ? nullptr : args.col_state.data<float>();
  const double eps1 = args.eps1, b2t = beta2t;
  if (row_state != nullptr) {
    for (int64_t i = 0; i < rows; ++i) {
      const double mean =
          static_cast<double>(row_sum[i]) / static_cast<double>(logical_cols) + eps1;
      row_state[i] = static_cast<float>(b2t * row_state[i] + (1.0 - b2t) * mean);
    }
  }
  if (col_state != nullptr) {
    for (int64_t j = 0; j < cols; ++j) {
      const double mean =
          static_cast<double>(col_sum[j]) / static_cast<double>(logical_rows) + eps1;
      col_state[j] = static_cast<float>(b2t * col_state[j] + (1.0 - b2t) * mean);
    }
  }
  if (n == 0) return SumAcross(args, u_sq, 1, "sum of squared updates");

  double row_total = 0;
  for (int64_t i = 0; i < rows; ++i) {
    if (RowCounted(sh, i)) row_total += row_state[i];
  }
  if (logical_rows != rows) {
    // The other parts' rows: their Σ R_i added over the tensor-parallel group.
    float total = static_cast<float>(row_total);
    absl::Status st = sh.sum_row_states(&total, 1);
    if (!st.ok()) {
      return absl::Status(st.code(),
                          absl::StrCat("AdafactorUpdate: sum_row_states failed: ", st.message()));
    }
    row_total = total;
  }
  const double row_mean = row_total / static_cast<double>(logical_rows);
  const auto row_factor = [&](int64_t i) {
    return static_cast<float>(std::sqrt(row_mean / static_cast<double>(row_state[i])));
  };

  // Σ U² over fixed chunks of the shard, each walking the row segments it covers.
  *u_sq = static_cast<float>(FixedOrderSum(ctx, n, [&](int64_t chunk_begin, int64_t chunk_end) {
    const int64_t b = begin + chunk_begin, e = begin + chunk_end;  // whole-tensor indices
    double s = 0;
    for (int64_t i = b / cols; i * cols < e; ++i) {
      if (!RowCounted(sh, i)) continue;
      const int64_t j0 = std::max<int64_t>(b - i * cols, 0);
      const int64_t j1 = std::min<int64_t>(e - i * cols, cols);
      const int64_t base = i * cols - begin;
      const float rf = row_factor(i);
#pragma omp simd reduction(+ : s)
      for (int64_t j = j0; j < j1; ++j) {
        const float u = (LoadAs<kG>(grad, base + j) * gs) * rf / std::sqrt(col_state[j]);
        s += static_cast<double>(u) * u;
      }
    }
    return s;
  }));
  ZT_RETURN_IF_ERROR(SumAcross(args, u_sq, 1, "sum of squared updates"));

  const Apply a = ShardedApply(args, rho, *param_sq, *u_sq, whole);
  const MasterParams<kC> master = MasterParamsOf<kC>(args.param, args.param_copy, args.seed);
  float* m = args.m.empty() ? nullptr : args.m.data<float>();
  const int64_t first_row = begin / cols, row_end = (end + cols - 1) / cols;
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
  for (int64_t i = first_row; i < row_end; ++i) {
    const int64_t j0 = std::max<int64_t>(begin - i * cols, 0);
    const int64_t j1 = std::min<int64_t>(end - i * cols, cols);
    const int64_t base = i * cols - begin;
    const MasterParams<kC> p = master.At(base);
    float* mi = m == nullptr ? nullptr : m + base;
    const float rf = row_factor(i);
#pragma omp simd
    for (int64_t j = j0; j < j1; ++j) {
      const float u = (LoadAs<kG>(grad, base + j) * gs) * rf / std::sqrt(col_state[j]);
      p.Store(j, ApplyOne(a, u, mi == nullptr ? nullptr : mi + j, p.Load(j)), i * cols + j);
    }
  }
  return absl::OkStatus();
}

// The vector case on a shard: V is per element, so only Σ param² and Σ U² need the group.
template <DType kG, CopyMode kC>
absl::Status ShardedFullUpdate(const DeviceContext& ctx, const AdafactorArgs& args, float beta2t,
                               double rho) {
  const AdafactorArgs::Shard& sh = *args.shard;
  const int64_t begin = sh.begin, n = sh.end - sh.begin;
  const int64_t whole = sh.logical_cols > 0 ? sh.logical_cols : sh.cols;
  float* param_sq = args.reduce_scratch.data<float>();
  float* u_sq = param_sq + 1;
  *param_sq = static_cast<float>(ShardParamSquares<kC>(ctx, args, n));
  ZT_RETURN_IF_ERROR(SumAcross(args, param_sq, 1, "parameter sum of squares"));
  *u_sq = 0.0f;
  if (n == 0) return SumAcross(args, u_sq, 1, "sum of squared updates");

  const MasterParams<kC> master = MasterParamsOf<kC>(args.param, args.param_copy, args.seed);
  const void* grad = args.grad.raw();
  float* v = args.full_state.data<float>();
  float* m = args.m.empty() ? nullptr : args.m.data<float>();
  const float gs = args.grad_scale, eps1 = args.eps1, b2t = beta2t;
  *u_sq = static_cast<float>(FixedOrderSum(ctx, n, [&](int64_t b, int64_t e) {
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = b; i < e; ++i) {
      const float g = LoadAs<kG>(grad, i) * gs;
      v[i] = b2t * v[i] + (1.0f - b2t) * (g * g + eps1);
      const float u = g / std::sqrt(v[i]);
      s += static_cast<double>(u) * u;
    }
    return s;
  }));
  ZT_RETURN_IF_ERROR(SumAcross(args, u_sq, 1, "sum of squared updates"));

  const Apply a = ShardedApply(args, rho, *param_sq, *u_sq, whole);
#pragma omp parallel for simd num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
  for (int64_t i = 0; i < n; ++i) {
    const float u = (LoadAs<kG>(grad, i) * gs) / std::sqrt(v[i]);
    master.Store(i, ApplyOne(a, u, m == nullptr ? nullptr : m + i, master.Load(i)), begin + i);
  }
  return absl::OkStatus();
}

absl::Status ShardedUpdate(const DeviceContext& ctx, const AdafactorArgs& args) {
  const double rho = RelativeOrAbsoluteStep(args);
  const float beta2t = Beta2At(args);
  const bool factored = args.shard->rows > 0;
  absl::Status st;
  // An empty shard's tensors may be absent: its dtypes choose nothing it runs.
  const DType grad_dtype = args.grad.empty() ? DType::kF32 : args.grad.dtype();
  DispatchGradCopy(grad_dtype, CopyModeFor(args.param, args.param_copy, args.stochastic_rounding),
                   [&](auto grad_type, auto copy_mode) {
                     constexpr DType kG = decltype(grad_type)::value;
                     constexpr CopyMode kC = decltype(copy_mode)::value;
                     st = factored ? ShardedFactoredUpdate<kG, kC>(ctx, args, beta2t, rho)
                                   : ShardedFullUpdate<kG, kC>(ctx, args, beta2t, rho);
                   });
  return st;
}

}  // namespace

absl::Status AdafactorUpdate(const DeviceContext& ctx, const AdafactorArgs& args) {
  if (args.shard.has_value()) return ShardedUpdate(ctx, args);
  const int64_t n = args.param.numel();
  const double rho = RelativeOrAbsoluteStep(args);
  const float beta2t = Beta2At(args);
  const bool factored = args.param.ndim() == 2;
  DispatchGradCopy(args.grad.dtype(),
                   CopyModeFor(args.param, args.param_copy, args.stochastic_rounding),
                   [&](auto grad_dtype, auto copy_mode) {
                     constexpr DType kG = decltype(grad_dtype)::value;
                     constexpr CopyMode kC = decltype(copy_mode)::value;
                     double alpha = rho;
                     if (args.scale_parameter) {
                       const double sum_sq = MasterSumSquares(
                           ctx, MasterParamsOf<kC>(args.param, args.param_copy, args.seed), n);
                       alpha = std::max(static_cast<double>(args.eps2),
                                        std::sqrt(sum_sq / static_cast<double>(n))) *
                               rho;
                     }
                     if (factored) {
                       FactoredUpdate<kG, kC>(ctx, args, beta2t, alpha);
                     } else {
                       FullUpdate<kG, kC>(ctx, args, beta2t, alpha);
                     }
                   });
  return absl::OkStatus();
}

}  // namespace zt::cpu
