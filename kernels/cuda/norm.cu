// CUDA LayerNorm and RMSNorm.
// Legend: N rows (B·T), C channels, G = min(N, kNormBackwardBlocks) backward blocks.
// Accumulation rule: dweight/dbias +=; dinp = or += by dinp_mode (as kernels/cpu/norm.cc).
//
// Forward: one block per row (grid-stride over rows). The statistics are the CPU's, in f32:
// mean = Σx · (1/C), var = Σ(x − mean)² · (1/C) (two passes: no cancellation), rstd =
// 1/√(var + eps); the block sums (kernels/cuda/norm_reduce.cuh) differ from the CPU's only
// in the order of their f32 additions. mean and rstd are saved as the CPU saves them.
//
// Backward, two kernels and no float atomics:
//  1. Block b takes rows b, b + G, …: per row, the sums Σdn and Σdn·xhat (dn = dout∘weight),
//     then dinp and, for each channel, dout·xhat (and dout) added to block b's own row of
//     the workspace (G × C f32 each; every element has one owner thread, so no races).
//  2. One thread per channel adds the G workspace rows in block order and does dweight +=
//     that sum (dbias likewise) in the parameter gradient's dtype, rounded once.
// Both orders are fixed by the shape, so the bits are the same on every run. Each row is
// read and written by one block, each element of its dinp by the thread that read its dout
// after the row's sums: dinp may alias dout, as on the CPU.
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/float_io.cuh"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/norm_reduce.cuh"

namespace zt::cuda {
namespace {

// Threads per row: whole warps, no more than the row can keep busy.
int RowThreads(int64_t c) {
  if (c >= 1024) return 512;
  if (c >= 256) return 256;
  if (c >= 64) return 64;
  return 32;
}

// mean == nullptr: RMSNorm (no mean, no bias).
__global__ void NormForwardKernel(FloatPtr inp, FloatPtr weight, FloatPtr bias, FloatPtr out,
                                  float* mean_out, float* rstd_out, int64_t rows, int64_t c,
                                  float inv_c, float eps) {
  __shared__ float scratch[32];
  const bool layer_norm = mean_out != nullptr;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * c;
    float mean = 0.0f;
    float sq = 0.0f;
    if (layer_norm) {
      float sum = 0.0f;
      for (int64_t i = threadIdx.x; i < c; i += blockDim.x) sum += inp.Load(base + i);
      mean = BlockSum(sum, scratch) * inv_c;
      for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
        const float d = inp.Load(base + i) - mean;
        sq += d * d;
      }
    } else {
      for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
        const float x = inp.Load(base + i);
        sq += x * x;
      }
    }
    const float rstd = 1.0f / sqrtf(BlockSum(sq, scratch) * inv_c + eps);
    for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
      const float x = inp.Load(base + i);
      if (layer_norm) {
        out.Store(base + i, (x - mean) * rstd * weight.Load(i) + bias.Load(i));
      } else {
        out.Store(base + i, x * rstd * weight.Load(i));
      }
    }
    if (threadIdx.x == 0) {
      if (layer_norm) mean_out[r] = mean;
      rstd_out[r] = rstd;
    }
  }
}

// Pass 1 of the backward. mean == nullptr: RMSNorm (no mean subtracted, no dbias partials).
__global__ void NormBackwardKernel(FloatPtr dout, FloatPtr inp, FloatPtr weight, const float* mean,
                                   const float* rstd, FloatPtr dinp, bool add, float* dw_part,
                                   float* db_part, int64_t rows, int64_t c) {
  __shared__ float scratch[32];
  float* dw = dw_part + blockIdx.x * c;  // (C) this block's partial sums
  float* db = db_part == nullptr ? nullptr : db_part + blockIdx.x * c;
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
    dw[i] = 0.0f;
    if (db != nullptr) db[i] = 0.0f;
  }
  const float c_float = static_cast<float>(c);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * c;
    const float m = mean != nullptr ? mean[r] : 0.0f;
    const float rs = rstd[r];
    float sum_dn = 0.0f, sum_dn_xhat = 0.0f;
    for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
      const float dn = dout.Load(base + i) * weight.Load(i);
      sum_dn += dn;
      sum_dn_xhat += dn * ((inp.Load(base + i) - m) * rs);
    }
    // The barriers inside BlockSum also order every thread's reads of this row's dout before
    // any thread's write of its dinp (they may alias).
    sum_dn = BlockSum(sum_dn, scratch);
    sum_dn_xhat = BlockSum(sum_dn_xhat, scratch);
    const float a = mean != nullptr ? sum_dn / c_float : 0.0f;
    const float b = sum_dn_xhat / c_float;
    for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
      const float dy = dout.Load(base + i);
      const float xhat = (inp.Load(base + i) - m) * rs;
      dw[i] += dy * xhat;
      if (db != nullptr) db[i] += dy;
      const float dx = (dy * weight.Load(i) - a - xhat * b) * rs;
      dinp.Store(base + i, add ? dinp.Load(base + i) + dx : dx);
    }
  }
}

// Pass 2: grad[j] += Σ_b part[b][j], b in block order.
__global__ void ParamGradSumKernel(const float* part, int64_t blocks, int64_t c, FloatPtr grad) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < c;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) s += part[b * c + j];
    grad.Store(j, grad.Load(j) + s);
  }
}

absl::Status Forward(const char* op, const DeviceContext& ctx, const Tensor& inp,
                     const Tensor& weight, const Tensor& bias, const Tensor& out,
                     const Tensor& mean, const Tensor& rstd, float eps) {
  const int64_t rows = inp.dim(0), c = inp.dim(1);
  if (rows == 0) return absl::OkStatus();
  const float inv_c = 1.0f / static_cast<float>(c);
  const int threads = RowThreads(c);
  NormForwardKernel<<<GridFor(rows, 1), threads, 0, StreamOf(ctx)>>>(
      AsFloatPtr(inp), AsFloatPtr(weight), bias.empty() ? FloatPtr{} : AsFloatPtr(bias),
      AsFloatPtr(out), mean.empty() ? nullptr : mean.data<float>(), rstd.data<float>(), rows, c,
      inv_c, eps);
  return LaunchStatus(op);
}

absl::Status Backward(const char* op, const DeviceContext& ctx, const Tensor& dout,
                      const Tensor& inp, const Tensor& weight, const Tensor& mean,
                      const Tensor& rstd, const Tensor& dinp, const Tensor& dweight,
                      const Tensor* dbias, Accumulate mode) {
  const int64_t rows = inp.dim(0), c = inp.dim(1);
  if (rows == 0 || c == 0) return absl::OkStatus();
  const int64_t blocks = NormBackwardBlocks(rows);
  // kernels/norm.cc has checked that the workspace holds blocks × C f32 per sum.
  float* dw_part = static_cast<float*>(ctx.workspace.data);
  float* db_part = dbias != nullptr ? dw_part + blocks * c : nullptr;
  cudaStream_t stream = StreamOf(ctx);
  NormBackwardKernel<<<static_cast<unsigned int>(blocks), RowThreads(c), 0, stream>>>(
      AsFloatPtr(dout), AsFloatPtr(inp), AsFloatPtr(weight),
      mean.empty() ? nullptr : mean.data<float>(), rstd.data<float>(), AsFloatPtr(dinp),
      mode == Accumulate::kAdd, dw_part, db_part, rows, c);
  constexpr int kThreads = 256;
  ParamGradSumKernel<<<GridFor(c, kThreads), kThreads, 0, stream>>>(dw_part, blocks, c,
                                                                    AsFloatPtr(dweight));
  if (dbias != nullptr) {
    ParamGradSumKernel<<<GridFor(c, kThreads), kThreads, 0, stream>>>(db_part, blocks, c,
                                                                      AsFloatPtr(*dbias));
  }
  return LaunchStatus(op);
}

}  // namespace

absl::Status LayerNormForward(const DeviceContext& ctx, const LayerNormForwardArgs& args) {
  return Forward("LayerNormForward", ctx, args.inp, args.weight, args.bias, args.out, args.mean,
                 args.rstd, args.eps);
}

absl::Status RmsNormForward(const DeviceContext& ctx, const RmsNormForwardArgs& args) {
  return Forward("RmsNormForward", ctx, args.inp, args.weight, Tensor(), args.out, Tensor(),
                 args.rstd, args.eps);
}

absl::Status LayerNormBackward(const DeviceContext& ctx, const LayerNormBackwardArgs& args) {
  return Backward("LayerNormBackward", ctx, args.dout, args.inp, args.weight, args.mean, args.rstd,
                  args.dinp, args.dweight, &args.dbias, args.dinp_mode);
}

absl::Status RmsNormBackward(const DeviceContext& ctx, const RmsNormBackwardArgs& args) {
  return Backward("RmsNormBackward", ctx, args.dout, args.inp, args.weight, Tensor(), args.rstd,
                  args.dinp, args.dweight, /*dbias=*/nullptr, args.dinp_mode);
}

}  // namespace zt::cuda
