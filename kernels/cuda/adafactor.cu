// CUDA Adafactor for one whole tensor, the CPU's sequence of passes (kernels/cpu/adafactor.cc)
// with every scalar that depends on the data kept on the device, so nothing waits:
//   1. Σ param² (scale_parameter only): 256 blocks of fixed element sets, block sums in
//      double (kernels/cuda/norm_reduce.cuh), one double partial per block.
//   2. matrix: row means of g² (one block per row, double) and column means (one thread per
//      column walking down the rows in order, double) update R and C as the CPU does; then
//      one block sums R in double and writes each row's factor √(mean(R) / R_i) as f32.
//      vector: V is updated inside pass 3.
//   3. Σ U² as in 1, U computed with the CPU's f32 expression.
//   4. one thread adds the partials in block order and derives α, the clip and the f32
//      scale and weight-decay factors, in double as the CPU does.
//   5. apply: m and the master (with its copy) per element, as ApplyOne.
// The double sums differ from the CPU's only in their order (far below the f32 results'
// rounding); the per-element f32 arithmetic is the CPU's expression.
// Sharded (ZeRO) and tensor-parallel parts follow the CPU's ShardedFactoredUpdate: the row and
// column sums and Σ param² summed over the groups through the caller's callbacks on device
// memory, means over the logical matrix's rows and columns, a replicated KV head's rows
// (Shard::uncounted_rows) left out of the column sums, Σ param², Σ R_i and Σ U².
#include <cmath>

#include "kernels/cuda/adafactor.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/float_io.cuh"
#include "kernels/cuda/norm_reduce.cuh"
#include "kernels/cuda/optimizer_master.cuh"
#include "kernels/status_macros.h"

namespace zt::cuda {
namespace {

constexpr int kThreads = 256;

// The workspace, carved as AdafactorCudaWorkspaceBytes lays it out.
struct Scratch {
  double* param_part;  // (kAdafactorSumBlocks)
  double* u_part;      // (kAdafactorSumBlocks)
  float* scalars;      // [scale, wd_alpha]
  float* row_factor;   // (rows), matrices only
};

Scratch ScratchOf(const Workspace& w) {
  char* base = static_cast<char*>(w.data);
  Scratch s;
  s.param_part = reinterpret_cast<double*>(base);
  s.u_part = s.param_part + kAdafactorSumBlocks;
  s.scalars = reinterpret_cast<float*>(s.u_part + kAdafactorSumBlocks);
  s.row_factor = s.scalars + 4;
  return s;
}

// A part's rows that another rank counts (AdafactorArgs::Shard::uncounted_rows), by value.
struct UncountedRows {
  int count = 0;
  int64_t first[kAdafactorMaxUncountedRanges] = {};
  int64_t last[kAdafactorMaxUncountedRanges] = {};

  __device__ bool Counted(int64_t i) const {
    for (int k = 0; k < count; ++k) {
      if (i < first[k]) return true;
      if (i < last[k]) return false;
    }
    return true;
  }
};

UncountedRows UncountedRowsOf(const AdafactorArgs& args) {
  UncountedRows u;
  if (!args.shard.has_value()) return u;
  for (const auto& [first, last] : args.shard->uncounted_rows) {
    u.first[u.count] = first;
    u.last[u.count] = last;
    ++u.count;
  }
  return u;
}

// Element k has the whole part's index begin + k, in row (begin + k) / cols: left out when
// that row is uncounted (cols is unused when no row is).
template <CopyMode M>
__global__ void ParamSquaresKernel(DeviceMaster<M> master, int64_t n, int64_t begin, int64_t cols,
                                   UncountedRows uncounted, double* part) {
  __shared__ double scratch[32];
  double s = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (uncounted.count > 0 && !uncounted.Counted((begin + i) / cols)) continue;
    const double p = master.Load(i);
    s += p * p;
  }
  s = BlockSum(s, scratch);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

template <typename G>
__global__ void RowStatsKernel(const G* grad, float gs, int64_t rows, int64_t cols,
                               float* row_state, double b2t, double eps1) {
  __shared__ double scratch[32];
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    double s = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const float gj = ToFloat(grad[i * cols + j]) * gs;
      s += static_cast<double>(gj) * gj;
    }
    s = BlockSum(s, scratch);
    if (threadIdx.x == 0) {
      const double mean = s / static_cast<double>(cols) + eps1;
      row_state[i] = static_cast<float>(b2t * row_state[i] + (1.0 - b2t) * mean);
    }
  }
}

template <typename G>
__global__ void ColStatsKernel(const G* grad, float gs, int64_t rows, int64_t cols,
                               float* col_state, double b2t, double eps1) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < cols;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double s = 0;
    for (int64_t i = 0; i < rows; ++i) {
      const float gj = ToFloat(grad[i * cols + j]) * gs;
      s += static_cast<double>(gj) * gj;
    }
    const double mean = s / static_cast<double>(rows) + eps1;
    col_state[j] = static_cast<float>(b2t * col_state[j] + (1.0 - b2t) * mean);
  }
}

// One block, a part split by rows: its counted rows' Σ R_i in double, as f32 in *total (which
// the caller then sums over the tensor-parallel group).
__global__ void RowTotalKernel(const float* row_state, int64_t rows, UncountedRows uncounted,
                               float* total) {
  __shared__ double scratch[32];
  double s = 0;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
    if (uncounted.Counted(i)) s += row_state[i];
  }
  s = BlockSum(s, scratch);
  if (threadIdx.x == 0) *total = static_cast<float>(s);
}

// Every row's factor √(mean(R) / R_i), mean(R) = *total / logical_rows (the group's Σ R_i).
__global__ void RowFactorFromTotalKernel(const float* row_state, int64_t rows, const float* total,
                                         int64_t logical_rows, float* row_factor) {
  const double row_mean = static_cast<double>(*total) / static_cast<double>(logical_rows);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    row_factor[i] = static_cast<float>(sqrt(row_mean / static_cast<double>(row_state[i])));
  }
}

// One block: mean(R) in double, then every row's factor.
__global__ void RowFactorKernel(const float* row_state, int64_t rows, float* row_factor) {
  __shared__ double scratch[32];
  double s = 0;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) s += row_state[i];
  const double row_mean = BlockSum(s, scratch) / static_cast<double>(rows);
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
    row_factor[i] = static_cast<float>(sqrt(row_mean / static_cast<double>(row_state[i])));
  }
}

// Element k of the range has the whole tensor's index begin + k (begin 0 unsharded).
template <typename G>
__global__ void FactoredUSquaresKernel(const G* grad, float gs, int64_t cols, int64_t n,
                                       int64_t begin, const float* row_factor,
                                       const float* col_state, UncountedRows uncounted,
                                       double* part) {
  __shared__ double scratch[32];
  double s = 0;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t w = begin + k;
    if (uncounted.count > 0 && !uncounted.Counted(w / cols)) continue;
    const float u = (ToFloat(grad[k]) * gs) * row_factor[w / cols] / sqrtf(col_state[w % cols]);
    s += static_cast<double>(u) * u;
  }
  s = BlockSum(s, scratch);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// Updates V on the way, as the CPU's vector pass does.
template <typename G>
__global__ void FullUSquaresKernel(const G* grad, float gs, int64_t n, float* v, float b2t,
                                   float eps1, double* part) {
  __shared__ double scratch[32];
  double s = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = ToFloat(grad[i]) * gs;
    const float vi = b2t * v[i] + (1.0f - b2t) * (g * g + eps1);
    v[i] = vi;
    const float u = g / sqrtf(vi);
    s += static_cast<double>(u) * u;
  }
  s = BlockSum(s, scratch);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

struct Hyper {
  double rho;
  double eps2;
  double clip_threshold;
  double weight_decay;
  int64_t n;
  bool scale_parameter;
};

// The scalars of the update for a whole tensor of n elements.
Hyper HyperOf(const AdafactorArgs& args, double rho, int64_t n) {
  return {.rho = rho,
          .eps2 = args.eps2,
          .clip_threshold = args.clip_threshold,
          .weight_decay = args.weight_decay,
          .n = n,
          .scale_parameter = args.scale_parameter};
}

// α, the clip, and the f32 factors of the apply pass, from Σ param² and Σ U² over the whole
// tensor's h.n elements.
__device__ void WriteScalars(double param_sq, double u_sq, const Hyper& h, float* scalars) {
  const double alpha =
      h.scale_parameter ? fmax(h.eps2, sqrt(param_sq / static_cast<double>(h.n))) * h.rho : h.rho;
  const double clip = fmax(1.0, sqrt(u_sq / static_cast<double>(h.n)) / h.clip_threshold);
  scalars[0] = static_cast<float>(alpha / clip);
  scalars[1] = static_cast<float>(h.weight_decay * alpha);
}

__device__ double SumPartials(const double* part) {
  double sum = 0;
  for (int b = 0; b < kAdafactorSumBlocks; ++b) sum += part[b];
  return sum;
}

// One thread, unsharded: the partials added in block order.
__global__ void FinalizeKernel(const double* param_part, const double* u_part, Hyper h,
                               float* scalars) {
  WriteScalars(h.scale_parameter ? SumPartials(param_part) : 0.0, SumPartials(u_part), h, scalars);
}

// One thread, sharded: this rank's partials as one f32 (its share of a group sum).
__global__ void PartialsToFloatKernel(const double* part, float* out) {
  *out = static_cast<float>(SumPartials(part));
}

// One thread, sharded: from the group's f32 sums, as the CPU's ShardedApply.
__global__ void ShardedFinalizeKernel(const float* param_sq, const float* u_sq, Hyper h,
                                      float* scalars) {
  WriteScalars(*param_sq, *u_sq, h, scalars);
}

// Sharded matrix: this rank's Σ_j g² of each row it touches and Σ_i g² of every column, as
// f32, where (i, j) is the whole tensor's element i·cols + j, the shard's i·cols + j − begin.
template <typename G>
__global__ void ShardRowSumsKernel(const G* grad, float gs, int64_t cols, int64_t begin,
                                   int64_t end, int64_t first_row, int64_t row_end,
                                   float* row_sum) {
  __shared__ double scratch[32];
  for (int64_t i = first_row + blockIdx.x; i < row_end; i += gridDim.x) {
    const int64_t j0 = begin - i * cols > 0 ? begin - i * cols : 0;
    const int64_t j1 = end - i * cols < cols ? end - i * cols : cols;
    const int64_t base = i * cols - begin;
    double s = 0;
    for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
      const float gj = ToFloat(grad[base + j]) * gs;
      s += static_cast<double>(gj) * gj;
    }
    s = BlockSum(s, scratch);
    if (threadIdx.x == 0) row_sum[i] = static_cast<float>(s);
  }
}

template <typename G>
__global__ void ShardColSumsKernel(const G* grad, float gs, int64_t cols, int64_t begin,
                                   int64_t end, int64_t first_row, int64_t row_end,
                                   UncountedRows uncounted, float* col_sum) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < cols;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double acc = 0;
    for (int64_t i = first_row; i < row_end; ++i) {
      if (!uncounted.Counted(i)) continue;
      const int64_t w = i * cols + j;
      if (w < begin || w >= end) continue;
      const float gj = ToFloat(grad[w - begin]) * gs;
      acc += static_cast<double>(gj) * gj;
    }
    col_sum[j] = static_cast<float>(acc);
  }
}

// state[k] = β2t·state[k] + (1 − β2t)·(sum[k] / count + eps1), in double as the CPU does.
__global__ void StateFromSumsKernel(float* state, const float* sum, int64_t n, double count,
                                    double b2t, double eps1) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double mean = static_cast<double>(sum[k]) / count + eps1;
    state[k] = static_cast<float>(b2t * state[k] + (1.0 - b2t) * mean);
  }
}

// p − weight_decay·α·p − step, with m = β1·m + (1 − β1)·scale·U when m is present.
__device__ __forceinline__ float ApplyOne(float scale, float wd_alpha, float beta1, float u,
                                          float* m, float p) {
  float step = scale * u;
  if (m != nullptr) {
    *m = beta1 * *m + (1.0f - beta1) * step;
    step = *m;
  }
  return (p - wd_alpha * p) - step;
}

// row_factor == nullptr: a vector, U = g / √V with V in `state`; otherwise U = g·rf_i / √C_j
// with C in `state`.
template <typename G, CopyMode M>
__global__ void ApplyKernel(DeviceMaster<M> master, const G* grad, float gs, int64_t cols,
                            int64_t n, int64_t begin, const float* row_factor, const float* state,
                            float* m, float beta1, const float* scalars) {
  const float scale = scalars[0], wd_alpha = scalars[1];
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t w = begin + k;  // the whole tensor's index: the stochastic counter
    float u;
    if (row_factor != nullptr) {
      u = (ToFloat(grad[k]) * gs) * row_factor[w / cols] / sqrtf(state[w % cols]);
    } else {
      u = (ToFloat(grad[k]) * gs) / sqrtf(state[k]);
    }
    master.Store(
        k, ApplyOne(scale, wd_alpha, beta1, u, m == nullptr ? nullptr : m + k, master.Load(k)), w);
  }
}

template <typename G, CopyMode M>
void Enqueue(const DeviceContext& ctx, const AdafactorArgs& args, const Scratch& w, float beta2t,
             double rho) {
  cudaStream_t stream = StreamOf(ctx);
  const int64_t n = args.param.numel();
  const bool factored = args.param.ndim() == 2;
  const DeviceMaster<M> master = DeviceMasterOf<M>(args.param, args.param_copy, args.seed);
  const G* grad = static_cast<const G*>(args.grad.raw());
  const float gs = args.grad_scale;
  const unsigned int sum_blocks = static_cast<unsigned int>(kAdafactorSumBlocks);
  if (args.scale_parameter) {
    ParamSquaresKernel<M><<<sum_blocks, kThreads, 0, stream>>>(master, n, /*begin=*/0,
                                                               /*cols=*/1, UncountedRows{},
                                                               w.param_part);
  }
  const int64_t cols = factored ? args.param.dim(1) : n;
  const float* state = nullptr;
  const float* row_factor = nullptr;
  if (factored) {
    const int64_t rows = args.param.dim(0);
    float* row_state = args.row_state.data<float>();
    float* col_state = args.col_state.data<float>();
    const double b2t = beta2t, eps1 = args.eps1;
    RowStatsKernel<G>
        <<<GridFor(rows, 1), kThreads, 0, stream>>>(grad, gs, rows, cols, row_state, b2t, eps1);
    ColStatsKernel<G><<<GridFor(cols, kThreads), kThreads, 0, stream>>>(grad, gs, rows, cols,
                                                                        col_state, b2t, eps1);
    RowFactorKernel<<<1, 1024, 0, stream>>>(row_state, rows, w.row_factor);
    FactoredUSquaresKernel<G><<<sum_blocks, kThreads, 0, stream>>>(
        grad, gs, cols, n, /*begin=*/0, w.row_factor, col_state, UncountedRows{}, w.u_part);
    state = col_state;
    row_factor = w.row_factor;
  } else {
    float* v = args.full_state.data<float>();
    FullUSquaresKernel<G>
        <<<sum_blocks, kThreads, 0, stream>>>(grad, gs, n, v, beta2t, args.eps1, w.u_part);
    state = v;
  }
  const Hyper h = HyperOf(args, rho, n);
  FinalizeKernel<<<1, 1, 0, stream>>>(w.param_part, w.u_part, h, w.scalars);
  ApplyKernel<G, M><<<GridFor(n, kThreads), kThreads, 0, stream>>>(
      master, grad, gs, cols, n, /*begin=*/0, row_factor, state,
      args.m.empty() ? nullptr : args.m.data<float>(), args.beta1, w.scalars);
}

// Sums data[0, count) across the shard group, naming the phase in an error (SumAcross on
// the CPU). The launches enqueued so far are checked first, so a bad launch is not reported
// as the callback's.
absl::Status SumAcross(const AdafactorArgs& args, float* data, int64_t count, const char* phase) {
  ZT_RETURN_IF_ERROR(LaunchStatus("AdafactorUpdate"));
  absl::Status st = args.shard->sum_across_shards(data, count);
  if (st.ok()) return st;
  return absl::Status(st.code(), absl::StrCat("AdafactorUpdate: sum_across_shards of the ", phase,
                                              " failed: ", st.message()));
}

// The sharded update: the CPU's ShardedFactoredUpdate / ShardedFullUpdate, with reduce_scratch
// in device memory ([row sums | column sums | Σ param² | Σ U²] for a matrix, [Σ param² | Σ U²]
// for a vector) handed to the callback, which sums it on ctx's stream.
template <typename G, CopyMode M>
absl::Status EnqueueSharded(const DeviceContext& ctx, const AdafactorArgs& args, const Scratch& w,
                            float beta2t, double rho) {
  cudaStream_t stream = StreamOf(ctx);
  const AdafactorArgs::Shard& sh = *args.shard;
  const bool factored = sh.rows > 0;
  const int64_t rows = sh.rows, cols = sh.cols, begin = sh.begin, end = sh.end;
  // The logical matrix's rows and columns (a tensor-parallel part is one piece of it): a
  // row's mean of g² is over the logical columns, a column's over the logical rows.
  const int64_t logical_rows = sh.logical_rows > 0 ? sh.logical_rows : rows;
  const int64_t logical_cols = sh.logical_cols > 0 ? sh.logical_cols : cols;
  const int64_t n = end - begin, whole = factored ? logical_rows * logical_cols : logical_cols;
  const UncountedRows uncounted = UncountedRowsOf(args);
  const unsigned int sum_blocks = static_cast<unsigned int>(kAdafactorSumBlocks);
  const int64_t sums = factored ? rows + cols + 2 : 2;
  float* row_sum = args.reduce_scratch.data<float>();     // (rows)
  float* col_sum = row_sum + rows;                        // (cols)
  float* param_sq = factored ? col_sum + cols : row_sum;  // (1)
  float* u_sq = param_sq + 1;                             // (1)
  ZT_CUDA_RETURN_IF_ERROR("AdafactorUpdate",
                          cudaMemsetAsync(row_sum, 0, sums * sizeof(float), stream));
  const DeviceMaster<M> master = DeviceMasterOf<M>(args.param, args.param_copy, args.seed);
  const G* grad = n > 0 ? static_cast<const G*>(args.grad.raw()) : nullptr;
  const float gs = args.grad_scale;
  if (args.scale_parameter && n > 0) {
    ParamSquaresKernel<M><<<sum_blocks, kThreads, 0, stream>>>(
        master, n, begin, factored ? cols : 1, uncounted, w.param_part);
    PartialsToFloatKernel<<<1, 1, 0, stream>>>(w.param_part, param_sq);
  }
  const Hyper h = HyperOf(args, rho, whole);
  float* m = args.m.empty() || n == 0 ? nullptr : args.m.data<float>();
  if (!factored) {
    ZT_RETURN_IF_ERROR(SumAcross(args, param_sq, 1, "parameter sum of squares"));
    if (n == 0) return SumAcross(args, u_sq, 1, "sum of squared updates");
    float* v = args.full_state.data<float>();
    FullUSquaresKernel<G>
        <<<sum_blocks, kThreads, 0, stream>>>(grad, gs, n, v, beta2t, args.eps1, w.u_part);
    PartialsToFloatKernel<<<1, 1, 0, stream>>>(w.u_part, u_sq);
    ZT_RETURN_IF_ERROR(SumAcross(args, u_sq, 1, "sum of squared updates"));
    ShardedFinalizeKernel<<<1, 1, 0, stream>>>(param_sq, u_sq, h, w.scalars);
    ApplyKernel<G, M><<<GridFor(n, kThreads), kThreads, 0, stream>>>(
        master, grad, gs, n, n, begin, /*row_factor=*/nullptr, v, m, args.beta1, w.scalars);
    return LaunchStatus("AdafactorUpdate");
  }
  const int64_t first_row = begin / cols, row_end = (end + cols - 1) / cols;
  if (n > 0) {
    ShardRowSumsKernel<G><<<GridFor(row_end - first_row, 1), kThreads, 0, stream>>>(
        grad, gs, cols, begin, end, first_row, row_end, row_sum);
    ShardColSumsKernel<G><<<GridFor(cols, kThreads), kThreads, 0, stream>>>(
        grad, gs, cols, begin, end, first_row, row_end, uncounted, col_sum);
  }
  ZT_RETURN_IF_ERROR(SumAcross(args, row_sum, rows + cols + 1, "row, column and parameter sums"));
  // An empty shard may hold no statistics; one that holds them keeps them in step.
  float* row_state = args.row_state.empty() || whole == 0 ? nullptr : args.row_state.data<float>();
  float* col_state = args.col_state.empty() || whole == 0 ? nullptr : args.col_state.data<float>();
  const double b2t = beta2t, eps1 = args.eps1;
  if (row_state != nullptr) {
    StateFromSumsKernel<<<GridFor(rows, kThreads), kThreads, 0, stream>>>(
        row_state, row_sum, rows, static_cast<double>(logical_cols), b2t, eps1);
  }
  if (col_state != nullptr) {
    StateFromSumsKernel<<<GridFor(cols, kThreads), kThreads, 0, stream>>>(
        col_state, col_sum, cols, static_cast<double>(logical_rows), b2t, eps1);
  }
  if (n == 0) return SumAcross(args, u_sq, 1, "sum of squared updates");
  if (logical_rows != rows) {
    // The other parts' rows: the counted Σ R_i as f32 (the CPU's float), summed over the
    // tensor-parallel group in device memory, then mean(R) over the logical rows.
    float* total = w.scalars + 2;
    RowTotalKernel<<<1, 1024, 0, stream>>>(row_state, rows, uncounted, total);
    ZT_RETURN_IF_ERROR(LaunchStatus("AdafactorUpdate"));
    absl::Status st = sh.sum_row_states(total, 1);
    if (!st.ok()) {
      return absl::Status(st.code(),
                          absl::StrCat("AdafactorUpdate: sum_row_states failed: ", st.message()));
    }
    RowFactorFromTotalKernel<<<GridFor(rows, kThreads), kThreads, 0, stream>>>(
        row_state, rows, total, logical_rows, w.row_factor);
  } else {
    RowFactorKernel<<<1, 1024, 0, stream>>>(row_state, rows, w.row_factor);
  }
  FactoredUSquaresKernel<G><<<sum_blocks, kThreads, 0, stream>>>(
      grad, gs, cols, n, begin, w.row_factor, col_state, uncounted, w.u_part);
  PartialsToFloatKernel<<<1, 1, 0, stream>>>(w.u_part, u_sq);
  ZT_RETURN_IF_ERROR(SumAcross(args, u_sq, 1, "sum of squared updates"));
  ShardedFinalizeKernel<<<1, 1, 0, stream>>>(param_sq, u_sq, h, w.scalars);
  ApplyKernel<G, M><<<GridFor(n, kThreads), kThreads, 0, stream>>>(
      master, grad, gs, cols, n, begin, w.row_factor, col_state, m, args.beta1, w.scalars);
  return LaunchStatus("AdafactorUpdate");
}

}  // namespace

absl::Status AdafactorUpdate(const DeviceContext& ctx, const AdafactorArgs& args) {
  // ρ and β2t as the CPU computes them (RelativeOrAbsoluteStep, Beta2At).
  const double t = static_cast<double>(args.step);
  const double rho = args.relative_step
                         ? std::min(args.warmup_init ? 1e-6 * t : 1e-2, 1.0 / std::sqrt(t))
                         : static_cast<double>(args.lr);
  const float beta2t = static_cast<float>(1.0 - std::pow(t, static_cast<double>(args.decay_rate)));
  const Scratch w = ScratchOf(ctx.workspace);
  if (args.shard.has_value()) {
    // An empty shard's tensors may be absent: its dtypes choose nothing it runs.
    const Tensor f32;
    const bool empty = args.shard->begin == args.shard->end;
    return DispatchGradCopy(empty ? f32 : args.grad, empty ? f32 : args.param,
                            empty ? f32 : args.param_copy, !empty && args.stochastic_rounding,
                            [&](auto grad_tag, auto mode_tag) {
                              return EnqueueSharded<decltype(grad_tag), decltype(mode_tag)::value>(
                                  ctx, args, w, beta2t, rho);
                            });
  }
  if (args.param.numel() == 0) return absl::OkStatus();
  DispatchGradCopy(args.grad, args.param, args.param_copy, args.stochastic_rounding,
                   [&](auto grad_tag, auto mode_tag) {
                     Enqueue<decltype(grad_tag), decltype(mode_tag)::value>(ctx, args, w, beta2t,
                                                                            rho);
                   });
  return LaunchStatus("AdafactorUpdate");
}

}  // namespace zt::cuda
