// kernels/reduce: SumOfSquares against a float64 sum and bitwise across thread counts;
// AllFinite on finite, inf and NaN buffers; errors.
#include "kernels/reduce.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using testing::RandomVector;

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

TEST(ReduceErrorsTest, NonF32IsRejected) {
  std::vector<uint16_t> h(8);
  const Tensor t(h.data(), DType::kBF16, {8});
  const absl::StatusOr<double> ss = SumOfSquares(CpuContext(1), t);
  EXPECT_EQ(ss.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ss.status().message().find("SumOfSquares: t has dtype bf16, expected f32"),
            std::string::npos)
      << ss.status();
  EXPECT_EQ(AllFinite(CpuContext(1), t).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zt
