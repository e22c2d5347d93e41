// kernels/activation: GELU (tanh approximation) and SwiGLU forward against float64, backward
// against finite differences of L = Σ w·out, in-place backward, thread-count determinism,
// errors.
#include "kernels/activation.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/kernels/mixed_check.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using testing::CountOutsideUlp;
using testing::FiniteDifferenceGradient;
using testing::MaxRelativeError;
using testing::RandomVector;
using testing::SameBits;
using testing::SameWords;
using testing::Stored;
using testing::ToDouble;

double Gelu(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
double Silu(double g) { return g / (1.0 + std::exp(-g)); }

Tensor Flat(std::vector<float>& v) {
  return Tensor(v.data(), DType::kF32, {static_cast<int64_t>(v.size())});
}

// Inputs over GELU's interesting range plus its tails and exact zero.
std::vector<float> GeluInputs(size_t n, uint32_t seed) {
  std::vector<float> x = RandomVector(n, seed, -6.0f, 6.0f);
  for (float v : {0.0f, -0.0f, 1e-20f, -1e-20f, -12.0f, 12.0f, -30.0f, 30.0f, -1e4f, 1e4f}) {
    x.push_back(v);
  }
  return x;
}

TEST(GeluTest, ForwardMatchesFloat64) {
  std::vector<float> x = GeluInputs(5000, 1), out(x.size());
  ASSERT_TRUE(GeluForward(CpuContext(2), Flat(x), Flat(out)).ok());
  std::vector<double> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = Gelu(x[i]);
  // Relative accuracy holds on both tails (written as x·sigmoid(2u), nothing cancels); what
  // is left is u's f32 rounding magnified by |u| in the negative tail, below 1e-5 relative
  // for x ≥ −6. The floor of 1e-12 only matters for the far tail (x ≤ −12), where outputs
  // are below 1e-30 and their absolute error is what counts.
  EXPECT_LE(MaxRelativeError(out, want, 1e-12), 1e-5);
}

TEST(GeluTest, BackwardMatchesFiniteDifferences) {
  std::vector<float> x = RandomVector(300, 2, -5.0f, 5.0f);
  std::vector<float> w = RandomVector(x.size(), 3);
  std::vector<float> dinp(x.size());
  ASSERT_TRUE(GeluBackward(CpuContext(2), Flat(x), Flat(w), Flat(dinp)).ok());
  auto loss = [&](const std::vector<double>& p) {
    double l = 0;
    for (size_t i = 0; i < p.size(); ++i) l += w[i] * Gelu(p[i]);
    return l;
  };
  const std::vector<double> want = FiniteDifferenceGradient(ToDouble(x), loss);
  // gelu' is O(1) and is computed with a few f32 roundings (~1e-6); central differences of a
  // smooth float64 function with h = 1e-6 are good to ~1e-9. Floor 1e-3 for w·gelu' near 0.
  EXPECT_LE(MaxRelativeError(dinp, want), 1e-5);
}

TEST(GeluTest, BackwardInPlaceEqualsOutOfPlace) {
  std::vector<float> x = GeluInputs(1000, 4), dout = RandomVector(x.size(), 5);
  std::vector<float> separate(x.size()), in_place = dout;
  ASSERT_TRUE(GeluBackward(CpuContext(2), Flat(x), Flat(dout), Flat(separate)).ok());
  ASSERT_TRUE(GeluBackward(CpuContext(2), Flat(x), Flat(in_place), Flat(in_place)).ok());
  EXPECT_TRUE(SameBits(separate, in_place));
  for (float v : separate) EXPECT_TRUE(std::isfinite(v));  // the tails give no inf·0
}

TEST(GeluTest, BitwiseIndependentOfThreadCount) {
  // Above the parallel threshold, and not a multiple of the vector width.
  std::vector<float> x = GeluInputs((1 << 16) + 77, 6), dout = RandomVector(x.size(), 7);
  std::vector<float> out1(x.size()), out3(x.size()), d1(x.size()), d3(x.size());
  ASSERT_TRUE(GeluForward(CpuContext(1), Flat(x), Flat(out1)).ok());
  ASSERT_TRUE(GeluForward(CpuContext(3), Flat(x), Flat(out3)).ok());
  ASSERT_TRUE(GeluBackward(CpuContext(1), Flat(x), Flat(dout), Flat(d1)).ok());
  ASSERT_TRUE(GeluBackward(CpuContext(3), Flat(x), Flat(dout), Flat(d3)).ok());
  EXPECT_TRUE(SameBits(out1, out3));
  EXPECT_TRUE(SameBits(d1, d3));
}

std::vector<double> ReferenceSwiglu(int64_t n, int64_t f, const std::vector<double>& inp) {
  std::vector<double> out(n * f);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < f; ++i) {
      out[r * f + i] = Silu(inp[r * 2 * f + i]) * inp[r * 2 * f + f + i];
    }
  }
  return out;
}

TEST(SwigluTest, ForwardMatchesFloat64) {
  const int64_t n = 5, f = 70;
  std::vector<float> inp = RandomVector(n * 2 * f, 8, -8.0f, 8.0f), out(n * f);
  ASSERT_TRUE(SwigluForward(CpuContext(2), Tensor(inp.data(), DType::kF32, {n, 2 * f}),
                            Tensor(out.data(), DType::kF32, {n, f}))
                  .ok());
  // silu·up: FastExp's 2 ulp and four more roundings, all relative (nothing cancels).
  EXPECT_LE(MaxRelativeError(out, ReferenceSwiglu(n, f, ToDouble(inp)), 1e-6), 2e-6);
}

TEST(SwigluTest, BackwardMatchesFiniteDifferences) {
  const int64_t n = 3, f = 40;
  std::vector<float> inp = RandomVector(n * 2 * f, 9, -4.0f, 4.0f);
  std::vector<float> w = RandomVector(n * f, 10), dinp(n * 2 * f);
  ASSERT_TRUE(SwigluBackward(CpuContext(2), Tensor(inp.data(), DType::kF32, {n, 2 * f}),
                             Tensor(w.data(), DType::kF32, {n, f}),
                             Tensor(dinp.data(), DType::kF32, {n, 2 * f}))
                  .ok());
  auto loss = [&](const std::vector<double>& p) {
    const std::vector<double> out = ReferenceSwiglu(n, f, p);
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += w[i] * out[i];
    return l;
  };
  // As for GELU: a few f32 roundings of O(1) values against ~1e-9 of finite differences.
  EXPECT_LE(MaxRelativeError(dinp, FiniteDifferenceGradient(ToDouble(inp), loss)), 1e-5);
}

TEST(SwigluTest, BitwiseIndependentOfThreadCount) {
  const int64_t n = 33, f = 520;  // above the parallel threshold
  std::vector<float> inp = RandomVector(n * 2 * f, 11, -10.0f, 10.0f),
                     dout = RandomVector(n * f, 12);
  std::vector<std::vector<float>> out(2, std::vector<float>(n * f));
  std::vector<std::vector<float>> dinp(2, std::vector<float>(n * 2 * f));
  const int threads[2] = {1, 3};
  for (int k = 0; k < 2; ++k) {
    const Tensor in(inp.data(), DType::kF32, {n, 2 * f});
    ASSERT_TRUE(
        SwigluForward(CpuContext(threads[k]), in, Tensor(out[k].data(), DType::kF32, {n, f})).ok());
    ASSERT_TRUE(SwigluBackward(CpuContext(threads[k]), in, Tensor(dout.data(), DType::kF32, {n, f}),
                               Tensor(dinp[k].data(), DType::kF32, {n, 2 * f}))
                    .ok());
  }
  EXPECT_TRUE(SameBits(out[0], out[1]));
  EXPECT_TRUE(SameBits(dinp[0], dinp[1]));
}

constexpr DType kStorage[] = {DType::kF32, DType::kBF16, DType::kF16};

// 16-bit storage: the reference is evaluated in float64 on the values the op loads (the
// 16-bit-rounded inputs) and the op may differ by one rounding to the output dtype (one ulp
// allowed, for the reference's own double rounding) plus the f32 path's tolerance (1e-5
// relative, see ForwardMatchesFloat64; the floor 1e-3 stands for the absolute error of
// outputs near zero, which one output ulp already dominates there).
TEST(GeluTest, SixteenBitStorageMatchesFloat64) {
  const size_t n = 20000;  // above the parallel threshold, partial last chunk
  for (DType ti : kStorage) {
    for (DType to : kStorage) {
      if (ti == DType::kF32 && to == DType::kF32) continue;
      Stored x(RandomVector(n, 61, -6.0f, 6.0f), ti), dy(RandomVector(n, 62), to);
      Stored out(n, to), dx(n, ti);
      ASSERT_TRUE(GeluForward(CpuContext(2), x.View({100, 200}), out.View({100, 200})).ok());
      ASSERT_TRUE(GeluBackward(CpuContext(2), x.Flat(), dy.Flat(), dx.Flat()).ok());
      std::vector<double> want(n), dwant(n);
      for (size_t i = 0; i < n; ++i) {
        const double xi = x.Get(i);
        want[i] = Gelu(xi);
        // Central difference of the float64 GELU: truncation ~h², rounding ~1e-16/h.
        const double h = 1e-5;
        dwant[i] = (Gelu(xi + h) - Gelu(xi - h)) / (2 * h) * dy.Get(i);
      }
      EXPECT_EQ(CountOutsideUlp(out, want, 1e-5, 1e-3), 0) << DTypeName(ti) << DTypeName(to);
      // gelu' is a sum of O(1) terms that cancel near x ≈ −0.75, where its few f32 roundings
      // leave an absolute error (~1e-7) that 20000 samples do hit: the floor 0.1 measures it.
      EXPECT_EQ(CountOutsideUlp(dx, dwant, 1e-5, 0.1), 0) << DTypeName(ti) << DTypeName(to);
    }
  }
}

TEST(SwigluTest, SixteenBitStorageMatchesFloat64) {
  const int64_t n = 37, f = 300;
  for (DType ti : kStorage) {
    for (DType to : {DType::kBF16, DType::kF16}) {
      Stored inp(RandomVector(n * 2 * f, 63, -4.0f, 4.0f), ti), dy(RandomVector(n * f, 64), to);
      Stored out(n * f, to), dinp(n * 2 * f, ti);
      ASSERT_TRUE(SwigluForward(CpuContext(2), inp.View({n, 2 * f}), out.View({n, f})).ok());
      ASSERT_TRUE(SwigluBackward(CpuContext(2), inp.View({n, 2 * f}), dy.View({n, f}),
                                 dinp.View({n, 2 * f}))
                      .ok());
      const std::vector<double> x = inp.Doubles();
      std::vector<double> dwant(n * 2 * f);
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t i = 0; i < f; ++i) {
          const double g = x[r * 2 * f + i], u = x[r * 2 * f + f + i], d = dy.Get(r * f + i);
          const double s = 1.0 / (1.0 + std::exp(-g));
          dwant[r * 2 * f + i] = d * u * s * (1.0 + g * (1.0 - s));
          dwant[r * 2 * f + f + i] = d * Silu(g);
        }
      }
      // The f32 path's tolerance is 2e-6 relative (ForwardMatchesFloat64); the gradients'
      // few extra roundings stay within 1e-5, absolute (floor 0.1) where silu' cancels.
      EXPECT_EQ(CountOutsideUlp(out, ReferenceSwiglu(n, f, x), 2e-6, 1e-6), 0) << DTypeName(ti);
      EXPECT_EQ(CountOutsideUlp(dinp, dwant, 1e-5, 0.1), 0) << DTypeName(ti);
    }
  }
}

TEST(GeluTest, SixteenBitIndependentOfThreadCount) {
  const size_t n = 100003;
  Stored x(GeluInputs(n, 65), DType::kBF16);
  Stored one(x.size(), DType::kF16), three(x.size(), DType::kF16);
  ASSERT_TRUE(GeluForward(CpuContext(1), x.Flat(), one.Flat()).ok());
  ASSERT_TRUE(GeluForward(CpuContext(3), x.Flat(), three.Flat()).ok());
  EXPECT_TRUE(SameWords(one, three));
}

void ExpectInvalid(const absl::Status& st, const std::string& needle) {
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find(needle), std::string::npos) << st;
}

TEST(ActivationErrorsTest, BadArgumentsAreNamed) {
  std::vector<float> a(24), b(24), c(24);
  const DeviceContext ctx = CpuContext(1);
  ExpectInvalid(GeluForward(ctx, Tensor(a.data(), DType::kF32, {4, 6}),
                            Tensor(b.data(), DType::kF32, {6, 4})),
                "GeluForward: out has shape f32[6, 4], inp has f32[4, 6]");
  ExpectInvalid(
      GeluBackward(ctx, Tensor(a.data(), DType::kF32, {24}), Tensor(b.data(), DType::kI32, {24}),
                   Tensor(c.data(), DType::kF32, {24})),
      "GeluBackward: dout has dtype i32, expected one of f32, bf16, f16");
  ExpectInvalid(SwigluForward(ctx, Tensor(a.data(), DType::kF32, {8, 3}),
                              Tensor(b.data(), DType::kF32, {8, 1})),
                "SwigluForward: inp has shape f32[8, 3]; its last dimension must be even");
  ExpectInvalid(
      SwigluBackward(ctx, Tensor(a.data(), DType::kF32, {4, 6}),
                     Tensor(b.data(), DType::kF32, {4, 3}), Tensor(c.data(), DType::kF32, {4, 3})),
      "SwigluBackward: dinp has shape f32[4, 3], expected [4, 6]");
}

}  // namespace
}  // namespace zt
