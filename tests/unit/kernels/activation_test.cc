// kernels/activation: GELU (tanh approximation) and SwiGLU forward against float64, backward
// against finite differences of L = Σ w·out, in-place backward, thread-count determinism,
// errors.
#include "kernels/activation.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using testing::FiniteDifferenceGradient;
using testing::MaxRelativeError;
using testing::RandomVector;
using testing::SameBits;
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
      GeluBackward(ctx, Tensor(a.data(), DType::kF32, {24}), Tensor(b.data(), DType::kF16, {24}),
                   Tensor(c.data(), DType::kF32, {24})),
      "GeluBackward: dout has dtype f16");
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
