// kernels/int8_linear: LLM.int8() weight quantization, the forward against the f32 linear layer
// within the bound the quantization steps give, the outlier decomposition (an outlier column
// enters in full precision; without the decomposition it would not), the input gradient
// against finite differences, the read-back weight (Int8DequantizeWeight), errors.
#include "kernels/int8_linear.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using testing::FiniteDifferenceGradient;
using testing::MaxErrorOverLargest;
using testing::RandomVector;
using testing::ToDouble;

Tensor View(std::vector<float>& v, std::initializer_list<int64_t> shape) {
  return Tensor(v.data(), DType::kF32, shape);
}

// A quantized (N, K) weight with its storage.
struct Weight {
  Weight(std::vector<float> w, int64_t n, int64_t k)
      : n(n), k(k), original(std::move(w)), codes(n * k), scales(n) {
    EXPECT_TRUE(
        Int8QuantizeWeight(CpuContext(2), {.src = View(original, {n, k}), .dst = Quantized()})
            .ok());
  }
  Int8Weight Quantized() {
    return {.codes = Tensor(codes.data(), DType::kU8, {n, k}),
            .scales = Tensor(scales.data(), DType::kF32, {n})};
  }
  int code(int64_t r, int64_t c) const { return static_cast<int8_t>(codes[r * k + c]); }
  // The read-back weight Wq · w_n / 127, in float64.
  double read(int64_t r, int64_t c) const { return code(r, c) * double{scales[r]} / 127; }

  int64_t n, k;
  std::vector<float> original;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};

class Workspace {
 public:
  Workspace(int64_t m, int64_t k) : bytes_(Int8LinearWorkspaceBytes(m, k)) {
    ctx_ = CpuContext(2);
    ctx_.workspace = {.data = bytes_.data(), .bytes = static_cast<int64_t>(bytes_.size())};
  }
  const DeviceContext& ctx() const { return ctx_; }

 private:
  std::vector<uint8_t> bytes_;
  DeviceContext ctx_;
};

TEST(Int8QuantizeWeightTest, RowWiseAbsmaxCodes) {
  const int64_t n = 5, k = 33;
  Weight w(RandomVector(n * k, 1, -2.0f, 2.0f), n, k);
  for (int64_t r = 0; r < n; ++r) {
    double amax = 0;
    for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::abs(double{w.original[r * k + c]}));
    EXPECT_EQ(w.scales[r], amax) << "row " << r;
    for (int64_t c = 0; c < k; ++c) {
      const double exact = 127.0 * w.original[r * k + c] / amax;
      // Nearest integer; the f32 product x · (127 / w) is within 2^-22 relative of exact.
      EXPECT_LE(std::abs(w.code(r, c) - exact), 0.5 + 1e-4) << r << ", " << c;
      if (std::abs(w.original[r * k + c]) == amax) EXPECT_EQ(std::abs(w.code(r, c)), 127);
    }
  }
}

// No outliers (|x| < 1 < 6): out against the float64 linear layer over the original W. With
// x = x̂ + e_x, |e_x| ≤ x_m / 254 and w = ŵ + e_w, |e_w| ≤ w_n / 254 (half a step each),
// |x·w − x̂·ŵ| ≤ |e_x|·|w| + |x̂|·|e_w|, summed over k: the bound each output is checked
// against, plus f32 rounding of the scale product (1e-6 of the output's scale).
TEST(Int8LinearTest, ForwardWithinTheQuantizationBound) {
  const int64_t m = 6, k = 96, n = 40;
  Weight w(RandomVector(n * k, 2, -0.5f, 0.5f), n, k);
  std::vector<float> inp = RandomVector(m * k, 3), bias = RandomVector(n, 4);
  std::vector<float> out(m * n);
  Workspace ws(m, k);
  ASSERT_TRUE(Int8LinearForward(ws.ctx(), {.inp = View(inp, {m, k}),
                                           .weight = w.Quantized(),
                                           .bias = View(bias, {n}),
                                           .out = View(out, {m, n})})
                  .ok());
  for (int64_t r = 0; r < m; ++r) {
    double x_max = 0;
    for (int64_t c = 0; c < k; ++c) x_max = std::max(x_max, std::abs(double{inp[r * k + c]}));
    for (int64_t j = 0; j < n; ++j) {
      double want = bias[j], bound = 0, scale = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double x = inp[r * k + c], wv = w.original[j * k + c];
        want += x * wv;
        bound += x_max / 254 * std::abs(wv) + (std::abs(x) + x_max / 254) * w.scales[j] / 254;
        scale += std::abs(x * wv);
      }
      EXPECT_LE(std::abs(out[r * n + j] - want), bound + 1e-6 * (scale + std::abs(bias[j])))
          << r << ", " << j;
    }
  }
}

// Inputs on the int8 grid (row maximum exactly 1, so x_m = 1 and every x̂ = x) and a weight on
// it (w_n = 1): the int8 part is then exact, and the only inexact inputs are the outlier
// columns (37.3 in every row, −8.5 in one). With the decomposition the output equals the float64
// product up to f32 rounding; without it (threshold +inf) the outlier sets the row's scale and
// every other feature loses most of its bits.
TEST(Int8LinearTest, OutlierColumnIsComputedInFullPrecision) {
  const int64_t m = 4, k = 64, n = 8, outlier = 17;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> level(-126, 126);
  std::vector<float> inp(m * k), wv(n * k);
  for (int64_t i = 0; i < m * k; ++i) inp[i] = level(rng) / 127.0f;
  for (int64_t i = 0; i < n * k; ++i) wv[i] = static_cast<float>(level(rng)) / 127.0f;
  for (int64_t r = 0; r < m; ++r) inp[r * k + (r + 3) % k] = 1.0f;  // x_m = 1
  for (int64_t j = 0; j < n; ++j) wv[j * k + (j + 5) % k] = -1.0f;  // w_n = 1
  for (int64_t r = 0; r < m; ++r) inp[r * k + outlier] = r == 2 ? -37.3f : 37.3f;
  inp[1 * k + 40] = -8.5f;  // a second outlier column, from one token only
  Weight w(wv, n, k);
  std::vector<double> want(m * n, 0.0);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t c = 0; c < k; ++c) want[r * n + j] += double{inp[r * k + c]} * w.read(j, c);
    }
  }
  Workspace ws(m, k);
  std::vector<float> out(m * n);
  ASSERT_TRUE(
      Int8LinearForward(
          ws.ctx(), {.inp = View(inp, {m, k}), .weight = w.Quantized(), .out = View(out, {m, n})})
          .ok());
  // The int8 sum is exact, the scale product 1/127² and the outlier term each round once in
  // f32: a few ulps of the O(40) outputs.
  EXPECT_LT(MaxErrorOverLargest(out, want), 1e-6);

  ASSERT_TRUE(
      Int8LinearForward(ws.ctx(), {.inp = View(inp, {m, k}),
                                   .weight = w.Quantized(),
                                   .out = View(out, {m, n}),
                                   .outlier_threshold = std::numeric_limits<float>::infinity()})
          .ok());
  // Quantized with a scale of 37.3, the other 63 features are off by up to 0.15 each.
  EXPECT_GT(MaxErrorOverLargest(out, want), 1e-3);
}

// dinp = dout · W̃ is the gradient of Σ dout ∘ (inp · W̃ᵀ): finite differences of that float64
// scalar over the read-back weight, and the accumulate mode.
TEST(Int8LinearTest, InputGradientMatchesFiniteDifferences) {
  const int64_t m = 3, k = 20, n = 9;
  Weight w(RandomVector(n * k, 6), n, k);
  std::vector<float> inp = RandomVector(m * k, 7), dout = RandomVector(m * n, 8);
  std::vector<float> dinp(m * k, 5.0f);
  ASSERT_TRUE(Int8LinearBackward(
                  CpuContext(2),
                  {.dout = View(dout, {m, n}), .weight = w.Quantized(), .dinp = View(dinp, {m, k})})
                  .ok());
  const std::vector<double> fd =
      FiniteDifferenceGradient(ToDouble(inp), [&](const std::vector<double>& x) {
        double total = 0;
        for (int64_t r = 0; r < m; ++r) {
          for (int64_t j = 0; j < n; ++j) {
            double y = 0;
            for (int64_t c = 0; c < k; ++c) y += x[r * k + c] * w.read(j, c);
            total += dout[r * n + j] * y;
          }
        }
        return total;
      });
  // Linear loss: the differences are exact to ~1e-10; the kernel sums N = 9 f32 terms.
  EXPECT_LT(MaxErrorOverLargest(dinp, fd), 1e-6);
  std::vector<float> added(m * k, 0.25f);
  ASSERT_TRUE(Int8LinearBackward(CpuContext(2), {.dout = View(dout, {m, n}),
                                                 .weight = w.Quantized(),
                                                 .dinp = View(added, {m, k}),
                                                 .dinp_mode = Accumulate::kAdd})
                  .ok());
  for (int64_t i = 0; i < m * k; ++i) EXPECT_EQ(added[i], 0.25f + dinp[i]) << i;
}

// W̃ as the layer computes with it: each element the f32 product of its code and w_n / 127,
// and a forward whose every column is an outlier (threshold below every |x|) is inp · W̃ᵀ.
TEST(Int8LinearTest, DequantizeGivesTheReadBackWeightTheLayerComputesWith) {
  const int64_t m = 5, k = 24, n = 7;
  Weight w(RandomVector(n * k, 12, -3.0f, 3.0f), n, k);
  std::vector<float> read_back(n * k, -1.0f);
  ASSERT_TRUE(
      Int8DequantizeWeight(CpuContext(2), {.src = w.Quantized(), .dst = View(read_back, {n, k})})
          .ok());
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      EXPECT_EQ(read_back[r * k + c], static_cast<float>(w.code(r, c)) * (w.scales[r] / 127.0f))
          << r << ", " << c;
      // One more f32 rounding than the float64 read-back: a few ulps.
      EXPECT_NEAR(read_back[r * k + c], w.read(r, c), 1e-6 * w.scales[r]) << r << ", " << c;
    }
  }
  std::vector<float> inp = RandomVector(m * k, 13), out(m * n);
  Workspace ws(m, k);
  ASSERT_TRUE(Int8LinearForward(ws.ctx(), {.inp = View(inp, {m, k}),
                                           .weight = w.Quantized(),
                                           .out = View(out, {m, n}),
                                           .outlier_threshold = 1e-30f})
                  .ok());
  std::vector<double> want(m * n, 0.0);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t c = 0; c < k; ++c) want[r * n + j] += double{inp[r * k + c]} * w.read(j, c);
    }
  }
  // K = 24 f32 products summed in f32.
  EXPECT_LT(MaxErrorOverLargest(out, want), 1e-6);
  std::vector<float> wrong(n * (k + 1));
  EXPECT_NE(
      Int8DequantizeWeight(CpuContext(1), {.src = w.Quantized(), .dst = View(wrong, {n, k + 1})})
          .message()
          .find("weight.codes"),
      std::string::npos);
}

TEST(Int8LinearTest, ErrorsNameTheArgument) {
  const int64_t m = 2, k = 8, n = 3;
  Weight w(RandomVector(n * k, 9), n, k);
  std::vector<float> inp(m * k), out(m * n);
  Workspace ws(m, k);
  absl::Status s = Int8LinearForward(ws.ctx(), {.inp = View(inp, {m, k}),
                                                .weight = w.Quantized(),
                                                .out = View(out, {m, n}),
                                                .outlier_threshold = 0.0f});
  EXPECT_NE(s.message().find("outlier_threshold is 0"), std::string::npos) << s;
  s = Int8LinearForward(
      CpuContext(1), {.inp = View(inp, {m, k}), .weight = w.Quantized(), .out = View(out, {m, n})});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  std::vector<float> wide(m * (k + 1));
  s = Int8LinearForward(
      ws.ctx(), {.inp = View(wide, {m, k + 1}), .weight = w.Quantized(), .out = View(out, {m, n})});
  EXPECT_NE(s.message().find("weight.codes"), std::string::npos) << s;
  std::vector<float> bad = {1.0f, std::numeric_limits<float>::infinity()};
  std::vector<uint8_t> codes(2);
  std::vector<float> scales(1);
  s = Int8QuantizeWeight(CpuContext(1),
                         {.src = View(bad, {1, 2}),
                          .dst = {.codes = Tensor(codes.data(), DType::kU8, {1, 2}),
                                  .scales = Tensor(scales.data(), DType::kF32, {1})}});
  EXPECT_NE(s.message().find("src[0, 1]"), std::string::npos) << s;
}

}  // namespace
}  // namespace zt
