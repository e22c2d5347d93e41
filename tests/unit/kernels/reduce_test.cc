// kernels/reduce: SumOfSquares against a float64 sum and bitwise across thread counts;
// AllFinite on finite, inf and NaN buffers; errors.
#include "kernels/reduce.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/kernels/mixed_check.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using testing::RandomVector;
using testing::Stored;

Tensor Flat(std::vector<float>& v) {
  return Tensor(v.data(), DType::kF32, {static_cast<int64_t>(v.size())});
}

TEST(SumOfSquaresTest, MatchesFloat64Sum) {
  for (size_t n : {size_t{0}, size_t{5}, size_t{65536}, size_t{300007}}) {
    std::vector<float> x = RandomVector(n, 1, -3.0f, 3.0f);
    long double want = 0;  // 64-bit mantissa: a reference more exact than the double sum
    for (float v : x) want += static_cast<long double>(v) * v;
    const absl::StatusOr<double> got = SumOfSquares(CpuContext(2), Flat(x));
    ASSERT_TRUE(got.ok()) << got.status();
    // x² of an f32 is exact in double; summing n positive terms in double is within
    // n·2^-53 relative in the worst case (3e-11 for n = 3e5).
    EXPECT_NEAR(*got, static_cast<double>(want), 1e-15 + static_cast<double>(want) * n * 0x1p-53)
        << "n " << n;
  }
}

TEST(SumOfSquaresTest, BitwiseIndependentOfThreadCount) {
  std::vector<float> x = RandomVector((1 << 22) + 13, 2);  // 65 chunks, the last one short
  const absl::StatusOr<double> one = SumOfSquares(CpuContext(1), Flat(x));
  const absl::StatusOr<double> three = SumOfSquares(CpuContext(3), Flat(x));
  ASSERT_TRUE(one.ok() && three.ok());
  EXPECT_EQ(std::bit_cast<uint64_t>(*one), std::bit_cast<uint64_t>(*three));
}

TEST(AllFiniteTest, FindsInfAndNanAnywhere) {
  std::vector<float> x = RandomVector(100003, 3, -1e30f, 1e30f);
  x[17] = std::numeric_limits<float>::max();
  x[18] = std::numeric_limits<float>::denorm_min();
  for (int threads : {1, 3}) {
    const absl::StatusOr<bool> finite = AllFinite(CpuContext(threads), Flat(x));
    ASSERT_TRUE(finite.ok());
    EXPECT_TRUE(*finite);
  }
  for (size_t at : {size_t{0}, size_t{50000}, x.size() - 1}) {
    for (float bad :
         {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
          std::numeric_limits<float>::quiet_NaN()}) {
      std::vector<float> y = x;
      y[at] = bad;
      const absl::StatusOr<bool> finite = AllFinite(CpuContext(2), Flat(y));
      ASSERT_TRUE(finite.ok());
      EXPECT_FALSE(*finite) << "bad value " << bad << " at " << at;
    }
  }
}

TEST(SumOfSquaresTest, SixteenBitMatchesFloat64AndThreadCount) {
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    Stored x(RandomVector(300007, 7, -3.0f, 3.0f), dtype);
    long double want = 0;
    for (float v : x.Values()) want += static_cast<long double>(v) * v;
    const absl::StatusOr<double> one = SumOfSquares(CpuContext(1), x.Flat());
    const absl::StatusOr<double> three = SumOfSquares(CpuContext(3), x.Flat());
    ASSERT_TRUE(one.ok() && three.ok());
    // The stored values are exact in double, so the bound is the f32 test's: n·2^-53.
    EXPECT_NEAR(*one, static_cast<double>(want), static_cast<double>(want) * 300007 * 0x1p-53)
        << DTypeName(dtype);
    EXPECT_EQ(std::bit_cast<uint64_t>(*one), std::bit_cast<uint64_t>(*three));
  }
}

// The loss scaler's overflow check: an f16 gradient that overflowed holds ±inf.
TEST(AllFiniteTest, SixteenBitInfAndNanAreFound) {
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    Stored x(RandomVector(100000, 8, -60000.0f, 60000.0f), dtype);
    const absl::StatusOr<bool> finite = AllFinite(CpuContext(2), x.Flat());
    ASSERT_TRUE(finite.ok());
    EXPECT_TRUE(*finite) << DTypeName(dtype);
    for (float bad :
         {70000.0f * (dtype == DType::kF16 ? 1.0f : 1e34f), -std::numeric_limits<float>::infinity(),
          std::numeric_limits<float>::quiet_NaN()}) {
      Stored y = x;
      y.Set(77777, bad);  // 70000 overflows f16 to inf when stored
      const absl::StatusOr<bool> got = AllFinite(CpuContext(2), y.Flat());
      ASSERT_TRUE(got.ok());
      EXPECT_FALSE(*got) << DTypeName(dtype) << " " << bad;
    }
  }
}

TEST(ReduceErrorsTest, NonFloatIsRejected) {
  std::vector<int32_t> ids(8);
  const Tensor t(ids.data(), DType::kI32, {8});
  const absl::StatusOr<double> ss = SumOfSquares(CpuContext(1), t);
  EXPECT_EQ(ss.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(
      ss.status().message().find("SumOfSquares: t has dtype i32, expected one of f32, bf16, f16"),
      std::string::npos)
      << ss.status();
  EXPECT_EQ(AllFinite(CpuContext(1), t).status().code(), absl::StatusCode::kInvalidArgument);
}

// The device-side accumulators the step loop reads once per step: bitwise the host value
// added once, so a CPU run through them is the run without them.
TEST(AccumulateTest, SumOfSquaresAddsTheHostValueOnce) {
  std::vector<float> a = RandomVector(70001, 7, -2.0f, 2.0f);
  std::vector<float> b = RandomVector(33, 8, -2.0f, 2.0f);
  alignas(8) double sum = 0;
  const Tensor acc(&sum, DType::kF32, {2});
  ASSERT_TRUE(AccumulateSumOfSquares(CpuContext(2), Flat(a), acc).ok());
  ASSERT_TRUE(AccumulateSumOfSquares(CpuContext(2), Flat(b), acc).ok());
  const double want = 0.0 + SumOfSquares(CpuContext(2), Flat(a)).value() +
                      SumOfSquares(CpuContext(2), Flat(b)).value();
  EXPECT_EQ(sum, want);
}

TEST(AccumulateTest, NonFiniteSetsTheFlagAndNeverClearsIt) {
  std::vector<float> finite = RandomVector(1000, 9);
  std::vector<float> bad = finite;
  bad[517] = std::numeric_limits<float>::infinity();
  float flag = 0.0f;
  const Tensor f(&flag, DType::kF32, {1});
  ASSERT_TRUE(AccumulateNonFinite(CpuContext(1), Flat(finite), f).ok());
  EXPECT_EQ(flag, 0.0f);
  ASSERT_TRUE(AccumulateNonFinite(CpuContext(1), Flat(bad), f).ok());
  EXPECT_EQ(flag, 1.0f);
  ASSERT_TRUE(AccumulateNonFinite(CpuContext(1), Flat(finite), f).ok());
  EXPECT_EQ(flag, 1.0f) << "a later finite buffer keeps the step's overflow";
}

TEST(AccumulateTest, RefusesAMisshapenAccumulator) {
  std::vector<float> x = RandomVector(10, 1);
  alignas(8) float slots[4] = {};
  EXPECT_EQ(AccumulateSumOfSquares(CpuContext(1), Flat(x), Tensor(slots, DType::kF32, {3})).code(),
            absl::StatusCode::kInvalidArgument);
  // Misaligned: the bits of a double need 8-byte alignment.
  EXPECT_EQ(
      AccumulateSumOfSquares(CpuContext(1), Flat(x), Tensor(slots + 1, DType::kF32, {2})).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AccumulateNonFinite(CpuContext(1), Flat(x), Tensor(slots, DType::kF32, {2})).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zt
