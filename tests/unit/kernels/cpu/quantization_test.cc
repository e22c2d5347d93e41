// kernels/cpu/quantization: the bucketed nearest-code search against the definition (the
// index of the nearest map value in exact arithmetic, ties to the lower index) at every
// place where the answer can change — each decision midpoint and its f32 neighbours, each
// bucket edge — and at random points.
#include "kernels/cpu/quantization.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace zt::cpu {
namespace {

// The definition: the number of midpoints between neighbouring map values that x exceeds.
// Each midpoint is exact in double (the sum of two neighbouring f32 values and its half are).
int ReferenceCode(const std::array<float, 256>& map, float x) {
  int code = 0;
  for (int k = 0; k < 255; ++k) {
    if (static_cast<double>(x) > (static_cast<double>(map[k]) + map[k + 1]) / 2) code = k + 1;
  }
  return code;
}

// Points around which NearestCode's answer may change, with their f32 neighbours.
std::vector<float> ProbePoints(const std::array<float, 256>& map) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> centres;
  for (int k = 0; k < 255; ++k) {
    const double mid = (static_cast<double>(map[k]) + map[k + 1]) / 2;
    centres.push_back(static_cast<float>(mid));
  }
  for (float v : map) centres.push_back(v);
  for (int32_t b = 0; b <= CodeSearch::kPerSign; ++b) {
    const float edge =
        std::bit_cast<float>(CodeSearch::kMinBits + (uint32_t(b) << CodeSearch::kShift));
    centres.push_back(edge);
    centres.push_back(-edge);
  }
  for (float special : {0.0f, -0.0f, 1.0f, -1.0f, 1e-30f, -1e-30f, 2.0f, -2.0f, inf, -inf}) {
    centres.push_back(special);
  }
  std::vector<float> points;
  for (float c : centres) {
    float lo = c, hi = c;
    points.push_back(c);
    for (int step = 0; step < 3; ++step) {
      lo = std::nextafter(lo, -inf);
      hi = std::nextafter(hi, inf);
      points.push_back(lo);
      points.push_back(hi);
    }
  }
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::uniform_real_distribution<double> exponent(-9.0, 0.0);
  for (int i = 0; i < 100000; ++i) {
    points.push_back(uniform(rng));
    points.push_back(static_cast<float>((i % 2 ? -1 : 1) * std::pow(10.0, exponent(rng))));
  }
  return points;
}

TEST(NearestCodeTest, MatchesTheExactNearestValueEverywhereItCanChange) {
  for (DynamicMap which : {DynamicMap::kSigned, DynamicMap::kUnsigned}) {
    const std::array<float, 256>& map =
        which == DynamicMap::kSigned ? DynamicMapSigned() : DynamicMapUnsigned();
    const CodeSearch& search = CodeSearchFor(which);
    int64_t wrong = 0;
    for (float x : ProbePoints(map)) {
      const int want = ReferenceCode(map, x);
      const int got = NearestCode(search, x);
      if (got != want) {
        ++wrong;
        ADD_FAILURE() << "x " << x << " code " << got << ", nearest is " << want;
        if (wrong > 10) break;
      }
    }
    EXPECT_EQ(wrong, 0);
  }
}

TEST(NearestCodeTest, ExactTiesGoToTheLowerIndex) {
  // Midpoints that are f32 values themselves: x on one is equally far from both neighbours.
  for (DynamicMap which : {DynamicMap::kSigned, DynamicMap::kUnsigned}) {
    const std::array<float, 256>& map =
        which == DynamicMap::kSigned ? DynamicMapSigned() : DynamicMapUnsigned();
    int ties = 0;
    for (int k = 0; k < 255; ++k) {
      const double mid = (static_cast<double>(map[k]) + map[k + 1]) / 2;
      const float x = static_cast<float>(mid);
      if (x != mid) continue;
      ++ties;
      EXPECT_EQ(NearestCode(CodeSearchFor(which), x), k) << "midpoint " << x;
    }
    // 0 and 1.0 have f32 midpoints with their neighbours at least.
    EXPECT_GT(ties, 0);
  }
}

}  // namespace
}  // namespace zt::cpu
