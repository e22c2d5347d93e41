// Loading and storing f32/bf16/f16 elements in f32 for the CPU kernels.
//
// Mixed precision on the CPU stores 16-bit values as 16 bits and computes in f32: an op loads
// each element to f32, computes exactly as its f32 path does, and rounds once (to nearest
// even) when it stores. The conversions here are branch-free copies of dtype.h's scalar ones
// (those are out of line or branchy, so a loop over them stays scalar); elementwise_test
// compares the two bit for bit. Row helpers convert whole rows so that an op's f32 inner loop
// runs unchanged on a row buffer; when a tensor is already f32 they hand back its own memory,
// so the all-f32 path does no copy and gives the bits it always gave.
#pragma once

#include <bit>
#include <cstdint>
#include <vector>

#include "kernels/dtype.h"

namespace zt::cpu {

// c ? a : b as a bit blend. A ternary lets the compiler sink the float arithmetic of the
// unused arm into a branch (it may not speculate float ops that could trap), and a loop with
// a branch does not vectorize.
inline uint32_t SelectBits(bool c, uint32_t a, uint32_t b) {
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
  uint32_t h = SelectBits(abs < 0x38800000u, subnormal, normal);
  h = SelectBits(abs >= 0x477ff000u, 0x7c00u, h);
  h = SelectBits(abs > 0x7f800000u, 0x7e00u, h);
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
  uint32_t out = SelectBits(exp == 0, subnormal, normal);
  out = SelectBits(exp == 0x1fu, special, out);
  return std::bit_cast<float>(out);
}

// FloatToBf16 without the NaN branch.
inline uint16_t ToBf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet = (u >> 16) | 0x40u;
  return static_cast<uint16_t>(SelectBits((u & 0x7fffffffu) > 0x7f800000u, quiet, rounded));
}

inline float FromBf16(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// A counter-based hash of (seed, index): SplitMix64's finalizer. Each element's random bits
// depend only on its index, never on which thread rounds it or in what order.
inline uint64_t HashIndex(uint64_t seed, uint64_t index) {
  uint64_t z = seed + (index + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// f32 -> bf16 rounding the magnitude up with probability equal to the discarded fraction of
// an ulp, so the expected result is the f32 value. Adding 16 random bits below the kept ones
// carries into them exactly when the random value reaches 2^16 minus the discarded bits. inf
// stays inf (the carry stays inside the dropped bits), NaN stays a quiet NaN.
inline uint16_t ToBf16Stochastic(float f, uint64_t seed, uint64_t index) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t noise = static_cast<uint32_t>(HashIndex(seed, index)) & 0xffffu;
  const uint32_t rounded = (u + noise) >> 16;
  const uint32_t quiet = (u >> 16) | 0x40u;
  // The largest finite magnitudes may carry into the exponent and give inf, as rounding up
  // past the largest bf16 does; an inf input has no fraction bits and never carries.
  return static_cast<uint16_t>(SelectBits((u & 0x7fffffffu) > 0x7f800000u, quiet, rounded));
}

// The floating-point storage dtypes an op accepts for its data tensors.
inline bool IsFloatDType(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16;
}

// Element i of a buffer of dtype t, as f32.
inline float Load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kBF16:
      return FromBf16(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16:
      return FromHalf(static_cast<const uint16_t*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

// Element i of a buffer of dtype t set to x, rounded to nearest even.
inline void Store(void* p, DType t, int64_t i, float x) {
  switch (t) {
    case DType::kBF16:
      static_cast<uint16_t*>(p)[i] = ToBf16(x);
      return;
    case DType::kF16:
      static_cast<uint16_t*>(p)[i] = ToHalf(x);
      return;
    default:
      static_cast<float*>(p)[i] = x;
  }
}

// dst[0, n) = elements [offset, offset + n) of a buffer of dtype t, as f32.
inline void LoadRow(const void* base, DType t, int64_t offset, int64_t n, float* dst) {
  if (t == DType::kBF16) {
    const uint16_t* s = static_cast<const uint16_t*>(base) + offset;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = FromBf16(s[i]);
  } else if (t == DType::kF16) {
    const uint16_t* s = static_cast<const uint16_t*>(base) + offset;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = FromHalf(s[i]);
  } else {
    const float* s = static_cast<const float*>(base) + offset;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = s[i];
  }
}

// Elements [offset, offset + n) of a buffer of dtype t = src[0, n), each rounded once.
inline void StoreRow(const float* src, int64_t n, void* base, DType t, int64_t offset) {
  if (t == DType::kBF16) {
    uint16_t* d = static_cast<uint16_t*>(base) + offset;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) d[i] = ToBf16(src[i]);
  } else if (t == DType::kF16) {
    uint16_t* d = static_cast<uint16_t*>(base) + offset;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) d[i] = ToHalf(src[i]);
  } else {
    float* d = static_cast<float*>(base) + offset;
    if (d == src) return;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) d[i] = src[i];
  }
}

// Per-thread f32 scratch rows for converting 16-bit rows: grown on first use and kept, so the
// step loop allocates nothing once every op has run once. `slot` tells apart the rows one
// thread holds at the same time (inp, dout, ...).
inline float* ScratchRow(int slot, int64_t n) {
  constexpr int kSlots = 8;
  thread_local std::vector<float> rows[kSlots];
  std::vector<float>& row = rows[slot];
  if (static_cast<int64_t>(row.size()) < n) row.resize(n);
  return row.data();
}

// A read-only f32 view of elements [offset, offset + n): the buffer itself when it is f32,
// else the row converted into the calling thread's scratch `slot`.
inline const float* ReadRow(const void* base, DType t, int64_t offset, int64_t n, int slot) {
  if (t == DType::kF32) return static_cast<const float*>(base) + offset;
  float* row = ScratchRow(slot, n);
  LoadRow(base, t, offset, n, row);
  return row;
}

// Where to compute elements [offset, offset + n) of an output in f32: the buffer itself when
// it is f32, else scratch `slot` (preloaded with the current values when `load`, for +=).
// FinishRow stores the scratch back, rounded once.
inline float* WriteRow(void* base, DType t, int64_t offset, int64_t n, int slot, bool load) {
  if (t == DType::kF32) return static_cast<float*>(base) + offset;
  float* row = ScratchRow(slot, n);
  if (load) LoadRow(base, t, offset, n, row);
  return row;
}
inline void FinishRow(const float* row, int64_t n, void* base, DType t, int64_t offset) {
  if (t != DType::kF32) StoreRow(row, n, base, t, offset);
}

}  // namespace zt::cpu
