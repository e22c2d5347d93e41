// Tests of kernels/rope.h: rotate-half RoPE against a float64 reference, the inverse as the
// forward's inverse and as its gradient (finite differences), explicit positions, and
// argument checks.
#include "kernels/rope.h"

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/kernels/mixed_check.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using ::zt::testing::CountOutsideUlp;
using ::zt::testing::FiniteDifferenceGradient;
using ::zt::testing::MaxRelativeError;
using ::zt::testing::RandomVector;
using ::zt::testing::SameBits;
using ::zt::testing::SameWords;
using ::zt::testing::Stored;
using ::zt::testing::ToDouble;

struct Shape {
  int b, t, h, hkv, d;
  int heads() const { return h + 2 * hkv; }
  int64_t size() const { return int64_t{b} * t * heads() * d; }
};

// Rotates the q and k heads of every row by +θ, in float64.
std::vector<double> RopeRef(const Shape& s, std::vector<double> x, double theta,
                            const std::vector<int32_t>* positions) {
  const int half = s.d / 2;
  for (int64_t r = 0; r < int64_t{s.b} * s.t; ++r) {
    const double pos = positions != nullptr ? (*positions)[r] : static_cast<double>(r % s.t);
    for (int h = 0; h < s.h + s.hkv; ++h) {
      double* v = x.data() + r * s.heads() * s.d + int64_t{h} * s.d;
      for (int i = 0; i < half; ++i) {
        const double angle = pos * std::pow(theta, -2.0 * i / s.d);
        const double x0 = v[i], x1 = v[i + half];
        v[i] = x0 * std::cos(angle) - x1 * std::sin(angle);
        v[i + half] = x1 * std::cos(angle) + x0 * std::sin(angle);
      }
    }
  }
  return x;
}

absl::Status Apply(const Shape& s, std::vector<float>& x, float theta, RopeDirection direction,
                   std::vector<int32_t>* positions = nullptr) {
  return RopeApply(
      CpuContext(2),
      {.qkv = Tensor(x.data(), DType::kF32, {s.b, s.t, int64_t{s.heads()} * s.d}),
       .n_head = s.h,
       .n_kv_head = s.hkv,
       .theta = theta,
       .positions =
           positions != nullptr ? Tensor(positions->data(), DType::kI32, {s.b, s.t}) : Tensor(),
       .direction = direction});
}

TEST(RopeTest, ForwardMatchesFloat64Reference) {
  const Shape s{2, 37, 4, 2, 16};
  for (float theta : {10000.0f, 500000.0f}) {
    std::vector<float> x = RandomVector(s.size(), 1);
    const std::vector<double> want = RopeRef(s, ToDouble(x), theta, nullptr);
    ASSERT_TRUE(Apply(s, x, theta, RopeDirection::kForward).ok());
    // Computed in float64 and rounded once: ≤ 2⁻²⁴ ≈ 6e-8 relative plus the float64 angle's
    // error; 1e-6 leaves room for libm differences. The v heads are compared exactly below.
    EXPECT_LT(MaxRelativeError(x, want, 1e-12), 1e-6) << "theta " << theta;
    for (size_t i = 0; i < x.size(); ++i) {
      if ((i / s.d) % s.heads() >= static_cast<size_t>(s.h + s.hkv)) {
        ASSERT_EQ(x[i], static_cast<float>(want[i])) << "v changed at " << i;
      }
    }
  }
}

TEST(RopeTest, ExplicitPositionsMatchTheReference) {
  const Shape s{2, 9, 2, 1, 64};
  std::vector<float> x = RandomVector(s.size(), 2);
  // Packed sequences restart their positions; long contexts reach far positions.
  std::vector<int32_t> positions(s.b * s.t);
  for (int r = 0; r < s.b * s.t; ++r) positions[r] = r % 4 + (r >= s.t ? 30000 : 0);
  const std::vector<double> want = RopeRef(s, ToDouble(x), 10000.0, &positions);
  ASSERT_TRUE(Apply(s, x, 10000.0f, RopeDirection::kForward, &positions).ok());
  // As in the forward test: one rounding of a float64 result (angles up to 3e4 rad keep
  // ~1e-12 absolute accuracy in float64).
  EXPECT_LT(MaxRelativeError(x, want, 1e-12), 1e-6);
}

TEST(RopeTest, PositionsEqualToTheIndexMatchNoPositionsBitwise) {
  const Shape s{2, 21, 4, 4, 8};
  std::vector<float> a = RandomVector(s.size(), 3);
  std::vector<float> b = a;
  std::vector<int32_t> positions(s.b * s.t);
  for (int r = 0; r < s.b * s.t; ++r) positions[r] = r % s.t;
  ASSERT_TRUE(Apply(s, a, 10000.0f, RopeDirection::kForward).ok());
  ASSERT_TRUE(Apply(s, b, 10000.0f, RopeDirection::kForward, &positions).ok());
  EXPECT_TRUE(SameBits(a, b));
}

TEST(RopeTest, InverseUndoesForward) {
  const Shape s{2, 37, 4, 2, 16};
  const std::vector<float> x0 = RandomVector(s.size(), 4);
  std::vector<float> x = x0;
  ASSERT_TRUE(Apply(s, x, 10000.0f, RopeDirection::kForward).ok());
  ASSERT_TRUE(Apply(s, x, 10000.0f, RopeDirection::kInverse).ok());
  // Two roundings, each ≤ 2⁻²⁴ of a pair's magnitude (≤ √2): ≲ 2e-7 absolute, so 2e-6
  // relative to |x| + 0.1.
  EXPECT_LT(MaxRelativeError(x, ToDouble(x0), 0.1), 2e-6);
}

TEST(RopeTest, InverseIsTheGradientOfTheForward) {
  const Shape s{1, 5, 2, 1, 4};
  const std::vector<float> x = RandomVector(s.size(), 5);
  std::vector<float> w = RandomVector(s.size(), 6);  // L = Σ w·rope(x)
  const std::vector<double> w64 = ToDouble(w);
  const std::vector<double> fd =
      FiniteDifferenceGradient(ToDouble(x), [&](const std::vector<double>& v) {
        const std::vector<double> y = RopeRef(s, v, 10000.0, nullptr);
        double loss = 0;
        for (size_t i = 0; i < y.size(); ++i) loss += w64[i] * y[i];
        return loss;
      });
  // The backward pass rotates the incoming gradient by −θ; v's gradient passes through.
  ASSERT_TRUE(Apply(s, w, 10000.0f, RopeDirection::kInverse).ok());
  // L is linear in x: differences are exact to float64 rounding (~1e-10); the kernel's result
  // is one f32 rounding of a float64 value.
  EXPECT_LT(MaxRelativeError(w, fd, 1e-3), 1e-6);
}

absl::Status ApplyStored(const Shape& s, Stored& x, RopeDirection direction, int threads) {
  return RopeApply(CpuContext(threads), {.qkv = x.View({s.b, s.t, int64_t{s.heads()} * s.d}),
                                         .n_head = s.h,
                                         .n_kv_head = s.hkv,
                                         .direction = direction});
}

// The reference rotates the stored (16-bit-rounded) input in float64; the kernel's result may
// differ by one rounding to the stored dtype (one ulp allowed for the reference's double
// rounding) plus the f32 path's 1e-6 relative (ForwardMatchesFloat64Reference).
TEST(RopeTest, SixteenBitForwardMatchesFloat64Reference) {
  const Shape s{2, 37, 4, 2, 16};
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    Stored x(RandomVector(s.size(), 7), dtype);
    const Stored x0 = x;
    const std::vector<double> want = RopeRef(s, x.Doubles(), 10000.0, nullptr);
    ASSERT_TRUE(ApplyStored(s, x, RopeDirection::kForward, 2).ok());
    EXPECT_EQ(CountOutsideUlp(x, want, 1e-6, 1e-12), 0) << DTypeName(dtype);
    for (size_t i = 0; i < x.size(); ++i) {
      if ((i / s.d) % s.heads() >= static_cast<size_t>(s.h + s.hkv)) {
        ASSERT_EQ(x.Get(i), x0.Get(i)) << "v changed at " << i;
      }
    }
  }
}

// As InverseIsTheGradientOfTheForward with the incoming gradient stored in 16 bits: the
// tolerance is one ulp of its dtype plus the f32 path's 1e-6.
TEST(RopeTest, SixteenBitInverseIsTheGradientOfTheForward) {
  const Shape s{1, 5, 2, 1, 4};
  const std::vector<float> x = RandomVector(s.size(), 8);
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    Stored w(RandomVector(s.size(), 9), dtype);  // L = Σ w·rope(x)
    const std::vector<double> w64 = w.Doubles();
    const std::vector<double> fd =
        FiniteDifferenceGradient(ToDouble(x), [&](const std::vector<double>& v) {
          const std::vector<double> y = RopeRef(s, v, 10000.0, nullptr);
          double loss = 0;
          for (size_t i = 0; i < y.size(); ++i) loss += w64[i] * y[i];
          return loss;
        });
    ASSERT_TRUE(ApplyStored(s, w, RopeDirection::kInverse, 2).ok());
    EXPECT_EQ(CountOutsideUlp(w, fd, 1e-6, 1e-3), 0) << DTypeName(dtype);
  }
}

TEST(RopeTest, SixteenBitBitwiseIndependentOfThreadCount) {
  const Shape s{3, 29, 4, 2, 32};
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    Stored one(RandomVector(s.size(), 10), dtype);
    Stored three = one;
    ASSERT_TRUE(ApplyStored(s, one, RopeDirection::kForward, 1).ok());
    ASSERT_TRUE(ApplyStored(s, three, RopeDirection::kForward, 3).ok());
    EXPECT_TRUE(SameWords(one, three)) << DTypeName(dtype);
  }
}

TEST(RopeTest, BadArgumentsAreInvalidArgumentsNamingTheArgument) {
  std::vector<float> buf(2 * 3 * 8 * 6, 0.0f);
  std::vector<int32_t> pos(64, 0);
  const DeviceContext ctx = CpuContext(1);
  auto expect_invalid = [](const absl::Status& st, const std::string& arg) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(arg), std::string::npos) << st;
  };
  const RopeArgs good{.qkv = Tensor(buf.data(), DType::kF32, {2, 3, 48}),
                      .n_head = 2,
                      .n_kv_head = 2};  // 6 heads of D = 8
  ASSERT_TRUE(RopeApply(ctx, good).ok());
  RopeArgs bad = good;
  bad.qkv = Tensor(buf.data(), DType::kF32, {2, 3, 42});  // D = 7: odd
  expect_invalid(RopeApply(ctx, bad), "qkv");
  bad = good;
  bad.positions = Tensor(pos.data(), DType::kI32, {3, 2});
  expect_invalid(RopeApply(ctx, bad), "positions");
  bad = good;
  bad.positions = Tensor(pos.data(), DType::kF32, {2, 3});
  expect_invalid(RopeApply(ctx, bad), "positions");
  bad = good;
  bad.theta = 0.0f;
  expect_invalid(RopeApply(ctx, bad), "theta");
  bad = good;
  bad.n_kv_head = 0;
  expect_invalid(RopeApply(ctx, bad), "n_kv_head");
  bad = good;
  bad.qkv = Tensor(buf.data(), DType::kI32, {2, 3, 48});
  expect_invalid(RopeApply(ctx, bad), "qkv has dtype i32, expected one of f32, bf16, f16");
}

}  // namespace
}  // namespace zt
