// Element-wise ops on the CPU. Every loop is `parallel for simd` over the flat buffer: each
// element's result depends only on that element, so any thread count gives the same bits.
// The casts use branch-free copies of dtype.h's scalar conversions (which are out of line or
// branchy, so a loop over them stays scalar); tests compare the two bit for bit.
#include "kernels/cpu/elementwise.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

namespace zt::cpu {
namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kMinParallel = 1 << 15;

// c ? a : b as a bit blend. A ternary lets the compiler sink the float arithmetic of the
// unused arm into a branch (it may not speculate float ops that could trap), and a loop with
// a branch does not vectorize.
inline uint32_t Select(bool c, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return (a & mask) | (b & ~mask);
}

// FloatToHalf without branches: every path is computed and one is selected.
inline uint16_t ToHalf(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  uint32_t normal = abs - 0x38000000u;
  normal = (normal + 0x0fffu + ((normal >> 13) & 1u)) >> 13;
  const uint32_t subnormal =
      std::bit_cast<uint32_t>(std::bit_cast<float>(abs) + 0.5f) - 0x3f000000u;
  uint32_t h = Select(abs < 0x38800000u, subnormal, normal);
  h = Select(abs >= 0x477ff000u, 0x7c00u, h);
  h = Select(abs > 0x7f800000u, 0x7e00u, h);
  return static_cast<uint16_t>(sign | h);
}

// HalfToFloat without branches.
inline float FromHalf(uint16_t bits) {
  const uint32_t h = bits;
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  const uint32_t normal = sign | ((exp + 112u) << 23) | (mant << 13);
  const uint32_t special = sign | 0x7f800000u | (mant << 13);
  // A subnormal half is mant·2^-24, exact in f32.
  const uint32_t subnormal =
      sign | std::bit_cast<uint32_t>(static_cast<float>(mant) * 5.9604644775390625e-8f);
  uint32_t out = Select(exp == 0, subnormal, normal);
  out = Select(exp == 0x1fu, special, out);
  return std::bit_cast<float>(out);
}

// FloatToBf16 without the NaN branch.
inline uint16_t ToBf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

inline float FromBf16(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

template <typename Src, typename Dst, typename Convert>
void CastLoop(const DeviceContext& ctx, const void* src, void* dst, int64_t n, Convert convert) {
  const Src* s = static_cast<const Src*>(src);
  Dst* d = static_cast<Dst*>(dst);
#pragma omp parallel for simd num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
  for (int64_t i = 0; i < n; ++i) d[i] = convert(s[i]);
}

}  // namespace

void Add(const DeviceContext& ctx, const float* a, const float* b, float* out, int64_t n) {
#pragma omp parallel for simd num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void Scale(const DeviceContext& ctx, float* t, float s, int64_t n) {
#pragma omp parallel for simd num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
  for (int64_t i = 0; i < n; ++i) t[i] *= s;
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
