// kernels/elementwise: Add/AddInPlace/Scale against float64, Zero on every dtype, and Cast
// bit for bit against dtype.h's scalar conversions (which dtype_test checks against the
// compiler, the CPU and a float64 rounding reference).
#include "kernels/elementwise.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/kernels/mixed_check.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using testing::CountOutsideUlp;
using testing::MaxRelativeError;
using testing::RandomVector;
using testing::SameBits;
using testing::SameWords;
using testing::Stored;

Tensor Flat(std::vector<float>& v) {
  return Tensor(v.data(), DType::kF32, {static_cast<int64_t>(v.size())});
}
Tensor Flat16(std::vector<uint16_t>& v, DType dtype) {
  return Tensor(v.data(), dtype, {static_cast<int64_t>(v.size())});
}

// One f32 rounding of an exact float64 result: half an ulp, 2^-24 relative.
constexpr double kOneRounding = 0x1p-24;

TEST(ElementwiseTest, AddMatchesFloat64AndMayAlias) {
  const size_t n = (1 << 16) + 5;  // above the parallel threshold
  std::vector<float> a = RandomVector(n, 1), b = RandomVector(n, 2), out(n);
  ASSERT_TRUE(Add(CpuContext(2), Flat(a), Flat(b), Flat(out)).ok());
  std::vector<double> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = static_cast<double>(a[i]) + b[i];
  EXPECT_LE(MaxRelativeError(out, want, 1e-30), kOneRounding);
  std::vector<float> alias = a;
  ASSERT_TRUE(Add(CpuContext(2), Flat(alias), Flat(b), Flat(alias)).ok());
  EXPECT_TRUE(SameBits(alias, out));
  alias = a;
  ASSERT_TRUE(AddInPlace(CpuContext(3), Flat(alias), Flat(b)).ok());
  EXPECT_TRUE(SameBits(alias, out));
}

TEST(ElementwiseTest, ScaleMatchesFloat64) {
  std::vector<float> t = RandomVector(1000, 3), orig = t;
  ASSERT_TRUE(Scale(CpuContext(2), Flat(t), 0.37f).ok());
  std::vector<double> want(t.size());
  for (size_t i = 0; i < t.size(); ++i) want[i] = static_cast<double>(orig[i]) * 0.37f;
  EXPECT_LE(MaxRelativeError(t, want, 1e-30), kOneRounding);
}

TEST(ElementwiseTest, ZeroClearsEveryDType) {
  std::vector<float> f = RandomVector((1 << 19) + 3, 4);  // several 1 MiB chunks
  ASSERT_TRUE(Zero(CpuContext(3), Flat(f)).ok());
  for (float x : f) ASSERT_EQ(x, 0.0f);
  std::vector<uint16_t> h(777, 0x3c00);
  ASSERT_TRUE(Zero(CpuContext(1), Flat16(h, DType::kBF16)).ok());
  for (uint16_t x : h) ASSERT_EQ(x, 0);
  std::vector<int32_t> ids(33, 5);
  ASSERT_TRUE(Zero(CpuContext(1), Tensor(ids.data(), DType::kI32, {3, 11})).ok());
  for (int32_t x : ids) ASSERT_EQ(x, 0);
}

// Random bit patterns (every exponent, NaNs and infs included) plus f16's edge values.
std::vector<float> CastInputs(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = BitsToFloat(rng());
  std::uniform_real_distribution<float> in_range(-70000.0f, 70000.0f);
  for (size_t i = 0; i < n / 2; ++i) v[i] = in_range(rng) * std::ldexp(1.0f, -(int)(rng() % 28));
  for (float x :
       {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, std::ldexp(1.0f, -25), std::ldexp(3.0f, -25),
        std::ldexp(1.0f, -14), std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN()}) {
    v.push_back(x);
    v.push_back(-x);
  }
  return v;
}

TEST(ElementwiseTest, CastFromF32MatchesScalarConversions) {
  std::vector<float> src = CastInputs(200003, 5);
  std::vector<uint16_t> half(src.size()), bf16(src.size());
  ASSERT_TRUE(Cast(CpuContext(2), Flat(src), Flat16(half, DType::kF16)).ok());
  ASSERT_TRUE(Cast(CpuContext(2), Flat(src), Flat16(bf16, DType::kBF16)).ok());
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(half[i], FloatToHalf(src[i])) << "f32 bits 0x" << std::hex << FloatBits(src[i]);
    ASSERT_EQ(bf16[i], FloatToBf16(src[i])) << "f32 bits 0x" << std::hex << FloatBits(src[i]);
  }
}

TEST(ElementwiseTest, CastFrom16BitMatchesScalarConversionsForEveryPattern) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> from_half(all.size()), from_bf16(all.size());
  std::vector<uint16_t> half_to_bf16(all.size()), bf16_to_half(all.size());
  const DeviceContext ctx = CpuContext(2);
  ASSERT_TRUE(Cast(ctx, Flat16(all, DType::kF16), Flat(from_half)).ok());
  ASSERT_TRUE(Cast(ctx, Flat16(all, DType::kBF16), Flat(from_bf16)).ok());
  ASSERT_TRUE(Cast(ctx, Flat16(all, DType::kF16), Flat16(half_to_bf16, DType::kBF16)).ok());
  ASSERT_TRUE(Cast(ctx, Flat16(all, DType::kBF16), Flat16(bf16_to_half, DType::kF16)).ok());
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    ASSERT_EQ(FloatBits(from_half[i]), FloatBits(HalfToFloat(h))) << std::hex << i;
    ASSERT_EQ(FloatBits(from_bf16[i]), FloatBits(Bf16ToFloat(h))) << std::hex << i;
    ASSERT_EQ(half_to_bf16[i], FloatToBf16(HalfToFloat(h))) << std::hex << i;
    ASSERT_EQ(bf16_to_half[i], FloatToHalf(Bf16ToFloat(h))) << std::hex << i;
  }
}

TEST(ElementwiseTest, CastToSameDTypeCopiesAndThreadCountDoesNotMatter) {
  std::vector<float> src = CastInputs(100001, 6), copy(src.size());
  ASSERT_TRUE(Cast(CpuContext(2), Flat(src), Flat(copy)).ok());
  EXPECT_TRUE(SameBits(copy, src));
  std::vector<uint16_t> one(src.size()), three(src.size());
  ASSERT_TRUE(Cast(CpuContext(1), Flat(src), Flat16(one, DType::kF16)).ok());
  ASSERT_TRUE(Cast(CpuContext(3), Flat(src), Flat16(three, DType::kF16)).ok());
  EXPECT_EQ(one, three);
}

constexpr DType kFloatDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

// Every combination of storage dtypes for a, b and out; the 16-bit values are what the op
// sees, so the reference adds them in float64 and the op may differ by one rounding to out's
// dtype (one ulp allowed for the reference's own double rounding) plus f32's half ulp.
TEST(ElementwiseTest, AddAndScaleInEveryDTypeCombination) {
  const size_t n = (1 << 15) + 77;  // above the parallel threshold, partial last chunk
  for (DType ta : kFloatDTypes) {
    for (DType tb : kFloatDTypes) {
      for (DType tout : kFloatDTypes) {
        Stored a(RandomVector(n, 11), ta), b(RandomVector(n, 12), tb), out(n, tout);
        ASSERT_TRUE(Add(CpuContext(2), a.Flat(), b.Flat(), out.Flat()).ok());
        std::vector<double> want(n);
        for (size_t i = 0; i < n; ++i) want[i] = static_cast<double>(a.Get(i)) + b.Get(i);
        EXPECT_EQ(CountOutsideUlp(out, want, kOneRounding, 1e-30), 0)
            << DTypeName(ta) << " + " << DTypeName(tb) << " -> " << DTypeName(tout);
        // In place into a: acc += x, rounded to acc's dtype.
        Stored acc = a;
        ASSERT_TRUE(AddInPlace(CpuContext(3), acc.Flat(), b.Flat()).ok());
        EXPECT_EQ(CountOutsideUlp(acc, want, kOneRounding, 1e-30), 0);
      }
    }
    Stored t(RandomVector(n, 13), ta);
    const std::vector<double> orig = t.Doubles();
    ASSERT_TRUE(Scale(CpuContext(2), t.Flat(), 0.37f).ok());
    std::vector<double> want(n);
    for (size_t i = 0; i < n; ++i) want[i] = orig[i] * 0.37f;
    EXPECT_EQ(CountOutsideUlp(t, want, kOneRounding, 1e-30), 0) << DTypeName(ta);
  }
}

TEST(ElementwiseTest, HalfOverflowGivesInf) {
  Stored a(std::vector<float>(5, 40000.0f), DType::kF16), out(5, DType::kF16);
  ASSERT_TRUE(Add(CpuContext(1), a.Flat(), a.Flat(), out.Flat()).ok());
  for (float x : out.Values()) EXPECT_EQ(x, std::numeric_limits<float>::infinity());
  Stored s(std::vector<float>(3, -40000.0f), DType::kF16);
  ASSERT_TRUE(Scale(CpuContext(1), s.Flat(), 2.0f).ok());
  for (float x : s.Values()) EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
}

TEST(ElementwiseTest, SixteenBitAddIsIndependentOfThreadCount) {
  const size_t n = 100003;
  Stored a(RandomVector(n, 14), DType::kBF16), b(RandomVector(n, 15), DType::kF32);
  Stored one(n, DType::kF16), three(n, DType::kF16);
  ASSERT_TRUE(Add(CpuContext(1), a.Flat(), b.Flat(), one.Flat()).ok());
  ASSERT_TRUE(Add(CpuContext(3), a.Flat(), b.Flat(), three.Flat()).ok());
  EXPECT_TRUE(SameWords(one, three));
}

// The mean of many stochastic roundings of x is x: each rounding is one of the two bf16
// neighbours lo < x < hi, hi with probability p = (x − lo)/(hi − lo), so over k draws the mean
// has standard error (hi − lo)·√(p(1 − p)/k); 5 standard errors is a bound a correct
// implementation misses with probability below 1e-6.
TEST(ElementwiseTest, CastStochasticIsUnbiasedAndDeterministic) {
  const int k = 1 << 16;
  for (float x : {1.00123f, -3.14159f, 1e-20f, 0.7f + 1.0f / 512}) {
    std::vector<float> src(k, x);
    std::vector<uint16_t> dst(k), again(k), other(k);
    ASSERT_TRUE(CastStochastic(CpuContext(2), Flat(src), Flat16(dst, DType::kBF16), 42).ok());
    // The two neighbours: x's magnitude truncated to bf16, and one ulp above it.
    const uint16_t down = static_cast<uint16_t>(FloatBits(x) >> 16);
    const uint16_t up = static_cast<uint16_t>(down + 1);
    double sum = 0;
    for (uint16_t h : dst) {
      ASSERT_TRUE(h == down || h == up) << std::hex << h;
      sum += Bf16ToFloat(h);
    }
    const double gap = std::abs(static_cast<double>(Bf16ToFloat(up)) - Bf16ToFloat(down));
    const double p = std::abs(x - static_cast<double>(Bf16ToFloat(down))) / gap;
    const double se = gap * std::sqrt(p * (1 - p) / k);
    EXPECT_NEAR(sum / k, x, 5 * se) << x;
    ASSERT_TRUE(CastStochastic(CpuContext(1), Flat(src), Flat16(again, DType::kBF16), 42).ok());
    EXPECT_EQ(dst, again);
    ASSERT_TRUE(CastStochastic(CpuContext(3), Flat(src), Flat16(other, DType::kBF16), 43).ok());
    EXPECT_NE(dst, other);
  }
  // Values already representable, infinities and NaN come out as round to nearest gives them.
  std::vector<float> exact = {1.0f, -2.5f, 0.0f, std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
  std::vector<uint16_t> out(exact.size());
  ASSERT_TRUE(CastStochastic(CpuContext(1), Flat(exact), Flat16(out, DType::kBF16), 7).ok());
  for (size_t i = 0; i < exact.size(); ++i) EXPECT_EQ(out[i], FloatToBf16(exact[i]));
  std::vector<float> nan = {std::numeric_limits<float>::quiet_NaN()};
  std::vector<uint16_t> nan_out(1);
  ASSERT_TRUE(CastStochastic(CpuContext(1), Flat(nan), Flat16(nan_out, DType::kBF16), 7).ok());
  EXPECT_TRUE(std::isnan(Bf16ToFloat(nan_out[0])));
}

void ExpectInvalid(const absl::Status& st, const std::string& needle) {
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find(needle), std::string::npos) << st;
}

TEST(ElementwiseTest, BadArgumentsAreNamed) {
  std::vector<float> a(12), b(10);
  std::vector<uint16_t> h(12);
  std::vector<int32_t> ids(12);
  const DeviceContext ctx = CpuContext(1);
  ExpectInvalid(Add(ctx, Flat(a), Flat(b), Flat(a)), "Add: b f32[10] has 10 elements, a f32[12]");
  ExpectInvalid(AddInPlace(ctx, Tensor(ids.data(), DType::kI32, {12}), Flat(a)),
                "AddInPlace: acc has dtype i32, expected one of f32, bf16, f16");
  ExpectInvalid(Scale(ctx, Tensor(ids.data(), DType::kI32, {12}), 2.0f), "Scale: t has dtype i32");
  ExpectInvalid(CastStochastic(ctx, Flat(a), Flat16(h, DType::kF16), 1),
                "CastStochastic: dst has dtype f16, expected bf16");
  ExpectInvalid(Cast(ctx, Tensor(ids.data(), DType::kI32, {12}), Flat(a)),
                "Cast: src has dtype i32, expected one of f32, bf16, f16");
  ExpectInvalid(Cast(ctx, Flat(b), Flat16(h, DType::kF16)), "Cast: dst f16[12] has 12 elements");
  ExpectInvalid(Zero(ctx, Tensor()), "Zero: t is empty");
}

}  // namespace
}  // namespace zt
