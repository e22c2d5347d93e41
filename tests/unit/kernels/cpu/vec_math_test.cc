// kernels/cpu/vec_math: the polynomial exp and the sigmoid built on it, against float64.
#include "kernels/cpu/vec_math.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace zt::cpu {
namespace {

// |got − want| in units of the f32 spacing at want (for normal want).
double UlpError(float got, double want) {
  const double ulp = std::ldexp(1.0, std::ilogb(static_cast<float>(want)) - 23);
  return std::abs(static_cast<double>(got) - want) / ulp;
}

std::vector<float> SamplePoints(float lo, float hi, int count, uint32_t seed) {
  std::vector<float> xs;
  for (int i = 0; i <= count; ++i) xs.push_back(lo + (hi - lo) * static_cast<float>(i) / count);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int i = 0; i < count; ++i) xs.push_back(dist(rng));
  return xs;
}

TEST(VecMathTest, FastExpIsWithinTwoUlpOverTheNormalRange) {
  // exp(x) is a normal float for x in [−87.33, 88.72].
  double worst = 0;
  for (float x : SamplePoints(-87.3f, 88.7f, 500000, 1)) {
    worst = std::max(worst, UlpError(FastExp(x), std::exp(static_cast<double>(x))));
  }
  // Cephes' polynomial claims ~1 ulp; the fma range reduction and the final two scalings add
  // at most one more rounding.
  EXPECT_LE(worst, 2.0);
}

TEST(VecMathTest, FastExpOfSmallArgumentsIsAccurate) {
  // Softmax spends most of its calls near 0 (x − max close to 0 for the likely tokens).
  double worst = 0;
  for (float x : SamplePoints(-1.0f, 1.0f, 100000, 2)) {
    worst = std::max(worst, UlpError(FastExp(x), std::exp(static_cast<double>(x))));
  }
  EXPECT_LE(worst, 2.0);  // same bound as the whole range
  EXPECT_EQ(FastExp(0.0f), 1.0f);
}

TEST(VecMathTest, FastExpUnderflowsGraduallyAndOverflowsToInf) {
  for (float x : SamplePoints(-103.0f, -87.4f, 20000, 3)) {
    const double want = std::exp(static_cast<double>(x));
    // Subnormal results: one rounding to the 2^−149 grid, plus the ~2 ulp relative error of
    // the polynomial, which is below one grid step here.
    EXPECT_LE(std::abs(FastExp(x) - want), 2 * std::ldexp(1.0, -149)) << "x " << x;
  }
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FastExp(-110.0f), 0.0f);
  EXPECT_EQ(FastExp(-inf), 0.0f);
  EXPECT_EQ(FastExp(88.8f), inf);
  EXPECT_EQ(FastExp(1000.0f), inf);
  EXPECT_EQ(FastExp(inf), inf);
  EXPECT_TRUE(std::isnan(FastExp(std::numeric_limits<float>::quiet_NaN())));
}

TEST(VecMathTest, SigmoidAndItsComplementKeepRelativeAccuracy) {
  double worst_s = 0, worst_c = 0;
  for (float x : SamplePoints(-80.0f, 80.0f, 200000, 4)) {
    const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(x)));
    const double c = 1.0 / (1.0 + std::exp(static_cast<double>(x)));  // 1 − s without cancelling
    const SigmoidPair got = Sigmoid(x);
    worst_s = std::max(worst_s, std::abs(got.s - s) / s);
    worst_c = std::max(worst_c, std::abs(got.one_minus_s - c) / c);
  }
  // FastExp's 2 ulp, the add, the divide and (for 1 − s) one multiply: 5 roundings of 2^−24.
  EXPECT_LE(worst_s, 5 * std::ldexp(1.0, -24));
  EXPECT_LE(worst_c, 5 * std::ldexp(1.0, -24));
  EXPECT_EQ(Sigmoid(1000.0f).s, 1.0f);
  EXPECT_NEAR(Sigmoid(-1000.0f).one_minus_s, 1.0f, 1.2e-7);  // e·(1/e): two roundings
  EXPECT_TRUE(std::isnan(Sigmoid(std::numeric_limits<float>::quiet_NaN()).s));
}

}  // namespace
}  // namespace zt::cpu
