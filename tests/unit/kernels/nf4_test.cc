// kernels/nf4: the level table against the published values and against the normal quantiles
// it is built from, the storage layout and its overhead, nearest-level codes against a float64
// brute-force search, the per-block error bounds (single and double-quantized absmax), the
// nibble order, partial blocks and odd sizes, thread-count determinism, errors.
#include "kernels/nf4.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/quantization.h"
#include "tests/unit/kernels/nf4_buffers.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using testing::Nf4Buffers;

Tensor Flat(std::vector<float>& v) {
  return Tensor(v.data(), DType::kF32, {static_cast<int64_t>(v.size())});
}

// Normal values whose scale changes from block to block (log-uniform over two decades), as
// the rows of a trained weight matrix do: the double quantization of absmax then sees a
// spread of values, not a constant.
std::vector<float> WeightLikeVector(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> exponent(-3.0, -1.0);
  std::vector<float> v(n);
  double sigma = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i % kNf4Block == 0) sigma = std::pow(10.0, exponent(rng));
    v[i] = static_cast<float>(sigma * normal(rng));
  }
  return v;
}

double LargestHalfGap(const float* levels, int count) {
  double gap = 0;
  for (int i = 1; i < count; ++i) gap = std::max(gap, double{levels[i]} - levels[i - 1]);
  return gap / 2;
}

// The index of the level nearest to r, in float64.
int BruteForceNearest(double r) {
  const std::array<float, 16>& levels = Nf4Levels();
  int best = 0;
  for (int k = 1; k < 16; ++k) {
    if (std::abs(levels[k] - r) < std::abs(levels[best] - r)) best = k;
  }
  return best;
}

uint8_t CodeAt(const std::vector<uint8_t>& codes, int64_t i) {
  return (i % 2 == 0) ? codes[i / 2] >> 4 : codes[i / 2] & 0x0F;
}

// The standard normal's quantile, by bisection on its CDF in float64 (to ~1e-15).
double NormalQuantile(double p) {
  double lo = -10, hi = 10;
  for (int it = 0; it < 200; ++it) {
    const double mid = (lo + hi) / 2;
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

TEST(Nf4LevelsTest, EqualThePublishedValues) {
  // QLoRA (Dettmers et al. 2023), appendix E; bitsandbytes' NF4 table.
  const double published[16] = {-1.0,
                                -0.6961928009986877,
                                -0.5250730514526367,
                                -0.39491748809814453,
                                -0.28444138169288635,
                                -0.18477343022823334,
                                -0.09105003625154495,
                                0.0,
                                0.07958029955625534,
                                0.16093020141124725,
                                0.24611230194568634,
                                0.33791524171829224,
                                0.44070982933044434,
                                0.5626170039176941,
                                0.7229568362236023,
                                1.0};
  for (int k = 0; k < 16; ++k) EXPECT_EQ(Nf4Levels()[k], static_cast<float>(published[k])) << k;
  EXPECT_EQ(Nf4Levels()[kNf4ZeroCode], 0.0f);
}

// The construction the paper describes: 8 positive quantiles at linspace(δ, ½, 9)[:-1], 7
// negative ones at linspace(δ, ½, 8)[:-1], an exact zero, all over the largest.
TEST(Nf4LevelsTest, AreNormalQuantilesWithAnExactZero) {
  const double offset = 0.9677083;
  std::vector<double> v = {0.0};
  for (int i = 0; i < 8; ++i) v.push_back(NormalQuantile(offset + (0.5 - offset) * i / 8));
  for (int i = 0; i < 7; ++i) v.push_back(-NormalQuantile(offset + (0.5 - offset) * i / 7));
  std::sort(v.begin(), v.end());
  const double top = v.back();
  for (int k = 0; k < 16; ++k) {
    // The published values were computed with f32 probabilities (linspace in float32):
    // they differ from the float64 construction by up to 1.1e-7.
    EXPECT_NEAR(Nf4Levels()[k], v[k] / top, 2e-7) << k;
  }
}

TEST(Nf4LayoutTest, SizesAreExact) {
  // 65,536 parameters: 1,024 blocks of 64, 4 groups of 256 blocks.
  const Nf4Layout dq = Nf4LayoutFor(65536, Nf4Absmax::kDoubleQuantized);
  EXPECT_EQ(dq.code_bytes, 32768);
  EXPECT_EQ(dq.blocks, 1024);
  EXPECT_EQ(dq.absmax_groups, 4);
  EXPECT_EQ(dq.total_bytes, 32768 + 1024 + 4 * 4 + 4);
  const Nf4Layout single = Nf4LayoutFor(65536, Nf4Absmax::kF32);
  EXPECT_EQ(single.absmax_groups, 0);
  EXPECT_EQ(single.total_bytes, 32768 + 4 * 1024);
  // Odd sizes: a partial block, a half-used last byte.
  const Nf4Layout odd = Nf4LayoutFor(129, Nf4Absmax::kDoubleQuantized);
  EXPECT_EQ(odd.code_bytes, 65);
  EXPECT_EQ(odd.blocks, 3);
  EXPECT_EQ(odd.absmax_groups, 1);
  EXPECT_EQ(odd.total_bytes, 65 + 3 + 4 + 4);
}

// The paper's arithmetic: 8/64 + 32/(64·256) = 0.127 bits per parameter instead of 32/64.
TEST(Nf4LayoutTest, DoubleQuantizationOverheadIsAboutAnEighthOfABit) {
  const int64_t n = int64_t{4096} * 4096;
  const auto overhead_bits = [n](Nf4Absmax format) {
    const Nf4Layout l = Nf4LayoutFor(n, format);
    return 8.0 * static_cast<double>(l.total_bytes - l.code_bytes) / static_cast<double>(n);
  };
  EXPECT_EQ(overhead_bits(Nf4Absmax::kF32), 0.5);
  // The one f32 mean adds 32 bits to the whole tensor: 2e-6 bits per parameter here.
  EXPECT_NEAR(overhead_bits(Nf4Absmax::kDoubleQuantized), 8.0 / 64 + 32.0 / (64 * 256), 1e-5);
  EXPECT_LT(overhead_bits(Nf4Absmax::kDoubleQuantized), 0.128);
}

// Level k times a power of two reads back exactly; codes pack high nibble first.
TEST(Nf4QuantizeTest, LevelsRoundTripExactlyAndPackHighNibbleFirst) {
  std::vector<float> src(64), back(64);
  for (int i = 0; i < 64; ++i) src[i] = Nf4Levels()[i % 16] * 2.0f;
  Nf4Buffers q(64, Nf4Absmax::kF32);
  const DeviceContext ctx = CpuContext(1);
  ASSERT_TRUE(Nf4Quantize(ctx, {.src = Flat(src), .dst = q.View()}).ok());
  EXPECT_EQ(q.absmax_f32()[0], 2.0f);
  for (int j = 0; j < 32; ++j) {
    const int hi = (2 * j) % 16, lo = (2 * j + 1) % 16;
    EXPECT_EQ(q.codes()[j], hi << 4 | lo) << "byte " << j;
  }
  ASSERT_TRUE(Nf4Dequantize(ctx, {.src = q.View(), .dst = Flat(back)}).ok());
  EXPECT_TRUE(testing::SameBits(back, src));
}

// Codes against a float64 brute-force search, the exact absmax, and the error bound: with the
// exact absmax A of a block, x reads back as the level nearest to x / A times A, so its error
// is at most half the largest gap between levels (0.152, between −1 and −0.696) times A. The
// size is odd and not a multiple of 64.
TEST(Nf4QuantizeTest, NearestLevelAndErrorBoundWithF32Absmax) {
  const int64_t n = 64 * 50 + 37;
  std::vector<float> src = WeightLikeVector(n, 3), back(n);
  Nf4Buffers q(n, Nf4Absmax::kF32);
  const DeviceContext ctx = CpuContext(2);
  ASSERT_TRUE(Nf4Quantize(ctx, {.src = Flat(src), .dst = q.View()}).ok());
  ASSERT_TRUE(Nf4Dequantize(ctx, {.src = q.View(), .dst = Flat(back)}).ok());
  const double half_gap = LargestHalfGap(Nf4Levels().data(), 16);
  int ties = 0;
  for (int64_t b = 0; b < NumQuantBlocks(n, kNf4Block); ++b) {
    const int64_t begin = b * kNf4Block, end = std::min(n, begin + kNf4Block);
    double amax = 0;
    for (int64_t i = begin; i < end; ++i) amax = std::max(amax, std::abs(double{src[i]}));
    ASSERT_EQ(q.absmax_f32()[b], amax) << "block " << b;
    for (int64_t i = begin; i < end; ++i) {
      const double r = src[i] / amax;
      const int best = BruteForceNearest(r);
      if (CodeAt(q.codes(), i) != best) {
        // Only where the f32 rounding of x / A (2^-24 relative) crosses a midpoint.
        ++ties;
        EXPECT_EQ(std::abs(int{CodeAt(q.codes(), i)} - best), 1) << "element " << i;
      }
      // Plus the f32 roundings of x / A and level · A: 1e-7 of A.
      EXPECT_LE(std::abs(back[i] - double{src[i]}), (half_gap + 1e-7) * amax) << "element " << i;
      EXPECT_EQ(back[i], Nf4Levels()[CodeAt(q.codes(), i)] * q.absmax_f32()[b]) << "element " << i;
    }
  }
  EXPECT_LE(ties, 2);
  // n is odd: the last byte's low nibble is unused and zero.
  EXPECT_EQ(q.codes().back() & 0x0F, 0);
}

// Double quantization: the mean μ of the exact absmax values a_b is subtracted; each group of
// 256 blocks stores s = max |a_b − μ| and each block the signed dynamic map code nearest to
// (a_b − μ) / s. A_b = fma(map[k_b], s, μ) is then within half the map's largest gap (0.007)
// of s from a_b, and every element within half the NF4 gap of A_b plus |a_b − A_b| (its code
// is the nearest representable value, no farther than the level nearest to x / a_b read with
// A_b).
TEST(Nf4QuantizeTest, DoubleQuantizedAbsmaxAndElementErrorsBounded) {
  const int64_t n = 64 * 600 + 10;  // 601 blocks: groups of 256, 256 and 89
  std::vector<float> src = WeightLikeVector(n, 11), back(n);
  Nf4Buffers q(n, Nf4Absmax::kDoubleQuantized);
  const DeviceContext ctx = CpuContext(2);
  ASSERT_TRUE(Nf4Quantize(ctx, {.src = Flat(src), .dst = q.View()}).ok());
  ASSERT_TRUE(Nf4Dequantize(ctx, {.src = q.View(), .dst = Flat(back)}).ok());

  const int64_t blocks = NumQuantBlocks(n, kNf4Block);
  std::vector<double> amax(blocks, 0.0);
  double sum = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t i = b * kNf4Block; i < std::min(n, (b + 1) * kNf4Block); ++i) {
      amax[b] = std::max(amax[b], std::abs(double{src[i]}));
    }
    sum += amax[b];
  }
  // The mean in float64, rounded once.
  EXPECT_EQ(q.offset(), static_cast<float>(sum / blocks));
  const double mean = q.offset();
  const std::array<float, 256>& map = DynamicMapSigned();
  const double map_half_gap = LargestHalfGap(map.data(), 256);
  const double nf4_half_gap = LargestHalfGap(Nf4Levels().data(), 16);
  ASSERT_EQ(static_cast<int64_t>(q.scale().size()), 3);
  for (int64_t g = 0; g < 3; ++g) {
    double s = 0;
    for (int64_t b = g * 256; b < std::min(blocks, (g + 1) * 256); ++b) {
      s = std::max(s, std::abs(amax[b] - mean));
    }
    // |a_b − μ| in f32: one rounding.
    EXPECT_NEAR(q.scale()[g], s, 1e-7 * s) << "group " << g;
  }
  int off_by_one = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const double s = q.scale()[b / 256];
    // The code is the map value nearest to (a_b − μ) / s (float64 brute force); only where the
    // f32 rounding of the ratio crosses a midpoint may it be the neighbour.
    const double r = (amax[b] - mean) / s;
    int best = 0;
    for (int c = 1; c < 256; ++c) {
      if (std::abs(map[c] - r) < std::abs(map[best] - r)) best = c;
    }
    if (q.absmax_codes()[b] != best) {
      ++off_by_one;
      EXPECT_EQ(std::abs(int{q.absmax_codes()[b]} - best), 1) << "block " << b;
    }
    const double a = std::fma(map[q.absmax_codes()[b]], q.scale()[b / 256], q.offset());
    const double a_error = std::abs(a - amax[b]);
    // Plus the f32 roundings of a_b − μ, the ratio and the fma: 2^-22 of |μ| + s.
    EXPECT_LE(a_error, map_half_gap * s + 2.4e-7 * (std::abs(mean) + s)) << "block " << b;
    for (int64_t i = b * kNf4Block; i < std::min(n, (b + 1) * kNf4Block); ++i) {
      EXPECT_LE(std::abs(back[i] - double{src[i]}),
                nf4_half_gap * amax[b] + a_error + 2e-7 * amax[b])
          << "element " << i;
    }
  }
  EXPECT_LE(off_by_one, 2);
}

TEST(Nf4QuantizeTest, ZeroBlockAndSingleElement) {
  std::vector<float> src(65, 0.0f), back(65, 1.0f);
  src[64] = -3.0f;  // the second block holds one element
  for (Nf4Absmax format : {Nf4Absmax::kF32, Nf4Absmax::kDoubleQuantized}) {
    Nf4Buffers q(65, format);
    const DeviceContext ctx = CpuContext(1);
    ASSERT_TRUE(Nf4Quantize(ctx, {.src = Flat(src), .dst = q.View()}).ok());
    for (int i = 0; i < 64; ++i) EXPECT_EQ(CodeAt(q.codes(), i), kNf4ZeroCode) << i;
    EXPECT_EQ(CodeAt(q.codes(), 64), 0);  // −1 · absmax
    ASSERT_TRUE(Nf4Dequantize(ctx, {.src = q.View(), .dst = Flat(back)}).ok());
    for (int i = 0; i < 64; ++i) EXPECT_EQ(back[i], 0.0f) << i;
    // Two blocks with absmax 0 and 3: μ = 1.5, s = 1.5, codes of −1 and +1. +1 is in the
    // signed map; the zero block reads back −0.99297·1.5 + 1.5 = 0.0105, harmless on zeros.
    EXPECT_NEAR(back[64], -3.0, format == Nf4Absmax::kF32 ? 0.0 : 1e-6);
  }
}

TEST(Nf4QuantizeTest, SameBytesForAnyThreadCount) {
  const int64_t n = 1 << 17;
  std::vector<float> src = WeightLikeVector(n, 5);
  Nf4Buffers one(n, Nf4Absmax::kDoubleQuantized), two(n, Nf4Absmax::kDoubleQuantized);
  ASSERT_TRUE(Nf4Quantize(CpuContext(1), {.src = Flat(src), .dst = one.View()}).ok());
  ASSERT_TRUE(Nf4Quantize(CpuContext(2), {.src = Flat(src), .dst = two.View()}).ok());
  EXPECT_EQ(one.codes(), two.codes());
  EXPECT_EQ(one.absmax_codes(), two.absmax_codes());
  EXPECT_EQ(one.scale(), two.scale());
  EXPECT_EQ(one.offset(), two.offset());
}

TEST(Nf4QuantizeTest, ErrorsNameTheBufferAndTheRule) {
  const DeviceContext ctx = CpuContext(1);
  std::vector<float> src(100, 0.5f);
  src[42] = std::nanf("");
  Nf4Buffers q(100, Nf4Absmax::kDoubleQuantized);
  absl::Status s = Nf4Quantize(ctx, {.src = Flat(src), .dst = q.View()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("src[42]"), std::string::npos) << s;

  src[42] = 0.5f;
  Nf4Buffers other(99, Nf4Absmax::kDoubleQuantized);
  s = Nf4Quantize(ctx, {.src = Flat(src), .dst = other.View()});
  EXPECT_NE(s.message().find("dst.numel is 99"), std::string::npos) << s;

  Nf4Buffers f32(100, Nf4Absmax::kF32), dq(100, Nf4Absmax::kDoubleQuantized);
  Nf4Tensor mixed = f32.View();
  mixed.absmax_scale = dq.View().absmax_scale;
  s = Nf4Quantize(ctx, {.src = Flat(src), .dst = mixed});
  EXPECT_NE(s.message().find("absmax_scale"), std::string::npos) << s;

  Nf4Tensor short_codes = dq.View();
  short_codes.codes = short_codes.codes.Slice(0, 49);
  s = Nf4Quantize(ctx, {.src = Flat(src), .dst = short_codes});
  EXPECT_NE(s.message().find("dst.codes"), std::string::npos) << s;
  EXPECT_NE(s.message().find("needs 50"), std::string::npos) << s;

  Nf4Tensor empty = dq.View();
  empty.numel = 0;
  s = Nf4Dequantize(ctx, {.src = empty, .dst = Flat(src)});
  EXPECT_NE(s.message().find("src.numel is 0"), std::string::npos) << s;
}

}  // namespace
}  // namespace zt
