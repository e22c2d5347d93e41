// Helpers for the ops' 16-bit storage tests: buffers stored as f32, bf16 or f16, and the
// comparison the mixed-precision tests share. A 16-bit op loads its inputs to f32, computes as
// the f32 path does and rounds once on store, so against a float64 reference evaluated on the
// 16-bit-rounded inputs its error is at most one rounding to the output dtype (half an ulp,
// one ulp allowed for the double rounding float64 → f32 → 16 bits of the reference) plus the
// f32 path's own error.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/dtype.h"
#include "kernels/tensor.h"

namespace zt::testing {

inline float RoundTo(DType t, float x) {
  switch (t) {
    case DType::kBF16:
      return Bf16ToFloat(FloatToBf16(x));
    case DType::kF16:
      return HalfToFloat(FloatToHalf(x));
    default:
      return x;
  }
}

// A host buffer stored in one of the float dtypes.
class Stored {
 public:
  Stored(const std::vector<float>& values, DType dtype)
      : dtype_(dtype), words_((values.size() * DTypeSize(dtype) + 3) / 4), n_(values.size()) {
    for (size_t i = 0; i < n_; ++i) Set(i, values[i]);
  }
  Stored(size_t n, DType dtype) : Stored(std::vector<float>(n, 0.0f), dtype) {}

  Tensor View(std::initializer_list<int64_t> shape) { return Tensor(words_.data(), dtype_, shape); }
  Tensor Flat() { return Tensor(words_.data(), dtype_, {static_cast<int64_t>(n_)}); }
  DType dtype() const { return dtype_; }
  size_t size() const { return n_; }

  float Get(size_t i) const {
    if (dtype_ == DType::kF32) return reinterpret_cast<const float*>(words_.data())[i];
    const uint16_t h = reinterpret_cast<const uint16_t*>(words_.data())[i];
    return dtype_ == DType::kBF16 ? Bf16ToFloat(h) : HalfToFloat(h);
  }
  void Set(size_t i, float x) {
    if (dtype_ == DType::kF32) {
      reinterpret_cast<float*>(words_.data())[i] = x;
    } else {
      reinterpret_cast<uint16_t*>(words_.data())[i] =
          dtype_ == DType::kBF16 ? FloatToBf16(x) : FloatToHalf(x);
    }
  }
  // The stored values as f32 (what the op sees).
  std::vector<float> Values() const {
    std::vector<float> v(n_);
    for (size_t i = 0; i < n_; ++i) v[i] = Get(i);
    return v;
  }
  std::vector<double> Doubles() const {
    std::vector<double> v(n_);
    for (size_t i = 0; i < n_; ++i) v[i] = Get(i);
    return v;
  }
  const std::vector<uint32_t>& words() const { return words_; }

 private:
  DType dtype_;
  std::vector<uint32_t> words_;
  size_t n_;
};

// One ulp of dtype t at magnitude |x| (the subnormal spacing below the normal range).
inline double UlpOf(DType t, double x) {
  const int mantissa = t == DType::kBF16 ? 7 : t == DType::kF16 ? 10 : 23;
  const int min_exp = t == DType::kF16 ? -14 : -126;
  int e = 0;
  std::frexp(std::abs(x), &e);  // |x| in [2^(e-1), 2^e)
  return std::ldexp(1.0, std::max(e - 1, min_exp) - mantissa);
}

// Every element of `got` (stored in its dtype) within one ulp of that dtype at the reference
// plus `rel_tol` · (|want| + floor), the f32 path's own tolerance. Returns the number of
// elements outside, so a test can assert it is 0.
inline int CountOutsideUlp(const Stored& got, const std::vector<double>& want, double rel_tol,
                           double floor) {
  EXPECT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double allowed = UlpOf(got.dtype(), want[i]) + rel_tol * (std::abs(want[i]) + floor);
    if (!(std::abs(got.Get(i) - want[i]) <= allowed)) ++bad;
  }
  return bad;
}

inline bool SameWords(const Stored& a, const Stored& b) { return a.words() == b.words(); }

}  // namespace zt::testing
