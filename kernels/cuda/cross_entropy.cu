// CUDA fused softmax cross-entropy, one block per row, the CPU op's three passes:
// m = max(x); S = Σ exp(x − m), each thread's share summed in double as the CPU sums the row
// (then the shares in a fixed tree); loss = m + log S − x[target];
// dlogits = grad_scale · (exp(x − m) / S − onehot), the target's entry in double (p − 1
// cancels in f32 when p is near 1). Every pass strides the row by the block size, so any V
// works. Each row is reduced in one fixed order: the result does not vary from run to run.
// Legend: N rows (B·T), V vocabulary.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/float_io.cuh"

namespace zt::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

// The block-wide max (kMax) or sum of v, returned to every thread. `scratch` holds kWarps
// values; the trailing __syncthreads lets the caller reuse it at once.
template <bool kMax, typename F>
__device__ F BlockReduce(F v, F* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    const F o = __shfl_xor_sync(0xffffffffu, v, off);
    v = kMax ? (o > v ? o : v) : v + o;
  }
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  F r = scratch[0];
  for (int w = 1; w < kWarps; ++w) r = kMax ? (scratch[w] > r ? scratch[w] : r) : r + scratch[w];
  __syncthreads();
  return r;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    CrossEntropyKernel(T* logits, const int32_t* targets, float* losses, int64_t v, float scale,
                       bool write_grad) {
  __shared__ float max_scratch[kWarps];
  __shared__ double sum_scratch[kWarps];
  const int64_t row = blockIdx.x;
  T* x = logits + row * v;  // (V)
  const int32_t target = targets[row];
  if (target < 0 || target >= v) {
    // Ignored (loss 0, gradient 0), or out of range (NaN: see kernels/cuda/cross_entropy.h).
    const float fill = target < 0 ? 0.0f : NAN;
    if (threadIdx.x == 0) losses[row] = fill;
    if (write_grad) {
      for (int64_t i = threadIdx.x; i < v; i += kThreads) x[i] = FromFloat<T>(fill);
    }
    return;
  }
  const float x_target = ToFloat(x[target]);
  // A NaN logit is skipped by the max (as on the CPU) and poisons the sum instead.
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < v; i += kThreads) m = fmaxf(m, ToFloat(x[i]));
  m = BlockReduce<true>(m, max_scratch);
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < v; i += kThreads) sum += expf(ToFloat(x[i]) - m);
  sum = BlockReduce<false>(sum, sum_scratch);
  if (threadIdx.x == 0) {
    losses[row] = static_cast<float>(static_cast<double>(m) + log(sum) - x_target);
  }
  if (!write_grad) return;
  // Every thread has read x[target] and passed two barriers before any gradient is stored.
  const float inv = static_cast<float>(static_cast<double>(scale) / sum);
  for (int64_t i = threadIdx.x; i < v; i += kThreads) {
    const float e = expf(ToFloat(x[i]) - m);
    x[i] = FromFloat<T>(i == target ? static_cast<float>((e / sum - 1.0) * scale) : e * inv);
  }
}

}  // namespace

absl::Status SoftmaxCrossEntropy(const DeviceContext& ctx, const CrossEntropyArgs& args) {
  const int64_t n = args.logits.dim(0), v = args.logits.dim(1);
  if (n == 0) return absl::OkStatus();
  if (n > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("SoftmaxCrossEntropy: ", n, " rows, the CUDA kernel takes at most 2^31 − 1"));
  }
  DispatchFloatType(args.logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    CrossEntropyKernel<T><<<static_cast<unsigned>(n), kThreads, 0, StreamOf(ctx)>>>(
        args.logits.data<T>(), args.targets.data<int32_t>(), args.losses.data<float>(), v,
        args.grad_scale, args.write_grad);
  });
  return LaunchStatus("SoftmaxCrossEntropy");
}

namespace {

constexpr int kMeanThreads = 256;

// One block: each thread sums its stride of the valid rows in f64, then a fixed tree.
__global__ void MeanLossKernel(const float* losses, const int32_t* targets, int64_t n,
                               double divisor, double* sum) {
  __shared__ double sums[kMeanThreads];
  __shared__ long long counts[kMeanThreads];
  double s = 0;
  long long c = 0;
  for (int64_t i = threadIdx.x; i < n; i += kMeanThreads) {
    if (targets[i] >= 0) {
      s += losses[i];
      ++c;
    }
  }
  sums[threadIdx.x] = s;
  counts[threadIdx.x] = c;
  __syncthreads();
  for (int k = kMeanThreads / 2; k > 0; k /= 2) {
    if (threadIdx.x < k) {
      sums[threadIdx.x] += sums[threadIdx.x + k];
      counts[threadIdx.x] += counts[threadIdx.x + k];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const double mean = counts[0] > 0 ? sums[0] / static_cast<double>(counts[0]) : 0.0;
    *sum += mean / divisor;
  }
}

}  // namespace

absl::Status AccumulateMeanLoss(const DeviceContext& ctx, const MeanLossArgs& args) {
  MeanLossKernel<<<1, kMeanThreads, 0, StreamOf(ctx)>>>(
      args.losses.data<float>(), args.targets.data<int32_t>(), args.losses.numel(), args.divisor,
      static_cast<double*>(args.sum.raw()));
  return LaunchStatus("AccumulateMeanLoss");
}

}  // namespace zt::cuda
