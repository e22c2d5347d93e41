// Reductions on the CPU.
// SumOfSquares splits the buffer into at most kMaxChunks chunks whose size depends only on n;
// each chunk is summed in double by one thread, and the chunk sums are added in chunk order
// afterwards. The thread count then changes who sums a chunk, never what is summed in which
// order, and the partials live on the stack (nothing is allocated per call).
#include "kernels/cpu/reduce.h"

#include <algorithm>
#include <bit>
#include <cstdint>

namespace zt::cpu {
namespace {

// Small enough to sum quickly, large enough that a parallel region pays for itself.
constexpr int64_t kMinChunk = 1 << 16;
// Bounds the partials array (32 KiB of stack) for any n: 124M parameters use chunks of ~30K.
constexpr int64_t kMaxChunks = 4096;

}  // namespace

double SumOfSquares(const DeviceContext& ctx, const float* x, int64_t n) {
  const int64_t chunk = std::max(kMinChunk, (n + kMaxChunks - 1) / kMaxChunks);
  const int64_t chunks = (n + chunk - 1) / chunk;
  double partial[kMaxChunks];
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const float* p = x + c * chunk;
    const int64_t len = std::min(chunk, n - c * chunk);
    double sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < len; ++i) sum += static_cast<double>(p[i]) * p[i];
    partial[c] = sum;
  }
  double total = 0;
  for (int64_t c = 0; c < chunks; ++c) total += partial[c];
  return total;
}

bool AllFinite(const DeviceContext& ctx, const float* x, int64_t n) {
  int non_finite = 0;
#pragma omp parallel for simd num_threads(ctx.num_threads) schedule(static) \
    reduction(|                                                             \
              : non_finite) if (n >= kMinChunk)
  for (int64_t i = 0; i < n; ++i) {
    // All exponent bits set is inf or NaN.
    non_finite |= (std::bit_cast<uint32_t>(x[i]) & 0x7f800000u) == 0x7f800000u;
  }
  return non_finite == 0;
}

}  // namespace zt::cpu
