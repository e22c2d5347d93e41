// Element types of tensors and the scalar conversions between them.
//
// 16-bit floats are stored as their bit patterns (uint16_t). Conversions from f32 round to
// nearest, ties to even, as GPUs do, so CPU runs see the same rounding and overflow a GPU
// would: f16 overflows to ±inf above 65504, bf16 keeps f32's exponent range.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace zt {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kI32,  // token ids, targets
  kU8,   // raw bytes (quantized codes)
  kI16,  // the low halves of split fp32 master weights (SplitMaster)
};

// Bytes per element.
constexpr int64_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
      return 2;
    case DType::kU8:
      return 1;
  }
  return 0;
}

const char* DTypeName(DType t);

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// f32 -> bf16, round to nearest even. NaN stays a (quiet) NaN.
inline uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float Bf16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

// A split fp32 master weight: its high 16 bits are the bf16 parameter the model computes
// with, its low 16 bits (relative to that) an int16, so a 16-bit model keeps exact fp32
// master weights for 2 bytes per parameter instead of 4. The bf16 half is the nearest bf16
// (ties away from zero: rounding the bit pattern up on a tie keeps the remainder inside
// int16, where ties to even would need one more value), and JoinMaster(SplitMaster(m)) is m
// bit for bit — a NaN excepted, which stays a NaN.
struct SplitMasterBits {
  uint16_t high;  // bf16
  int16_t low;
};
inline SplitMasterBits SplitMaster(float m) {
  const uint32_t u = FloatBits(m);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return {static_cast<uint16_t>((u >> 16) | 0x40u), 0};
  }
  const uint32_t high = (u + 0x8000u) >> 16;
  return {static_cast<uint16_t>(high),
          static_cast<int16_t>(static_cast<uint16_t>(u - (high << 16)))};
}
inline float JoinMaster(uint16_t high, int16_t low) {
  return BitsToFloat((static_cast<uint32_t>(high) << 16) +
                     static_cast<uint32_t>(static_cast<int32_t>(low)));
}

// f32 -> IEEE binary16, round to nearest even, subnormals kept, overflow to ±inf.
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);

}  // namespace zt
