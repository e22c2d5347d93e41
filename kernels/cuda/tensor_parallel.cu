// CUDA tensor-parallel local ops (kernels/tensor_parallel.h), each the CPU twin's arithmetic
// element for element (kernels/cpu/tensor_parallel.cc): loads to f32, the same f32 (and, for
// the softmax, f64) expressions, one rounding on store.
// Legend: N rows (B·T), C channels, Vl the rank's vocabulary columns, P tensor-parallel ranks.
//
// - The embedding forward, AddRowBias and the row maxima are exact (a lookup, one f32 add, a
//   max): bitwise the CPU's.
// - The embedding backward is the deterministic sorted scatter-add of
//   kernels/cuda/row_scatter.h (dwte keyed by the token's local row, dwpe by the packed
//   position's): each element summed from its current value in row order, the CPU's order, so
//   bitwise the CPU's. Without packed positions dwpe row l sums dout[b, p0 + l] over b in
//   order, one thread per element.
// - The softmax passes are one block per row. Σexp(x − M) is summed in f64 as the CPU sums it,
//   each thread's stride in order and the shares in a fixed tree (norm_reduce.cuh), so it is
//   the same every run but differs from the CPU's sequential sum in its last bits; the loss and
//   the gradient then follow the CPU's f64 expressions.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/float_io.cuh"
#include "kernels/cuda/norm_reduce.cuh"
#include "kernels/cuda/row_scatter.h"
#include "kernels/cuda/tensor_parallel.h"
#include "kernels/status_macros.h"

namespace zt::cuda {
namespace {

constexpr int kThreads = 256;     // elementwise kernels
constexpr int kRowThreads = 256;  // one block per row

__global__ void ForwardKernel(const int32_t* tokens, const int32_t* positions, FloatPtr wte,
                              int64_t vl, int64_t v0, FloatPtr wpe, int64_t pl, int64_t p0,
                              FloatPtr out, int64_t n, int64_t t, int64_t c) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n * c;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / c, ch = e % c;
    const int32_t token = tokens[i];
    if (token < 0) {
      out.Store(e, NAN);  // the CPU op's InvalidArgument (kernels/cuda/tensor_parallel.h)
      continue;
    }
    const int64_t local = int64_t{token} - v0;
    const int64_t local_pos = (positions != nullptr ? int64_t{positions[i]} : i % t) - p0;
    const bool row = local >= 0 && local < vl;
    const bool pos = local_pos >= 0 && local_pos < pl;
    const float r = row ? wte.Load(local * c + ch) : 0.0f;
    const float q = pos ? wpe.Load(local_pos * c + ch) : 0.0f;
    // As the CPU: x + 0 would be x, but the sum is only taken where both rows are owned.
    out.Store(e, row && pos ? r + q : row ? r : q);
  }
}

// dwpe[l, c] += Σ_b dout[b, p0 + l, c] in order of b, for l in [lo, hi).
__global__ void WpeGradKernel(FloatPtr dout, FloatPtr dwpe, int64_t b, int64_t t, int64_t c,
                              int64_t p0, int64_t lo, int64_t hi) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < (hi - lo) * c;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t l = lo + e / c, ch = e % c;
    float acc = dwpe.Load(l * c + ch);
    for (int64_t i = 0; i < b; ++i) acc += dout.Load((i * t + p0 + l) * c + ch);
    dwpe.Store(l * c + ch, acc);
  }
}

// The block-wide maximum of v (NaN operands ignored, −∞ for none), to every thread.
__device__ float BlockMaxOf(float v, float* scratch) {
  v = WarpReduce(v, MaxOp{});
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = static_cast<int>(blockDim.x >> 5);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return WarpReduce(lane < warps ? scratch[lane] : -INFINITY, MaxOp{});
}

// M of row r: the largest of the P gathered maxima (exact, so in any order).
__device__ float GlobalMax(const float* maxes, int64_t p, int64_t n, int64_t r) {
  float m = -INFINITY;
  for (int64_t k = 0; k < p; ++k) m = fmaxf(m, maxes[k * n + r]);
  return m;
}

__global__ void __launch_bounds__(kRowThreads)
    RowMaxKernel(FloatPtr logits, int64_t vl, int64_t valid, float* max) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < valid; i += kRowThreads) m = fmaxf(m, logits.Load(r * vl + i));
  m = BlockMaxOf(m, scratch);
  if (threadIdx.x == 0) max[r] = m;
}

__global__ void __launch_bounds__(kRowThreads)
    ExpSumKernel(FloatPtr logits, int64_t vl, int64_t valid, const float* maxes, int64_t p,
                 int64_t n, const int32_t* targets, int64_t v0, float* sums) {
  __shared__ double scratch[32];
  const int64_t r = blockIdx.x;
  float* s = sums + 2 * r;
  if (targets[r] < 0) {
    if (threadIdx.x == 0) s[0] = s[1] = 0.0f;
    return;  // the whole block returns: no barrier below is reached by part of it
  }
  const float m = GlobalMax(maxes, p, n, r);
  double sum = 0;
  for (int64_t i = threadIdx.x; i < valid; i += kRowThreads) {
    sum += exp(static_cast<double>(logits.Load(r * vl + i) - m));
  }
  sum = BlockSum(sum, scratch);
  if (threadIdx.x == 0) {
    const int64_t local = int64_t{targets[r]} - v0;
    s[0] = static_cast<float>(sum);
    s[1] = local >= 0 && local < valid ? logits.Load(r * vl + local) : 0.0f;
  }
}

__global__ void __launch_bounds__(kRowThreads)
    CrossEntropyKernel(FloatPtr logits, int64_t vl, int64_t valid, const float* maxes, int64_t p,
                       int64_t n, const float* sums, const int32_t* targets, int64_t v0,
                       float* losses, double scale, bool write_grad) {
  const int64_t r = blockIdx.x;
  if (targets[r] < 0) {
    if (threadIdx.x == 0) losses[r] = 0.0f;
    if (write_grad) {
      for (int64_t i = threadIdx.x; i < vl; i += kRowThreads) logits.Store(r * vl + i, 0.0f);
    }
    return;
  }
  const float m = GlobalMax(maxes, p, n, r);
  const double sum = sums[2 * r];
  const float target_logit = sums[2 * r + 1];
  if (threadIdx.x == 0) {
    losses[r] = static_cast<float>(static_cast<double>(m) + log(sum) - target_logit);
  }
  if (!write_grad) return;
  const int64_t local = int64_t{targets[r]} - v0;
  // Each thread reads and writes only its own columns: in place without a barrier.
  for (int64_t i = threadIdx.x; i < vl; i += kRowThreads) {
    float g = 0.0f;  // padding columns
    if (i == local && local < valid) {
      // In f64 from the target's logit, as the CPU: p − 1 would cancel in f32 near p = 1.
      g = static_cast<float>((exp(static_cast<double>(target_logit - m)) / sum - 1.0) * scale);
    } else if (i < valid) {
      g = static_cast<float>(exp(static_cast<double>(logits.Load(r * vl + i) - m)) / sum * scale);
    }
    logits.Store(r * vl + i, g);
  }
}

__global__ void AddRowBiasKernel(FloatPtr out, FloatPtr bias, int64_t n, int64_t c) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n * c;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out.Store(e, out.Load(e) + bias.Load(e % c));
  }
}

// The row kernels' grid is one block per row.
absl::Status CheckRowCount(const char* op, int64_t n) {
  if (n <= 0x7fffffff) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", n, " rows, the CUDA kernel takes at most 2^31 − 1"));
}

}  // namespace

absl::Status VocabShardEmbeddingForward(const DeviceContext& ctx,
                                        const VocabShardEmbeddingForwardArgs& args) {
  const int64_t t = args.tokens.dim(1), n = args.tokens.numel(), c = args.wte.dim(1);
  if (n * c == 0) return absl::OkStatus();
  const bool has_wpe = !args.wpe.empty();
  ForwardKernel<<<GridFor(n * c, kThreads), kThreads, 0, StreamOf(ctx)>>>(
      args.tokens.data<int32_t>(),
      args.positions.empty() ? nullptr : args.positions.data<int32_t>(), AsFloatPtr(args.wte),
      args.wte.dim(0), args.vocab_begin,
      has_wpe ? AsFloatPtr(args.wpe) : FloatPtr{nullptr, DType::kF32},
      has_wpe ? args.wpe.dim(0) : 0, args.position_begin, AsFloatPtr(args.out), n, t, c);
  return LaunchStatus("VocabShardEmbeddingForward");
}

absl::Status VocabShardEmbeddingBackward(const DeviceContext& ctx,
                                         const VocabShardEmbeddingBackwardArgs& args) {
  constexpr const char* kOp = "VocabShardEmbeddingBackward";
  const int64_t b = args.tokens.dim(0), t = args.tokens.dim(1), n = b * t;
  const int64_t c = args.dwte.dim(1);
  if (n == 0 || c == 0) return absl::OkStatus();
  const cudaStream_t stream = StreamOf(ctx);
  const FloatPtr dout = AsFloatPtr(args.dout);
  // Both sorts use the workspace from its start, one after the other on the stream.
  ZT_RETURN_IF_ERROR(ScatterAddRows(kOp, stream, RowIds{.ids = args.tokens.data<int32_t>()},
                                    args.vocab_begin, n, dout, AsFloatPtr(args.dwte),
                                    args.dwte.dim(0), c, ctx.workspace.data));
  if (args.dwpe.empty()) return absl::OkStatus();
  // The local rows whose position t' = p0 + l lies in [0, T): the only ones a token can touch.
  const int64_t p0 = args.position_begin;
  const int64_t lo = std::max<int64_t>(0, -p0);
  const int64_t hi = std::min(args.dwpe.dim(0), t - p0);
  if (hi <= lo) return absl::OkStatus();
  if (!args.positions.empty()) {
    return ScatterAddRows(kOp, stream, RowIds{.ids = args.positions.data<int32_t>()}, p0, n, dout,
                          AsFloatPtr(args.dwpe), hi, c, ctx.workspace.data);
  }
  WpeGradKernel<<<GridFor((hi - lo) * c, kThreads), kThreads, 0, stream>>>(
      dout, AsFloatPtr(args.dwpe), b, t, c, p0, lo, hi);
  return LaunchStatus(kOp);
}

absl::Status VocabShardRowMax(const DeviceContext& ctx, const VocabShardRowMaxArgs& args) {
  constexpr const char* kOp = "VocabShardRowMax";
  const int64_t n = args.logits.dim(0);
  if (n == 0) return absl::OkStatus();
  ZT_RETURN_IF_ERROR(CheckRowCount(kOp, n));
  RowMaxKernel<<<static_cast<unsigned>(n), kRowThreads, 0, StreamOf(ctx)>>>(
      AsFloatPtr(args.logits), args.logits.dim(1), args.valid, args.max.data<float>());
  return LaunchStatus(kOp);
}

absl::Status VocabShardExpSum(const DeviceContext& ctx, const VocabShardExpSumArgs& args) {
  constexpr const char* kOp = "VocabShardExpSum";
  const int64_t n = args.logits.dim(0);
  if (n == 0) return absl::OkStatus();
  ZT_RETURN_IF_ERROR(CheckRowCount(kOp, n));
  ExpSumKernel<<<static_cast<unsigned>(n), kRowThreads, 0, StreamOf(ctx)>>>(
      AsFloatPtr(args.logits), args.logits.dim(1), args.valid, args.maxes.data<float>(),
      args.maxes.dim(0), n, args.targets.data<int32_t>(), args.vocab_begin,
      args.sums.data<float>());
  return LaunchStatus(kOp);
}

absl::Status VocabShardCrossEntropy(const DeviceContext& ctx,
                                    const VocabShardCrossEntropyArgs& args) {
  constexpr const char* kOp = "VocabShardCrossEntropy";
  const int64_t n = args.logits.dim(0);
  if (n == 0) return absl::OkStatus();
  ZT_RETURN_IF_ERROR(CheckRowCount(kOp, n));
  CrossEntropyKernel<<<static_cast<unsigned>(n), kRowThreads, 0, StreamOf(ctx)>>>(
      AsFloatPtr(args.logits), args.logits.dim(1), args.valid, args.maxes.data<float>(),
      args.maxes.dim(0), n, args.sums.data<float>(), args.targets.data<int32_t>(), args.vocab_begin,
      args.losses.data<float>(), static_cast<double>(args.grad_scale), args.write_grad);
  return LaunchStatus(kOp);
}

absl::Status AddRowBias(const DeviceContext& ctx, const AddRowBiasArgs& args) {
  const int64_t n = args.out.dim(0), c = args.out.dim(1);
  if (n * c == 0) return absl::OkStatus();
  AddRowBiasKernel<<<GridFor(n * c, kThreads), kThreads, 0, StreamOf(ctx)>>>(
      AsFloatPtr(args.out), AsFloatPtr(args.bias), n, c);
  return LaunchStatus("AddRowBias");
}

}  // namespace zt::cuda
