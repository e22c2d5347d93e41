// Branch-free f32 math for the CPU kernels' inner loops.
//
// glibc's vector expf is only declared under -ffast-math, so a plain expf call in a loop stays
// a scalar libm call per element and dominates softmax and GELU. These inline functions use
// only arithmetic, std::fma and bit casts, so a `#pragma omp simd` loop that calls them
// becomes AVX-512 code. Their accuracy is tested in tests/unit/kernels/cpu/vec_math_test.cc.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace zt::cpu {

// exp(x) within 2 ulp over the normal range (Cephes' degree-6 polynomial on
// [−ln2/2, ln2/2] after an fma range reduction). Underflows gradually to 0 below about −103,
// overflows to +inf above about 88.72, and NaN stays NaN.
inline float FastExp(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  // Adding 1.5·2^23 pushes the fraction out of the mantissa: the FPU rounds to an integer.
  constexpr float kRound = 12582912.0f;
  // Ternaries rather than fmin/fmax so that a NaN passes through instead of being clamped.
  x = x < -104.0f ? -104.0f : x;
  x = x > 89.0f ? 89.0f : x;
  // An explicit fma: the compiler would contract it or not depending on -march, and the two
  // can round to different n near a half-integer.
  const float n = std::fma(x, kLog2e, kRound) - kRound;
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  const float y = std::fma(p, r * r, r) + 1.0f;
  // 2^n in two factors, each a normal float for n in [−150, 129]: the result then rounds once,
  // to a subnormal, zero or inf as the true value would.
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni >> 1;
  const int32_t n2 = ni - n1;
  const float s1 = std::bit_cast<float>((n1 + 127) << 23);
  const float s2 = std::bit_cast<float>((n2 + 127) << 23);
  return y * s1 * s2;
}

// 1 / (1 + exp(−x)) together with 1 − sigmoid(x), which is computed as e·s rather than 1 − s
// so it keeps its relative accuracy where s is close to 1. x is clamped to ±80, where both
// are already exact to f32 (e^−80 < 2^−115), so e never reaches inf and e·s never becomes
// inf·0.
struct SigmoidPair {
  float s;
  float one_minus_s;
};
inline SigmoidPair Sigmoid(float x) {
  x = x < -80.0f ? -80.0f : x;
  x = x > 80.0f ? 80.0f : x;
  const float e = FastExp(-x);
  const float s = 1.0f / (1.0f + e);
  return {s, e * s};
}

}  // namespace zt::cpu
