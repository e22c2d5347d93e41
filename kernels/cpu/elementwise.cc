// Element-wise ops on the CPU. Every loop is `parallel for simd` over the flat buffer: each
// element's result depends only on that element, so any thread count gives the same bits.
// The casts use load_store.h's branch-free conversions. With a 16-bit operand, the arithmetic
// ops work in chunks converted to f32 and round each result once when it is stored.
#include "kernels/cpu/elementwise.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/load_store.h"

namespace zt::cpu {
namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kMinParallel = 1 << 15;
// Elements converted at a time on the 16-bit paths: three f32 rows stay in L1/L2.
constexpr int64_t kChunk = 4096;

template <typename Src, typename Dst, typename Convert>
void CastLoop(const DeviceContext& ctx, const void* src, void* dst, int64_t n, Convert convert) {
  const Src* s = static_cast<const Src*>(src);
  Dst* d = static_cast<Dst*>(dst);
#pragma omp parallel for simd num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
  for (int64_t i = 0; i < n; ++i) d[i] = convert(s[i]);
}

}  // namespace

void Add(const DeviceContext& ctx, const void* a, DType a_dtype, const void* b, DType b_dtype,
         void* out, DType out_dtype, int64_t n) {
  if (a_dtype == DType::kF32 && b_dtype == DType::kF32 && out_dtype == DType::kF32) {
    const float* af = static_cast<const float*>(a);
    const float* bf = static_cast<const float*>(b);
    float* of = static_cast<float*>(out);
#pragma omp parallel for simd num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
    for (int64_t i = 0; i < n; ++i) of[i] = af[i] + bf[i];
    return;
  }
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t off = c * kChunk, len = std::min(kChunk, n - off);
    // Both operands are converted before anything is stored, so out may alias a or b.
    const float* x = ReadRow(a, a_dtype, off, len, 0);
    const float* y = ReadRow(b, b_dtype, off, len, 1);
    float* z = WriteRow(out, out_dtype, off, len, 2, /*load=*/false);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) z[i] = x[i] + y[i];
    FinishRow(z, len, out, out_dtype, off);
  }
}

void Scale(const DeviceContext& ctx, void* t, DType dtype, float s, int64_t n) {
  if (dtype == DType::kF32) {
    float* tf = static_cast<float*>(t);
#pragma omp parallel for simd num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
    for (int64_t i = 0; i < n; ++i) tf[i] *= s;
    return;
  }
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t off = c * kChunk, len = std::min(kChunk, n - off);
    float* x = WriteRow(t, dtype, off, len, 0, /*load=*/true);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) x[i] *= s;
    FinishRow(x, len, t, dtype, off);
  }
}

void CastStochastic(const DeviceContext& ctx, const float* src, uint16_t* dst, uint64_t seed,
                    int64_t n) {
#pragma omp parallel for simd num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
  for (int64_t i = 0; i < n; ++i) dst[i] = ToBf16Stochastic(src[i], seed, i);
}

void SplitMasterWeights(const DeviceContext& ctx, const float* src, uint16_t* high, int16_t* low,
                        int64_t n) {
#pragma omp parallel for simd num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
  for (int64_t i = 0; i < n; ++i) {
    const SplitMasterBits b = SplitMaster(src[i]);
    high[i] = b.high;
    if (low != nullptr) low[i] = b.low;
  }
}

void JoinMasterWeights(const DeviceContext& ctx, const uint16_t* high, const int16_t* low,
                       float* dst, int64_t n) {
#pragma omp parallel for simd num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
  for (int64_t i = 0; i < n; ++i) dst[i] = JoinMaster(high[i], low[i]);
}

void ZeroBytes(const DeviceContext& ctx, void* data, int64_t bytes) {
  constexpr int64_t kChunk = 1 << 20;
  const int64_t chunks = (bytes + kChunk - 1) / kChunk;
  char* p = static_cast<char*>(data);
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    std::memset(p + c * kChunk, 0, std::min(kChunk, bytes - c * kChunk));
  }
}

void Cast(const DeviceContext& ctx, const void* src, DType src_dtype, void* dst, DType dst_dtype,
          int64_t n) {
  if (src_dtype == dst_dtype) {
    if (src != dst) std::memcpy(dst, src, n * DTypeSize(src_dtype));
    return;
  }
  // Lambdas, not function pointers: the loop then inlines the conversion and vectorizes.
  auto to_half = [](float x) { return ToHalf(x); };
  auto to_bf16 = [](float x) { return ToBf16(x); };
  auto from_half = [](uint16_t h) { return FromHalf(h); };
  auto from_bf16 = [](uint16_t h) { return FromBf16(h); };
  auto half_to_bf16 = [](uint16_t h) { return ToBf16(FromHalf(h)); };
  auto bf16_to_half = [](uint16_t h) { return ToHalf(FromBf16(h)); };
  if (src_dtype == DType::kF32 && dst_dtype == DType::kF16) {
    CastLoop<float, uint16_t>(ctx, src, dst, n, to_half);
  } else if (src_dtype == DType::kF32 && dst_dtype == DType::kBF16) {
    CastLoop<float, uint16_t>(ctx, src, dst, n, to_bf16);
  } else if (src_dtype == DType::kF16 && dst_dtype == DType::kF32) {
    CastLoop<uint16_t, float>(ctx, src, dst, n, from_half);
  } else if (src_dtype == DType::kBF16 && dst_dtype == DType::kF32) {
    CastLoop<uint16_t, float>(ctx, src, dst, n, from_bf16);
  } else if (src_dtype == DType::kF16 && dst_dtype == DType::kBF16) {
    CastLoop<uint16_t, uint16_t>(ctx, src, dst, n, half_to_bf16);
  } else {  // bf16 -> f16, the one pair left.
    CastLoop<uint16_t, uint16_t>(ctx, src, dst, n, bf16_to_half);
  }
}

}  // namespace zt::cpu
