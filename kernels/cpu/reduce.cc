// Reductions on the CPU.
// SumOfSquares splits the buffer into at most kMaxChunks chunks whose size depends only on n;
// each chunk is summed in double by one thread, and the chunk sums are added in chunk order
// afterwards. The thread count then changes who sums a chunk, never what is summed in which
// order, and the partials live on the stack (nothing is allocated per call).
#include "kernels/cpu/reduce.h"

#include <algorithm>
#include <bit>
#include <cstdint>

#include "kernels/cpu/load_store.h"

namespace zt::cpu {
namespace {

// Small enough to sum quickly, large enough that a parallel region pays for itself.
constexpr int64_t kMinChunk = 1 << 16;
// Bounds the partials array (32 KiB of stack) for any n: 124M parameters use chunks of ~30K.
constexpr int64_t kMaxChunks = 4096;

template <typename T, typename ToFloat>
double SumOfSquaresOf(const DeviceContext& ctx, const T* x, int64_t n, ToFloat to_float) {
  const int64_t chunk = std::max(kMinChunk, (n + kMaxChunks - 1) / kMaxChunks);
  const int64_t chunks = (n + chunk - 1) / chunk;
  double partial[kMaxChunks];
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const T* p = x + c * chunk;
    const int64_t len = std::min(chunk, n - c * chunk);
    double sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < len; ++i) {
      const double v = to_float(p[i]);
      sum += v * v;
    }
    partial[c] = sum;
  }
  double total = 0;
  for (int64_t c = 0; c < chunks; ++c) total += partial[c];
  return total;
}

// Every element's exponent field against all-ones (inf or NaN): `exp_mask` of type T.
template <typename T>
bool AllFiniteBits(const DeviceContext& ctx, const T* x, int64_t n, T exp_mask) {
  int non_finite = 0;
#pragma omp parallel for simd num_threads(ctx.num_threads) schedule(static) \
    reduction(|                                                             \
              : non_finite) if (n >= kMinChunk)
  for (int64_t i = 0; i < n; ++i) {
    non_finite |= (x[i] & exp_mask) == exp_mask;
  }
  return non_finite == 0;
}

}  // namespace

double SumOfSquares(const DeviceContext& ctx, const void* x, DType dtype, int64_t n) {
  if (dtype == DType::kBF16) {
    return SumOfSquaresOf(ctx, static_cast<const uint16_t*>(x), n,
                          [](uint16_t h) { return FromBf16(h); });
  }
  if (dtype == DType::kF16) {
    return SumOfSquaresOf(ctx, static_cast<const uint16_t*>(x), n,
                          [](uint16_t h) { return FromHalf(h); });
  }
  return SumOfSquaresOf(ctx, static_cast<const float*>(x), n, [](float f) { return f; });
}

bool AllFinite(const DeviceContext& ctx, const void* x, DType dtype, int64_t n) {
  switch (dtype) {
    case DType::kBF16:
      return AllFiniteBits<uint16_t>(ctx, static_cast<const uint16_t*>(x), n, 0x7f80u);
    case DType::kF16:
      return AllFiniteBits<uint16_t>(ctx, static_cast<const uint16_t*>(x), n, 0x7c00u);
    default:
      return AllFiniteBits<uint32_t>(ctx, static_cast<const uint32_t*>(x), n, 0x7f800000u);
  }
}

void AccumulateSumOfSquares(const DeviceContext& ctx, const void* x, DType dtype, int64_t n,
                            double* sum) {
  *sum += SumOfSquares(ctx, x, dtype, n);
}

void AccumulateNonFinite(const DeviceContext& ctx, const void* x, DType dtype, int64_t n,
                         float* flag) {
  if (!AllFinite(ctx, x, dtype, n)) *flag = 1.0f;
}

}  // namespace zt::cpu
