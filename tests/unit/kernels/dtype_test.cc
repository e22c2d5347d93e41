// kernels/dtype: the scalar f16/bf16 conversions every cast and every 16-bit buffer relies
// on. f16 is checked against the compiler's and the CPU's own conversions (IEEE round to
// nearest even), bf16 against a float64 rounding reference.
#include "kernels/dtype.h"

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace zt {
namespace {

bool HalfIsNan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }

uint16_t GccHalf(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

// The F16C instruction (vcvtps2ph) with round to nearest even, where the CPU has it.
__attribute__((target("f16c"))) uint16_t HardwareHalf(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// Floats where f16 rounding is easy to get wrong: the subnormal range and its ties, the
// normal/subnormal boundary, the overflow threshold 65520 (a tie that must go to inf) and
// mantissa ties at several exponents.
std::vector<float> HalfEdgeFloats() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          std::ldexp(1.0f, -24),  // smallest subnormal half
                          std::ldexp(1.0f, -25),  // tie between 0 and it: goes to 0
                          std::ldexp(1.5f, -25),
                          std::ldexp(3.0f, -25),  // tie between 1 and 2 subnormal ulps: 2
                          std::ldexp(5.0f, -25),  // tie between 2 and 3: 2
                          std::ldexp(1.0f, -26),
                          std::ldexp(1.0f, -14),  // smallest normal half
                          std::nextafter(std::ldexp(1.0f, -14), 0.0f),
                          std::ldexp(1023.5f, -24),  // tie between largest subnormal and 2^-14
                          65504.0f,
                          65519.99f,
                          65520.0f,
                          65536.0f,
                          1e10f,
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::denorm_min(),
                          1.0f + std::ldexp(1.0f, -11),  // tie, even is 1
                          1.0f + std::ldexp(3.0f, -11),  // tie, even is up
                          1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20),
                          2049.0f,
                          2051.0f,
                          0.1f,
                          1.0f / 3.0f};
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) v.push_back(-v[i]);
  return v;
}

TEST(DTypeTest, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = HalfToFloat(bits);
    const uint16_t back = FloatToHalf(f);
    if (HalfIsNan(bits)) {
      EXPECT_TRUE(std::isnan(f)) << "half 0x" << std::hex << h;
      EXPECT_TRUE(HalfIsNan(back)) << "half 0x" << std::hex << h;
      EXPECT_EQ(back & 0x8000u, bits & 0x8000u) << "half 0x" << std::hex << h;
    } else {
      EXPECT_EQ(back, bits) << "half 0x" << std::hex << h;
    }
  }
}

TEST(DTypeTest, HalfToFloatMatchesCompiler) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    _Float16 gh;
    std::memcpy(&gh, &bits, 2);
    const float want = static_cast<float>(gh);
    const float got = HalfToFloat(bits);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "half 0x" << std::hex << h;
    } else {
      EXPECT_EQ(FloatBits(got), FloatBits(want)) << "half 0x" << std::hex << h;
    }
  }
}

void ExpectHalfMatchesReferences(float f) {
  const uint16_t got = FloatToHalf(f);
  const uint16_t gcc = GccHalf(f);
  if (std::isnan(f)) {
    EXPECT_TRUE(HalfIsNan(got)) << "float bits 0x" << std::hex << FloatBits(f);
    return;
  }
  EXPECT_EQ(got, gcc) << "float " << f << " bits 0x" << std::hex << FloatBits(f);
  if (__builtin_cpu_supports("f16c")) {
    EXPECT_EQ(got, HardwareHalf(f)) << "float " << f << " bits 0x" << std::hex << FloatBits(f);
  }
}

TEST(DTypeTest, FloatToHalfMatchesCompilerAndHardwareOnEdges) {
  for (float f : HalfEdgeFloats()) ExpectHalfMatchesReferences(f);
  ExpectHalfMatchesReferences(std::numeric_limits<float>::quiet_NaN());
}

TEST(DTypeTest, FloatToHalfMatchesCompilerAndHardwareOnRandomFloats) {
  std::mt19937 rng(7);
  // Random bit patterns cover every exponent; most are far outside f16's range.
  for (int i = 0; i < 200000; ++i) ExpectHalfMatchesReferences(BitsToFloat(rng()));
  // Random values inside f16's range, and exact ties half-way between neighbouring halves.
  std::uniform_real_distribution<float> in_range(-70000.0f, 70000.0f);
  std::uniform_int_distribution<uint32_t> any_half(0, 0x7bfe);
  for (int i = 0; i < 200000; ++i) {
    ExpectHalfMatchesReferences(in_range(rng) * std::ldexp(1.0f, -static_cast<int>(rng() % 30)));
    const uint16_t h = static_cast<uint16_t>(any_half(rng));
    const float tie = 0.5f * (HalfToFloat(h) + HalfToFloat(static_cast<uint16_t>(h + 1)));
    ExpectHalfMatchesReferences(tie);
    ExpectHalfMatchesReferences(-tie);
  }
}

// Round |f| to bf16 in float64: pick the nearer of the two bf16 neighbours, the even one on a
// tie. The neighbour above the largest finite bf16 is 2^128, which encodes as inf.
uint16_t ReferenceBf16(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = u & 0x80000000u;
  const uint32_t lo_bits = (u & 0x7fffffffu) & 0xffff0000u;
  const uint32_t hi_bits = lo_bits + 0x10000u;
  const double a = std::abs(static_cast<double>(f));
  const double lo = static_cast<double>(BitsToFloat(lo_bits));
  const double hi =
      hi_bits == 0x7f800000u ? std::ldexp(1.0, 128) : static_cast<double>(BitsToFloat(hi_bits));
  uint32_t pick;
  if (a - lo < hi - a) {
    pick = lo_bits;
  } else if (a - lo > hi - a) {
    pick = hi_bits;
  } else {
    pick = (lo_bits & 0x10000u) == 0 ? lo_bits : hi_bits;
  }
  return static_cast<uint16_t>((sign | pick) >> 16);
}

TEST(DTypeTest, FloatToBf16MatchesFloat64Rounding) {
  std::mt19937 rng(11);
  std::vector<float> values = {0.0f,
                               -0.0f,
                               1.0f,
                               std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::min()};
  for (int i = 0; i < 300000; ++i) {
    const uint32_t u = rng();
    if ((u & 0x7f800000u) == 0x7f800000u) continue;  // inf/NaN: checked below
    values.push_back(BitsToFloat(u));
    // A tie: exactly half-way between two bf16 values.
    values.push_back(BitsToFloat((u & 0xffff0000u) | 0x8000u));
  }
  for (float f : values) {
    ASSERT_EQ(FloatToBf16(f), ReferenceBf16(f)) << "float bits 0x" << std::hex << FloatBits(f);
  }
}

TEST(DTypeTest, Bf16KeepsInfAndNan) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToBf16(inf), 0x7f80u);
  EXPECT_EQ(FloatToBf16(-inf), 0xff80u);
  for (uint32_t payload : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu}) {
    const float back = Bf16ToFloat(FloatToBf16(BitsToFloat(payload)));
    EXPECT_TRUE(std::isnan(back)) << "NaN bits 0x" << std::hex << payload;
  }
}

}  // namespace
}  // namespace zt
