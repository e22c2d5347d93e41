// kernels/quantization: the dynamic maps' documented structure, block-wise quantization
// against a float64 brute-force nearest search, the error bound, exact round trips of map
// values, partial blocks, thread-count determinism, errors.
#include "kernels/quantization.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using testing::RandomVector;
using testing::SameBits;

Tensor Flat(std::vector<float>& v) {
  return Tensor(v.data(), DType::kF32, {static_cast<int64_t>(v.size())});
}
Tensor Flat(std::vector<uint8_t>& v) {
  return Tensor(v.data(), DType::kU8, {static_cast<int64_t>(v.size())});
}

const std::array<float, 256>& MapOf(DynamicMap map) {
  return map == DynamicMap::kSigned ? DynamicMapSigned() : DynamicMapUnsigned();
}

// The largest distance between neighbouring map values.
double LargestGap(const std::array<float, 256>& map) {
  double gap = 0;
  for (size_t i = 1; i < map.size(); ++i) gap = std::max(gap, double{map[i]} - map[i - 1]);
  return gap;
}

// Values whose magnitudes spread over seven decades (log-uniform), random signs unless
// `non_negative`: the range the dynamic map is built for, small values included.
std::vector<float> WideRangeVector(size_t n, uint32_t seed, bool non_negative) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> exponent(-7.0, 0.0);
  std::bernoulli_distribution negative(non_negative ? 0.0 : 0.5);
  std::vector<float> v(n);
  for (float& x : v)
    x = static_cast<float>((negative(rng) ? -3.0 : 3.0) * std::pow(10.0, exponent(rng)));
  return v;
}

TEST(DynamicMapTest, SignedMapHasTheDocumentedStructure) {
  const std::array<float, 256>& map = DynamicMapSigned();
  for (size_t i = 1; i < map.size(); ++i) ASSERT_LT(map[i - 1], map[i]) << "index " << i;
  EXPECT_EQ(map[kDynamicSignedZeroCode], 0.0f);
  EXPECT_EQ(map[255], 1.0f);
  // The lowest value mirrors the largest midpoint of decade 10^0, 64 slices of [0.1, 1].
  EXPECT_FLOAT_EQ(map[0], -(1.0f - 0.9f / 128));
  EXPECT_EQ(std::count_if(map.begin(), map.end(), [](float x) { return x < 0; }), 127);
  // Mirror image apart from 1.0: the negative half is the positive half negated.
  for (int i = 0; i < 127; ++i) EXPECT_EQ(map[i], -map[254 - i]) << "index " << i;
}

TEST(DynamicMapTest, UnsignedMapHasTheDocumentedStructure) {
  const std::array<float, 256>& map = DynamicMapUnsigned();
  for (size_t i = 1; i < map.size(); ++i) ASSERT_LT(map[i - 1], map[i]) << "index " << i;
  EXPECT_EQ(map[0], 0.0f);
  EXPECT_EQ(map[255], 1.0f);
}

// Decade 10^(i−6) holds the midpoints of `slices` equal slices of [0.1, 1] scaled by it: 2^i
// (signed, positive side) or 2^(i+1) (unsigned).
TEST(DynamicMapTest, EachDecadeHoldsEvenlySpacedMidpoints) {
  for (DynamicMap which : {DynamicMap::kSigned, DynamicMap::kUnsigned}) {
    const std::array<float, 256>& map = MapOf(which);
    for (int i = 0; i < 7; ++i) {
      const double decade = std::pow(10.0, i - 6);
      const int slices = which == DynamicMap::kSigned ? (1 << i) : (1 << (i + 1));
      std::vector<double> in_decade;
      for (float x : map) {
        if (x > 0.1 * decade && x < decade) in_decade.push_back(x);
      }
      ASSERT_EQ(in_decade.size(), static_cast<size_t>(slices)) << "decade " << i;
      for (int k = 0; k < slices; ++k) {
        const double want = decade * (0.1 + (k + 0.5) * 0.9 / slices);
        // One f32 rounding of each value: half an ulp, 6e-8 relative.
        EXPECT_NEAR(in_decade[k], want, want * 1e-7) << "decade " << i << " slice " << k;
      }
    }
  }
}

TEST(BlockQuantizeTest, MapValuesRoundTripExactly) {
  for (DynamicMap which : {DynamicMap::kSigned, DynamicMap::kUnsigned}) {
    const std::array<float, 256>& map = MapOf(which);
    // A power-of-two absmax keeps x / absmax and map · absmax exact.
    std::vector<float> src(256);
    for (int i = 0; i < 256; ++i) src[i] = map[i] * 4.0f;
    std::vector<uint8_t> codes(256);
    std::vector<float> absmax(1), back(256);
    const DeviceContext ctx = CpuContext(1);
    ASSERT_TRUE(BlockQuantize(ctx, {.src = Flat(src),
                                    .codes = Flat(codes),
                                    .absmax = Flat(absmax),
                                    .block = 256,
                                    .map = which})
                    .ok());
    EXPECT_EQ(absmax[0], 4.0f);
    for (int i = 0; i < 256; ++i) EXPECT_EQ(codes[i], i) << "value " << src[i];
    ASSERT_TRUE(BlockDequantize(ctx, {.codes = Flat(codes),
                                      .absmax = Flat(absmax),
                                      .dst = Flat(back),
                                      .block = 256,
                                      .map = which})
                    .ok());
    EXPECT_TRUE(SameBits(back, src));
  }
}

// Codes against a float64 brute-force nearest search over all 256 values, and the
// dequantization error against half the largest gap. The last block is partial.
TEST(BlockQuantizeTest, NearestCodeAndErrorBoundAgainstFloat64) {
  const int64_t n = 10 * 512 + 77, block = 512;
  for (DynamicMap which : {DynamicMap::kSigned, DynamicMap::kUnsigned}) {
    const std::array<float, 256>& map = MapOf(which);
    const bool non_negative = which == DynamicMap::kUnsigned;
    std::vector<float> src = WideRangeVector(n, 7, non_negative);
    std::vector<float> absmax(NumQuantBlocks(n, block)), back(n);
    std::vector<uint8_t> codes(n);
    const DeviceContext ctx = CpuContext(2);
    ASSERT_TRUE(BlockQuantize(ctx, {.src = Flat(src),
                                    .codes = Flat(codes),
                                    .absmax = Flat(absmax),
                                    .block = block,
                                    .map = which})
                    .ok());
    ASSERT_TRUE(BlockDequantize(ctx, {.codes = Flat(codes),
                                      .absmax = Flat(absmax),
                                      .dst = Flat(back),
                                      .block = block,
                                      .map = which})
                    .ok());
    const double half_gap = LargestGap(map) / 2;
    int64_t ties = 0;
    for (int64_t b = 0; b < static_cast<int64_t>(absmax.size()); ++b) {
      const int64_t begin = b * block, end = std::min(n, begin + block);
      double amax = 0;
      for (int64_t i = begin; i < end; ++i) amax = std::max(amax, std::abs(double{src[i]}));
      ASSERT_EQ(absmax[b], amax) << "block " << b;
      for (int64_t i = begin; i < end; ++i) {
        const double r = src[i] / amax;
        int best = 0;
        for (int k = 1; k < 256; ++k) {
          if (std::abs(map[k] - r) < std::abs(map[best] - r)) best = k;
        }
        if (codes[i] != best) {
          // The kernel's choice is exact for its f32 ratio x / absmax; only where the rounding
          // of that ratio (2^-24 relative) crosses a midpoint may it pick the other neighbour.
          ++ties;
          EXPECT_EQ(std::abs(int{codes[i]} - best), 1) << "element " << i;
          EXPECT_NEAR(std::abs(map[codes[i]] - r), std::abs(map[best] - r), 2e-7 * std::abs(r))
              << "element " << i;
        }
        // Half the largest gap of the map times the block's scale, plus the two f32
        // roundings of x / absmax and map · absmax (1e-7 of absmax).
        EXPECT_LE(std::abs(back[i] - double{src[i]}), (half_gap + 1e-7) * amax) << "element " << i;
      }
    }
    // Exact midpoints are a measure-zero set: a handful at most among 5,197 values.
    EXPECT_LE(ties, 3);
  }
}

TEST(BlockQuantizeTest, ZeroBlockGetsTheZeroCode) {
  std::vector<float> src(128, 0.0f), absmax(2, -1.0f), back(128, 1.0f);
  for (int i = 64; i < 128; ++i) src[i] = 0.5f;
  for (DynamicMap which : {DynamicMap::kSigned, DynamicMap::kUnsigned}) {
    std::vector<uint8_t> codes(128, 99);
    const DeviceContext ctx = CpuContext(1);
    ASSERT_TRUE(BlockQuantize(ctx, {.src = Flat(src),
                                    .codes = Flat(codes),
                                    .absmax = Flat(absmax),
                                    .block = 64,
                                    .map = which})
                    .ok());
    EXPECT_EQ(absmax[0], 0.0f);
    EXPECT_EQ(absmax[1], 0.5f);
    const uint8_t zero = which == DynamicMap::kSigned ? kDynamicSignedZeroCode : 0;
    for (int i = 0; i < 64; ++i) EXPECT_EQ(codes[i], zero);
    for (int i = 64; i < 128; ++i) EXPECT_EQ(codes[i], 255);
    ASSERT_TRUE(BlockDequantize(ctx, {.codes = Flat(codes),
                                      .absmax = Flat(absmax),
                                      .dst = Flat(back),
                                      .block = 64,
                                      .map = which})
                    .ok());
    EXPECT_TRUE(SameBits(back, src));
  }
}

TEST(BlockQuantizeTest, SameBytesForAnyThreadCount) {
  const int64_t n = (1 << 17) + 300, block = 256;
  std::vector<float> src = RandomVector(n, 11);
  std::vector<uint8_t> codes1(n), codes3(n);
  std::vector<float> absmax1(NumQuantBlocks(n, block)), absmax3(absmax1.size());
  std::vector<float> back1(n), back3(n);
  for (auto [threads, codes, absmax, back] :
       {std::tuple{1, &codes1, &absmax1, &back1}, std::tuple{3, &codes3, &absmax3, &back3}}) {
    const DeviceContext ctx = CpuContext(threads);
    ASSERT_TRUE(
        BlockQuantize(
            ctx, {.src = Flat(src), .codes = Flat(*codes), .absmax = Flat(*absmax), .block = block})
            .ok());
    ASSERT_TRUE(
        BlockDequantize(
            ctx,
            {.codes = Flat(*codes), .absmax = Flat(*absmax), .dst = Flat(*back), .block = block})
            .ok());
  }
  EXPECT_EQ(codes1, codes3);
  EXPECT_TRUE(SameBits(absmax1, absmax3));
  EXPECT_TRUE(SameBits(back1, back3));
}

TEST(BlockQuantizeTest, RejectsBadBlockSizesAndBufferSizes) {
  std::vector<float> src(256), absmax(4);
  std::vector<uint8_t> codes(256);
  const DeviceContext ctx = CpuContext(1);
  for (int64_t block : {0, -64, 32, 96, 100}) {
    const absl::Status st = BlockQuantize(
        ctx, {.src = Flat(src), .codes = Flat(codes), .absmax = Flat(absmax), .block = block});
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << block;
    EXPECT_NE(st.message().find("block is"), std::string::npos) << st;
    const absl::Status dq = BlockDequantize(
        ctx, {.codes = Flat(codes), .absmax = Flat(absmax), .dst = Flat(src), .block = block});
    EXPECT_EQ(dq.code(), absl::StatusCode::kInvalidArgument) << block;
  }
  // 256 elements in blocks of 128 need 2 absmax values, not 4.
  const absl::Status st = BlockQuantize(
      ctx, {.src = Flat(src), .codes = Flat(codes), .absmax = Flat(absmax), .block = 128});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("absmax"), std::string::npos) << st;
  std::vector<uint8_t> short_codes(200);
  const absl::Status sc = BlockQuantize(
      ctx, {.src = Flat(src), .codes = Flat(short_codes), .absmax = Flat(absmax), .block = 64});
  EXPECT_EQ(sc.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(sc.message().find("codes"), std::string::npos) << sc;
}

}  // namespace
}  // namespace zt
