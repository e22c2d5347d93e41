// Device copies of the CPU's bit-level conversions (kernels/cpu/load_store.h, kernels/dtype.h):
// f32 <-> bf16/f16 rounding to nearest even with the CPU's NaN rule (sign and payload kept,
// quietened), the stochastic bf16 rounding with its counter hash, and the split fp32 master.
// The element-wise CUDA ops use these instead of cuda_bf16.h's conversions (which return a
// canonical NaN) so that a GPU cast, add or split gives the CPU's bits exactly; the GPU tests
// compare the two for equality. The CPU functions are plain inline C++ (not __host__
// __device__), hence the copies: a change there must be made here too, and the equality tests
// catch a drift.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace zt::cuda::bits {

// c ? a : b; the device has a select instruction, so this is a plain ternary.
__device__ __forceinline__ uint32_t Select(bool c, uint32_t a, uint32_t b) { return c ? a : b; }

// load_store.h's ToHalf.
__device__ __forceinline__ uint16_t ToHalf(float f) {
  const uint32_t u = __float_as_uint(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  uint32_t normal = abs - 0x38000000u;
  normal = (normal + 0x0fffu + ((normal >> 13) & 1u)) >> 13;
  // __fadd_rn: an IEEE add that is never contracted into anything else.
  const uint32_t subnormal = __float_as_uint(__fadd_rn(__uint_as_float(abs), 0.5f)) - 0x3f000000u;
  uint32_t h = Select(abs < 0x38800000u, subnormal, normal);
  h = Select(abs >= 0x477ff000u, 0x7c00u, h);
  h = Select(abs > 0x7f800000u, 0x7e00u, h);
  return static_cast<uint16_t>(sign | h);
}

// load_store.h's FromHalf.
__device__ __forceinline__ float FromHalf(uint16_t bits) {
  const uint32_t h = bits;
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  const uint32_t normal = sign | ((exp + 112u) << 23) | (mant << 13);
  const uint32_t special = sign | 0x7f800000u | (mant << 13);
  // mant · 2^-24, exact in f32.
  const uint32_t subnormal =
      sign | __float_as_uint(__fmul_rn(static_cast<float>(mant), 5.9604644775390625e-8f));
  uint32_t out = Select(exp == 0, subnormal, normal);
  out = Select(exp == 0x1fu, special, out);
  return __uint_as_float(out);
}

// load_store.h's ToBf16.
__device__ __forceinline__ uint16_t ToBf16(float f) {
  const uint32_t u = __float_as_uint(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet = (u >> 16) | 0x40u;
  return static_cast<uint16_t>(Select((u & 0x7fffffffu) > 0x7f800000u, quiet, rounded));
}

__device__ __forceinline__ float FromBf16(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

// load_store.h's HashIndex (SplitMix64's finalizer of seed + (index + 1) · golden ratio).
__device__ __forceinline__ uint64_t HashIndex(uint64_t seed, uint64_t index) {
  uint64_t z = seed + (index + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// load_store.h's ToBf16Stochastic.
__device__ __forceinline__ uint16_t ToBf16Stochastic(float f, uint64_t seed, uint64_t index) {
  const uint32_t u = __float_as_uint(f);
  const uint32_t noise = static_cast<uint32_t>(HashIndex(seed, index)) & 0xffffu;
  const uint32_t rounded = (u + noise) >> 16;
  const uint32_t quiet = (u >> 16) | 0x40u;
  return static_cast<uint16_t>(Select((u & 0x7fffffffu) > 0x7f800000u, quiet, rounded));
}

// dtype.h's SplitMaster: high = nearest bf16 (ties away from zero), low = the remainder.
__device__ __forceinline__ void SplitMaster(float m, uint16_t* high, int16_t* low) {
  const uint32_t u = __float_as_uint(m);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    *high = static_cast<uint16_t>((u >> 16) | 0x40u);
    *low = 0;
    return;
  }
  const uint32_t h = (u + 0x8000u) >> 16;
  *high = static_cast<uint16_t>(h);
  *low = static_cast<int16_t>(static_cast<uint16_t>(u - (h << 16)));
}

// dtype.h's JoinMaster.
__device__ __forceinline__ float JoinMaster(uint16_t high, int16_t low) {
  return __uint_as_float((static_cast<uint32_t>(high) << 16) +
                         static_cast<uint32_t>(static_cast<int32_t>(low)));
}

// Storage type <-> f32 with the rules above, for kernels templated on the storage type.
__device__ __forceinline__ float Widen(float x) { return x; }
__device__ __forceinline__ float Widen(__nv_bfloat16 x) {
  return FromBf16(__bfloat16_as_ushort(x));
}
__device__ __forceinline__ float Widen(__half x) { return FromHalf(__half_as_ushort(x)); }

template <typename T>
__device__ __forceinline__ T Narrow(float x);
template <>
__device__ __forceinline__ float Narrow<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 Narrow<__nv_bfloat16>(float x) {
  return __ushort_as_bfloat16(ToBf16(x));
}
template <>
__device__ __forceinline__ __half Narrow<__half>(float x) {
  return __ushort_as_half(ToHalf(x));
}

}  // namespace zt::cuda::bits
