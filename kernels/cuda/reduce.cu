// CUDA reductions for the optimizer: the gradient norm's Σ x² and the loss scaler's
// overflow check. Both are two-pass and deterministic (see kernels/cuda/reduce.h): the same
// input gives the same bits on every run. Σ x² sums in f64 as the CPU does; each term x² of
// an f32/bf16/f16 x is exact in f64 (24-bit significands square into 48 bits), so GPU and
// CPU differ only by the order of the f64 additions, a relative difference of at most
// 2·n·2⁻⁵³ for n non-negative terms.
#include "kernels/cuda/reduce.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/elementwise_bits.cuh"
#include "kernels/cuda/float_io.cuh"

namespace zt::cuda {
namespace {

// The block's kReduceThreads values of `shared` added in a fixed tree; thread 0 gets the sum.
__device__ __forceinline__ double BlockSum(double* shared, double v) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = kReduceThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  return shared[0];
}

template <typename T>
__global__ void SumOfSquaresPartials(const T* x, int64_t n, double* partials) {
  __shared__ double shared[kReduceThreads];
  double sum = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kReduceThreads;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kReduceThreads) + threadIdx.x; i < n;
       i += stride) {
    const double v = bits::Widen(x[i]);
    sum += v * v;  // exact product, so contraction into an FMA changes nothing
  }
  const double block = BlockSum(shared, sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = block;
}

__global__ void SumPartials(const double* partials, int64_t count, double* result) {
  __shared__ double shared[kReduceThreads];
  double sum = 0;
  for (int64_t i = threadIdx.x; i < count; i += kReduceThreads) sum += partials[i];
  const double total = BlockSum(shared, sum);
  if (threadIdx.x == 0) *result = total;
}

// The step's accumulator: *sum += Σ partials, in SumPartials' order, by the one thread that
// owns it (the accumulator is read and written by this kernel only, in stream order).
__global__ void AddPartials(const double* partials, int64_t count, double* sum) {
  __shared__ double shared[kReduceThreads];
  double part = 0;
  for (int64_t i = threadIdx.x; i < count; i += kReduceThreads) part += partials[i];
  const double total = BlockSum(shared, part);
  if (threadIdx.x == 0) *sum += total;
}

// *flag = 1 when some element's exponent bits are all ones. Every writer writes 1, so the
// race is benign and the result deterministic.
template <typename U>
__global__ void NonFiniteFlag(const U* x, int64_t n, U exp_mask, int* flag) {
  bool bad = false;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    bad |= (x[i] & exp_mask) == exp_mask;
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

absl::Status CheckWorkspace(const char* op, const DeviceContext& ctx, int64_t n) {
  const int64_t need = ReduceWorkspaceBytes(n);
  const int64_t have = ctx.workspace.data != nullptr ? ctx.workspace.bytes : 0;
  if (have >= need && reinterpret_cast<uintptr_t>(ctx.workspace.data) % 8 == 0) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      op, ": needs ", need, " workspace bytes (8-byte aligned) for ", n, " elements, context has ",
      have, " (size ctx.workspace with ReduceWorkspaceBytes)"));
}

template <typename U>
__global__ void NonFiniteToFloat(const U* x, int64_t n, U exp_mask, float* flag) {
  bool bad = false;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    bad |= (x[i] & exp_mask) == exp_mask;
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1.0f;
}

// Copies `bytes` of device `src` to host `dst` on ctx's stream and waits for it.
absl::Status ReadBack(const char* op, const DeviceContext& ctx, const void* src, void* dst,
                      size_t bytes) {
  ZT_CUDA_RETURN_IF_ERROR(op,
                          cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, StreamOf(ctx)));
  ZT_CUDA_RETURN_IF_ERROR(op, cudaStreamSynchronize(StreamOf(ctx)));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<double> SumOfSquares(const DeviceContext& ctx, const void* x, DType dtype,
                                    int64_t n) {
  constexpr const char* kOp = "SumOfSquares";
  if (n == 0) return 0.0;
  if (absl::Status s = CheckWorkspace(kOp, ctx, n); !s.ok()) return s;
  const int64_t blocks = ReduceBlocks(n);
  auto* partials = static_cast<double*>(ctx.workspace.data);
  double* result = partials + blocks;
  DispatchFloatType(dtype, [&](auto tag) {
    using T = decltype(tag);
    SumOfSquaresPartials<T>
        <<<static_cast<unsigned int>(blocks), kReduceThreads, 0, StreamOf(ctx)>>>(
            static_cast<const T*>(x), n, partials);
  });
  SumPartials<<<1, kReduceThreads, 0, StreamOf(ctx)>>>(partials, blocks, result);
  if (absl::Status s = LaunchStatus(kOp); !s.ok()) return s;
  double host = 0;
  if (absl::Status s = ReadBack(kOp, ctx, result, &host, sizeof(host)); !s.ok()) return s;
  return host;
}

absl::StatusOr<bool> AllFinite(const DeviceContext& ctx, const void* x, DType dtype, int64_t n) {
  constexpr const char* kOp = "AllFinite";
  if (n == 0) return true;
  if (absl::Status s = CheckWorkspace(kOp, ctx, n); !s.ok()) return s;
  int* flag = static_cast<int*>(ctx.workspace.data);
  ZT_CUDA_RETURN_IF_ERROR(kOp, cudaMemsetAsync(flag, 0, sizeof(int), StreamOf(ctx)));
  const auto blocks = static_cast<unsigned int>(ReduceBlocks(n));
  switch (dtype) {
    case DType::kBF16:
      NonFiniteFlag<uint16_t><<<blocks, kReduceThreads, 0, StreamOf(ctx)>>>(
          static_cast<const uint16_t*>(x), n, uint16_t{0x7f80u}, flag);
      break;
    case DType::kF16:
      NonFiniteFlag<uint16_t><<<blocks, kReduceThreads, 0, StreamOf(ctx)>>>(
          static_cast<const uint16_t*>(x), n, uint16_t{0x7c00u}, flag);
      break;
    default:
      NonFiniteFlag<uint32_t><<<blocks, kReduceThreads, 0, StreamOf(ctx)>>>(
          static_cast<const uint32_t*>(x), n, 0x7f800000u, flag);
      break;
  }
  if (absl::Status s = LaunchStatus(kOp); !s.ok()) return s;
  int host = 0;
  if (absl::Status s = ReadBack(kOp, ctx, flag, &host, sizeof(host)); !s.ok()) return s;
  return host == 0;
}

absl::Status AccumulateSumOfSquares(const DeviceContext& ctx, const void* x, DType dtype, int64_t n,
                                    double* sum) {
  constexpr const char* kOp = "AccumulateSumOfSquares";
  if (n == 0) return absl::OkStatus();
  if (absl::Status s = CheckWorkspace(kOp, ctx, n); !s.ok()) return s;
  const int64_t blocks = ReduceBlocks(n);
  auto* partials = static_cast<double*>(ctx.workspace.data);
  DispatchFloatType(dtype, [&](auto tag) {
    using T = decltype(tag);
    SumOfSquaresPartials<T>
        <<<static_cast<unsigned int>(blocks), kReduceThreads, 0, StreamOf(ctx)>>>(
            static_cast<const T*>(x), n, partials);
  });
  AddPartials<<<1, kReduceThreads, 0, StreamOf(ctx)>>>(partials, blocks, sum);
  return LaunchStatus(kOp);
}

absl::Status AccumulateNonFinite(const DeviceContext& ctx, const void* x, DType dtype, int64_t n,
                                 float* flag) {
  constexpr const char* kOp = "AccumulateNonFinite";
  if (n == 0) return absl::OkStatus();
  const auto blocks = static_cast<unsigned int>(ReduceBlocks(n));
  switch (dtype) {
    case DType::kBF16:
      NonFiniteToFloat<uint16_t><<<blocks, kReduceThreads, 0, StreamOf(ctx)>>>(
          static_cast<const uint16_t*>(x), n, uint16_t{0x7f80u}, flag);
      break;
    case DType::kF16:
      NonFiniteToFloat<uint16_t><<<blocks, kReduceThreads, 0, StreamOf(ctx)>>>(
          static_cast<const uint16_t*>(x), n, uint16_t{0x7c00u}, flag);
      break;
    default:
      NonFiniteToFloat<uint32_t><<<blocks, kReduceThreads, 0, StreamOf(ctx)>>>(
          static_cast<const uint32_t*>(x), n, 0x7f800000u, flag);
      break;
  }
  return LaunchStatus(kOp);
}

}  // namespace zt::cuda
