// Register-blocked micro-kernels for the CPU flash attention (kernels/cpu/attention.cc): a
// small matrix product over tiles held in cache, and a vector exp. Internal to kernels/.
//
// Written with GCC vector extensions (16 floats = one AVX-512 register; two AVX2 registers
// elsewhere) so the register blocking is explicit rather than left to the auto-vectorizer,
// and the code stays free of ISA-specific intrinsics.
#pragma once

#include <cstdint>

namespace zt::cpu::tiles {

constexpr int kLanes = 16;
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t IVec __attribute__((vector_size(kLanes * sizeof(int32_t))));

inline Vec Load(const float* p) {
  Vec v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store(float* p, Vec v) { __builtin_memcpy(p, &v, sizeof(v)); }
// s − 0 rather than 0 + s: only the former is exactly s for every s (−0 + 0 is +0), so GCC
// can drop it and broadcast straight from memory.
inline Vec Splat(float s) { return s - Vec{}; }
inline Vec Max(Vec a, Vec b) { return a > b ? a : b; }

// Pins v to a register. Without it GCC folds each load of a B vector into every FMA that uses
// it, issuing MR times the loads; on a 64³ tile that costs ~20% (about 175 vs 218 GFLOP/s per
// core here).
inline void KeepInRegister(Vec& v) {
#if defined(__AVX512F__)
  asm("" : "+v"(v));
#else
  (void)v;
#endif
}

// exp(x) to about 2 ulp over the float range; exactly 0 below -87.3 (so -inf, a masked score,
// gives a probability of exactly 0); NaN stays NaN so an overflow upstream is not hidden. Cephes'
// expf: x = n·ln2 + r with |r| ≤ ln2/2, a degree-6 polynomial for e^r, and 2^n assembled in the
// exponent bits.
inline Vec Exp(Vec x) {
  const Vec lo = Splat(-87.3365447f);
  const Vec hi = Splat(88.3762626f);
  const Vec xc = Max(x, lo) < hi ? Max(x, lo) : hi;
  // Adding 1.5·2^23 rounds to the nearest integer in the float unit itself.
  const Vec shifter = Splat(12582912.0f);
  const Vec nf = (xc * 1.44269504088896341f + shifter) - shifter;
  Vec r = xc - nf * 0.693359375f;
  r = r - nf * -2.12194440e-4f;
  Vec p = Splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const IVec bits = (__builtin_convertvector(nf, IVec) + 127) << 23;
  Vec scale;
  __builtin_memcpy(&scale, &bits, sizeof(scale));
  const Vec y = p * scale;
  return x < lo ? Vec{} : (x == x ? y : x);
}

// How the A operand of TileMatMul is stored.
enum class ALayout : uint8_t {
  kRowMajor,    // a[i·lda + p] is A(i, p)
  kTransposed,  // a[p·lda + i] is A(i, p): A is read from a stored (k, m) matrix
};
enum class CInit : uint8_t { kOverwrite, kAccumulate };

struct TileMatMulArgs {
  int m = 0;
  int n = 0;
  int k = 0;
  const float* a = nullptr;
  int64_t lda = 0;
  ALayout a_layout = ALayout::kRowMajor;
  const float* b = nullptr;  // (k, n) row-major
  int64_t ldb = 0;
  float* c = nullptr;  // (m, n) row-major
  int64_t ldc = 0;
  CInit c_init = CInit::kOverwrite;
};

namespace internal {

inline float AElem(const TileMatMulArgs& t, int i, int p) {
  return t.a_layout == ALayout::kRowMajor ? t.a[i * t.lda + p] : t.a[p * t.lda + i];
}

// An MR × (NV·16) block of C in registers; each step of p broadcasts MR elements of A and
// loads NV vectors of B: MR·NV fused multiply-adds per MR + NV loads.
template <int MR, int NV, ALayout kLayout>
inline void Block(const TileMatMulArgs& t, int i0, int j0) {
  Vec acc[MR][NV];
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) {
      acc[r][v] =
          t.c_init == CInit::kAccumulate ? Load(t.c + (i0 + r) * t.ldc + j0 + v * kLanes) : Vec{};
    }
  }
  const float* b = t.b + j0;
  for (int p = 0; p < t.k; ++p) {
    Vec bv[NV];
    for (int v = 0; v < NV; ++v) {
      bv[v] = Load(b + p * t.ldb + v * kLanes);
      KeepInRegister(bv[v]);
    }
    for (int r = 0; r < MR; ++r) {
      const float s =
          kLayout == ALayout::kRowMajor ? t.a[(i0 + r) * t.lda + p] : t.a[p * t.lda + i0 + r];
      const Vec av = Splat(s);
      for (int v = 0; v < NV; ++v) acc[r][v] += av * bv[v];
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) Store(t.c + (i0 + r) * t.ldc + j0 + v * kLanes, acc[r][v]);
  }
}

template <int MR, ALayout kLayout>
inline void RowBlock(const TileMatMulArgs& t, int i0) {
  int j0 = 0;
  for (; j0 + 4 * kLanes <= t.n; j0 += 4 * kLanes) Block<MR, 4, kLayout>(t, i0, j0);
  if (j0 + 2 * kLanes <= t.n) {
    Block<MR, 2, kLayout>(t, i0, j0);
    j0 += 2 * kLanes;
  }
  if (j0 + kLanes <= t.n) {
    Block<MR, 1, kLayout>(t, i0, j0);
    j0 += kLanes;
  }
  // Columns past the last full vector (head sizes that are not a multiple of 16).
  for (int r = 0; r < MR; ++r) {
    for (int j = j0; j < t.n; ++j) {
      float acc = t.c_init == CInit::kAccumulate ? t.c[(i0 + r) * t.ldc + j] : 0.0f;
      for (int p = 0; p < t.k; ++p) acc += AElem(t, i0 + r, p) * t.b[p * t.ldb + j];
      t.c[(i0 + r) * t.ldc + j] = acc;
    }
  }
}

template <ALayout kLayout>
inline void Run(const TileMatMulArgs& t) {
  int i0 = 0;
  for (; i0 + 4 <= t.m; i0 += 4) RowBlock<4, kLayout>(t, i0);
  for (; i0 < t.m; ++i0) RowBlock<1, kLayout>(t, i0);
}

}  // namespace internal

// c (m, n) = or += A (m, k) · b (k, n). Every element of C is a sum over p in increasing
// order, so results do not depend on the blocking.
inline void TileMatMul(const TileMatMulArgs& t) {
  if (t.a_layout == ALayout::kRowMajor) {
    internal::Run<ALayout::kRowMajor>(t);
  } else {
    internal::Run<ALayout::kTransposed>(t);
  }
}

}  // namespace zt::cpu::tiles
