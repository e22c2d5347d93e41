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
#include <cmath>

#include "kernels/cuda/adafactor.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/float_io.cuh"
#include "kernels/cuda/norm_reduce.cuh"
#include "kernels/cuda/optimizer_master.cuh"

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

template <CopyMode M>
__global__ void ParamSquaresKernel(DeviceMaster<M> master, int64_t n, double* part) {
  __shared__ double scratch[32];
  double s = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
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

template <typename G>
__global__ void FactoredUSquaresKernel(const G* grad, float gs, int64_t cols, int64_t n,
                                       const float* row_factor, const float* col_state,
                                       double* part) {
  __shared__ double scratch[32];
  double s = 0;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k / cols, j = k % cols;
    const float u = (ToFloat(grad[k]) * gs) * row_factor[i] / sqrtf(col_state[j]);
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

// One thread: α, the clip, and the f32 factors of the apply pass.
__global__ void FinalizeKernel(const double* param_part, const double* u_part, Hyper h,
                               float* scalars) {
  double alpha = h.rho;
  if (h.scale_parameter) {
    double sum_sq = 0;
    for (int b = 0; b < kAdafactorSumBlocks; ++b) sum_sq += param_part[b];
    alpha = fmax(h.eps2, sqrt(sum_sq / static_cast<double>(h.n))) * h.rho;
  }
  double u_sq = 0;
  for (int b = 0; b < kAdafactorSumBlocks; ++b) u_sq += u_part[b];
  const double clip = fmax(1.0, sqrt(u_sq / static_cast<double>(h.n)) / h.clip_threshold);
  scalars[0] = static_cast<float>(alpha / clip);
  scalars[1] = static_cast<float>(h.weight_decay * alpha);
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
                            int64_t n, const float* row_factor, const float* state, float* m,
                            float beta1, const float* scalars) {
  const float scale = scalars[0], wd_alpha = scalars[1];
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float u;
    if (row_factor != nullptr) {
      u = (ToFloat(grad[k]) * gs) * row_factor[k / cols] / sqrtf(state[k % cols]);
    } else {
      u = (ToFloat(grad[k]) * gs) / sqrtf(state[k]);
    }
    master.Store(
        k, ApplyOne(scale, wd_alpha, beta1, u, m == nullptr ? nullptr : m + k, master.Load(k)), k);
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
    ParamSquaresKernel<M><<<sum_blocks, kThreads, 0, stream>>>(master, n, w.param_part);
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
    FactoredUSquaresKernel<G>
        <<<sum_blocks, kThreads, 0, stream>>>(grad, gs, cols, n, w.row_factor, col_state, w.u_part);
    state = col_state;
    row_factor = w.row_factor;
  } else {
    float* v = args.full_state.data<float>();
    FullUSquaresKernel<G>
        <<<sum_blocks, kThreads, 0, stream>>>(grad, gs, n, v, beta2t, args.eps1, w.u_part);
    state = v;
  }
  const Hyper h{.rho = rho,
                .eps2 = args.eps2,
                .clip_threshold = args.clip_threshold,
                .weight_decay = args.weight_decay,
                .n = n,
                .scale_parameter = args.scale_parameter};
  FinalizeKernel<<<1, 1, 0, stream>>>(w.param_part, w.u_part, h, w.scalars);
  ApplyKernel<G, M><<<GridFor(n, kThreads), kThreads, 0, stream>>>(
      master, grad, gs, cols, n, row_factor, state, args.m.empty() ? nullptr : args.m.data<float>(),
      args.beta1, w.scalars);
}

}  // namespace

absl::Status AdafactorUpdate(const DeviceContext& ctx, const AdafactorArgs& args) {
  if (args.param.numel() == 0) return absl::OkStatus();
  // ρ and β2t as the CPU computes them (RelativeOrAbsoluteStep, Beta2At).
  const double t = static_cast<double>(args.step);
  const double rho = args.relative_step
                         ? std::min(args.warmup_init ? 1e-6 * t : 1e-2, 1.0 / std::sqrt(t))
                         : static_cast<double>(args.lr);
  const float beta2t = static_cast<float>(1.0 - std::pow(t, static_cast<double>(args.decay_rate)));
  const Scratch w = ScratchOf(ctx.workspace);
  DispatchGradCopy(args.grad, args.param, args.param_copy, args.stochastic_rounding,
                   [&](auto grad_tag, auto mode_tag) {
                     Enqueue<decltype(grad_tag), decltype(mode_tag)::value>(ctx, args, w, beta2t,
                                                                            rho);
                   });
  return LaunchStatus("AdafactorUpdate");
}

}  // namespace zt::cuda
