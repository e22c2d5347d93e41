// Helpers shared by the op tests: seeded random buffers, float64 comparisons and a
// central finite-difference gradient check.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace zt::testing {

inline std::vector<float> RandomVector(size_t n, uint32_t seed, float lo = -1.0f,
                                       float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Largest |a − b| / (|b| + floor) over the elements: a relative error that does not blow up
// where the reference is near zero.
inline double MaxRelativeError(const std::vector<float>& a, const std::vector<double>& b,
                               double floor = 1e-3) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]) / (std::abs(b[i]) + floor));
  }
  return worst;
}

// Largest |a − b| over the largest |b|: for buffers whose elements are sums of terms of either
// sign, where an element-wise relative error is meaningless where the terms cancel but the
// rounding of terms of the buffer's own magnitude still bounds the error.
inline double MaxErrorOverLargest(const std::vector<float>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0, largest = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]));
    largest = std::max(largest, std::abs(b[i]));
  }
  return largest > 0 ? worst / largest : worst;
}

// Central finite differences of a scalar function of `x` (evaluated in float64 by the
// caller's reference): d f / d x_i ≈ (f(x + h e_i) − f(x − h e_i)) / 2h.
inline std::vector<double> FiniteDifferenceGradient(
    std::vector<double> x, const std::function<double(const std::vector<double>&)>& f,
    double h = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double fp = f(x);
    x[i] = saved - h;
    const double fm = f(x);
    x[i] = saved;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

// The float64 copy of an f32 buffer, for references and finite differences.
inline std::vector<double> ToDouble(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Bitwise equality of two f32 buffers (NaN payloads and the sign of zero included): what the
// thread-count determinism checks need, where == would call −0 and +0 equal.
inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace zt::testing
