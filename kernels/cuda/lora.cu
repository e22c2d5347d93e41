// The LoRA ops of kernels/cuda/lora.h: one thread per element (grid-stride), each element
// read before the same thread writes it, so LoraDropout's out may alias inp.
#include <cstdint>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/elementwise_bits.cuh"
#include "kernels/cuda/lora.h"

namespace zt::cuda {
namespace {

constexpr int kThreads = 256;

// load_store.h's Load and Store with its own rounding (bits::), not cuda_bf16.h's, whose NaN
// is canonical: a copied or dropped NaN keeps the CPU's payload.
struct Bits {
  void* data;
  DType dtype;

  __device__ __forceinline__ float Load(int64_t i) const {
    switch (dtype) {
      case DType::kBF16:
        return bits::FromBf16(static_cast<const uint16_t*>(data)[i]);
      case DType::kF16:
        return bits::FromHalf(static_cast<const uint16_t*>(data)[i]);
      default:
        return static_cast<const float*>(data)[i];
    }
  }
  __device__ __forceinline__ void Store(int64_t i, float v) const {
    switch (dtype) {
      case DType::kBF16:
        static_cast<uint16_t*>(data)[i] = bits::ToBf16(v);
        break;
      case DType::kF16:
        static_cast<uint16_t*>(data)[i] = bits::ToHalf(v);
        break;
      default:
        static_cast<float*>(data)[i] = v;
        break;
    }
  }
};

Bits Of(const Tensor& t) { return Bits{t.raw(), t.dtype()}; }

// Element k of the (M, n) part ↔ element (k / n) · N + c0 + k % n of the (M, N) matrix.
// add: wide += part; else part = wide.
__global__ void ColumnsKernel(Bits wide, Bits part, int64_t N, int64_t n, int64_t c0, int64_t count,
                              bool add) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < count;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t w = (k / n) * N + c0 + k % n;
    if (add) {
      // __fadd_rn: the CPU's one f32 add, never contracted.
      wide.Store(w, __fadd_rn(wide.Load(w), part.Load(k)));
    } else {
      part.Store(k, wide.Load(w));
    }
  }
}

// kernels/lora.cc's LoraDropoutKeeps: 24 uniform bits of the hash, u = bits · 2^-24, kept
// when u ≥ p (exact in f32 on both sides).
__device__ __forceinline__ bool Keeps(uint64_t seed, int64_t i, float p) {
  const float u = __fmul_rn(
      static_cast<float>(bits::HashIndex(seed, static_cast<uint64_t>(i)) >> 40), 0x1p-24f);
  return u >= p;
}

__global__ void DropoutKernel(Bits inp, Bits out, int64_t count, float p, uint64_t seed, bool share,
                              int64_t n, int64_t row, int64_t c0, float keep_scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = inp.Load(i);
    const int64_t logical = share ? (i / n) * row + c0 + i % n : i;
    const bool keep = p == 0.0f || Keeps(seed, logical, p);
    out.Store(i, keep ? __fmul_rn(x, keep_scale) : 0.0f);
  }
}

absl::Status Columns(const char* op, const DeviceContext& ctx, const Tensor& wide,
                     const Tensor& part, int64_t c0, bool add) {
  const int64_t count = part.numel();
  if (count == 0) return absl::OkStatus();
  ColumnsKernel<<<GridFor(count, kThreads), kThreads, 0, StreamOf(ctx)>>>(
      Of(wide), Of(part), wide.dim(1), part.dim(1), c0, count, add);
  return LaunchStatus(op);
}

}  // namespace

absl::Status ColumnsCopy(const DeviceContext& ctx, const ColumnsCopyArgs& args) {
  return Columns("ColumnsCopy", ctx, args.src, args.dst, args.col_begin, /*add=*/false);
}

absl::Status ColumnsAdd(const DeviceContext& ctx, const ColumnsAddArgs& args) {
  return Columns("ColumnsAdd", ctx, args.dst, args.src, args.col_begin, /*add=*/true);
}

absl::Status LoraDropout(const DeviceContext& ctx, const LoraDropoutArgs& args, int64_t n,
                         int64_t row, int64_t col_begin, float keep_scale) {
  const int64_t count = args.inp.numel();
  if (count == 0) return absl::OkStatus();
  DropoutKernel<<<GridFor(count, kThreads), kThreads, 0, StreamOf(ctx)>>>(
      Of(args.inp), Of(args.out), count, args.p, args.seed, args.logical_cols > 0, n, row,
      col_begin, keep_scale);
  return LaunchStatus("LoraDropout");
}

}  // namespace zt::cuda
