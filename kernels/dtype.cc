#include "kernels/dtype.h"

namespace zt {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kI32:
      return "i32";
    case DType::kU8:
      return "u8";
    case DType::kI16:
      return "i16";
  }
  return "?";
}

uint16_t FloatToHalf(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to ≥ 65520: inf
  if (abs < 0x38800000u) {
    // Below the smallest normal half (2^-14): a subnormal or zero. Adding 0.5 (2^-1) puts the
    // half-subnormal bits at the bottom of the f32 mantissa, and the FPU's own
    // round-to-nearest-even does the rounding.
    const float shifted = BitsToFloat(abs) + 0.5f;
    return sign | static_cast<uint16_t>(FloatBits(shifted) - 0x3f000000u);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits.
  uint32_t r = abs - 0x38000000u;
  r += 0x0fffu + ((r >> 13) & 1u);
  return sign | static_cast<uint16_t>(r >> 13);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mant << 13));  // inf/NaN
  if (exp == 0) {
    // Zero or subnormal: value = mant · 2^-24, exact in f32.
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace zt
