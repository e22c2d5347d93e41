// kernels/nf4_linear: the frozen NF4 linear layer against the f32 linear layer over the
// dequantized weight and a float64 reference, its input gradient against finite differences,
// 16-bit activations, partial tiles, the bounded workspace, errors.
#include "kernels/nf4_linear.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/linear.h"
#include "kernels/nf4.h"
#include "tests/unit/kernels/nf4_buffers.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using testing::FiniteDifferenceGradient;
using testing::MaxErrorOverLargest;
using testing::Nf4Buffers;
using testing::RandomVector;
using testing::ToDouble;

Tensor View(std::vector<float>& v, std::initializer_list<int64_t> shape) {
  return Tensor(v.data(), DType::kF32, shape);
}

// A context owning a workspace of `bytes`.
class OwnedContext {
 public:
  explicit OwnedContext(int64_t bytes, int threads = 2)
      : ctx_(CpuContext(threads)), workspace_(static_cast<size_t>(bytes)) {
    ctx_.workspace = {.data = workspace_.data(), .bytes = bytes};
  }
  const DeviceContext& ctx() const { return ctx_; }

 private:
  DeviceContext ctx_;
  std::vector<uint8_t> workspace_;
};

// W (N, K) quantized (double-quantized) and its dequantized f32 copy.
struct QuantizedWeight {
  QuantizedWeight(int64_t n, int64_t k, uint32_t seed)
      : buffers(n * k, Nf4Absmax::kDoubleQuantized), dequantized(n * k) {
    std::vector<float> w = RandomVector(n * k, seed, -0.1f, 0.1f);
    const DeviceContext ctx = CpuContext(2);
    EXPECT_TRUE(Nf4Quantize(ctx, {.src = View(w, {n * k}), .dst = buffers.View()}).ok());
    EXPECT_TRUE(
        Nf4Dequantize(ctx, {.src = buffers.View(), .dst = View(dequantized, {n * k})}).ok());
  }
  Nf4Buffers buffers;
  std::vector<float> dequantized;
};

// Shapes with a partial last tile on both axes (N = 1100 = 512 + 512 + 76, K = 600 = 512 + 88)
// and K not a multiple of 64, so NF4 blocks cross rows of W and tiles cut through blocks.
constexpr int64_t kM = 7, kK = 600, kN = 1100;

int64_t Workspace(int64_t m, int64_t k, int64_t n, const LinearDTypes& dtypes = {}) {
  return Nf4LinearWorkspaceBytes(CpuContext(2), m, k, n, dtypes).value();
}

TEST(Nf4LinearTest, ForwardEqualsTheLinearLayerOverTheDequantizedWeight) {
  QuantizedWeight w(kN, kK, 1);
  std::vector<float> inp = RandomVector(kM * kK, 2), bias = RandomVector(kN, 3);
  std::vector<float> out(kM * kN, -7.0f), ref(kM * kN);
  OwnedContext owned(Workspace(kM, kK, kN));
  ASSERT_TRUE(Nf4LinearForward(owned.ctx(), {.inp = View(inp, {kM, kK}),
                                             .weight = w.buffers.View(),
                                             .bias = View(bias, {kN}),
                                             .out = View(out, {kM, kN})})
                  .ok());
  // The float64 reference over the dequantized W.
  std::vector<double> want(kM * kN);
  for (int64_t m = 0; m < kM; ++m) {
    for (int64_t n = 0; n < kN; ++n) {
      double acc = bias[n];
      for (int64_t k = 0; k < kK; ++k) acc += double{inp[m * kK + k]} * w.dequantized[n * kK + k];
      want[m * kN + n] = acc;
    }
  }
  // f32 sums of K = 600 products: K · 2^-24 relative to the largest output bounds the
  // accumulation error (3.6e-5); random signs keep it far below.
  EXPECT_LT(MaxErrorOverLargest(out, want), 3.6e-5);
  // The f32 linear layer over the dequantized W (the GEMM may sum in another order).
  OwnedContext lin(LinearWorkspaceBytes(CpuContext(2), kM, kK, kN).value());
  ASSERT_TRUE(LinearForward(lin.ctx(), {.inp = View(inp, {kM, kK}),
                                        .weight = View(w.dequantized, {kN, kK}),
                                        .bias = View(bias, {kN}),
                                        .out = View(ref, {kM, kN})})
                  .ok());
  EXPECT_LT(MaxErrorOverLargest(out, ToDouble(ref)), 3.6e-5);
}

// dinp = dout · W is the gradient of Σ dout ∘ (inp · Wᵀ) with respect to inp: central finite
// differences of that float64 scalar, and the accumulate mode. K = 600 is two column tiles.
TEST(Nf4LinearTest, InputGradientMatchesFiniteDifferences) {
  const int64_t m = 2, k = 600, n = 150;
  QuantizedWeight w(n, k, 4);
  std::vector<float> inp = RandomVector(m * k, 5), dout = RandomVector(m * n, 6);
  std::vector<float> dinp(m * k, 123.0f);
  OwnedContext owned(Workspace(m, k, n));
  ASSERT_TRUE(Nf4LinearBackward(owned.ctx(), {.dout = View(dout, {m, n}),
                                              .weight = w.buffers.View(),
                                              .dinp = View(dinp, {m, k})})
                  .ok());
  const auto loss = [&](const std::vector<double>& x) {
    double total = 0;
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < n; ++c) {
        double y = 0;
        for (int64_t j = 0; j < k; ++j) y += x[r * k + j] * w.dequantized[c * k + j];
        total += dout[r * n + c] * y;
      }
    }
    return total;
  };
  const std::vector<double> fd = FiniteDifferenceGradient(ToDouble(inp), loss);
  // The loss is linear in inp, so the differences are exact up to float64 cancellation
  // (~1e-10 here); the kernel's f32 sums of N = 150 terms bound the rest (150 · 2^-24).
  EXPECT_LT(MaxErrorOverLargest(dinp, fd), 1e-5);

  std::vector<float> added(m * k, 0.5f);
  ASSERT_TRUE(Nf4LinearBackward(owned.ctx(), {.dout = View(dout, {m, n}),
                                              .weight = w.buffers.View(),
                                              .dinp = View(added, {m, k}),
                                              .dinp_mode = Accumulate::kAdd})
                  .ok());
  for (int64_t i = 0; i < m * k; ++i) EXPECT_EQ(added[i], 0.5f + dinp[i]) << i;
}

// bf16 activations: the same numbers as the f32 path, rounded once to bf16.
TEST(Nf4LinearTest, Bf16ActivationsRoundOnce) {
  QuantizedWeight w(kN, kK, 7);
  std::vector<float> inp = RandomVector(kM * kK, 8);
  std::vector<uint16_t> inp16(kM * kK), out16(kM * kN);
  for (int64_t i = 0; i < kM * kK; ++i) {
    inp16[i] = FloatToBf16(inp[i]);
    inp[i] = Bf16ToFloat(inp16[i]);
  }
  std::vector<float> out(kM * kN);
  OwnedContext owned(
      Workspace(kM, kK, kN, {.inp = DType::kBF16, .out = DType::kBF16, .dout = DType::kBF16}));
  ASSERT_TRUE(Nf4LinearForward(owned.ctx(), {.inp = View(inp, {kM, kK}),
                                             .weight = w.buffers.View(),
                                             .out = View(out, {kM, kN})})
                  .ok());
  ASSERT_TRUE(Nf4LinearForward(owned.ctx(), {.inp = Tensor(inp16.data(), DType::kBF16, {kM, kK}),
                                             .weight = w.buffers.View(),
                                             .out = Tensor(out16.data(), DType::kBF16, {kM, kN})})
                  .ok());
  for (int64_t i = 0; i < kM * kN; ++i) EXPECT_EQ(out16[i], FloatToBf16(out[i])) << i;
}

// The workspace holds tiles, never W: for a 4096 × 4096 layer (64 MiB dequantized) it is the
// 8 MiB tile, the (M, tile) result and the GEMM's scratch, under a quarter of W. One byte
// short is refused.
TEST(Nf4LinearTest, WorkspaceIsBoundedByTilesNotByTheWeight) {
  const int64_t k = 4096, n = 4096, m = 16;
  const int64_t bytes = Workspace(m, k, n);
  EXPECT_LT(bytes, 4 * n * k / 4);
  EXPECT_GE(bytes, 4 * kNf4LinearTile * k + 4 * m * kNf4LinearTile);

  QuantizedWeight w(kN, kK, 9);
  std::vector<float> inp = RandomVector(kM * kK, 10), out(kM * kN);
  OwnedContext small(Workspace(kM, kK, kN) - 1);
  const absl::Status s = Nf4LinearForward(
      small.ctx(),
      {.inp = View(inp, {kM, kK}), .weight = w.buffers.View(), .out = View(out, {kM, kN})});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("Nf4LinearWorkspaceBytes"), std::string::npos) << s;
}

TEST(Nf4LinearTest, ErrorsNameTheArgument) {
  QuantizedWeight w(kN, kK, 11);
  std::vector<float> inp(kM * (kK + 1)), out(kM * kN), dinp(kM * kK), dout(kM * kN);
  OwnedContext owned(Workspace(kM, kK + 1, kN));
  absl::Status s = Nf4LinearForward(
      owned.ctx(),
      {.inp = View(inp, {kM, kK + 1}), .weight = w.buffers.View(), .out = View(out, {kM, kN})});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("weight.numel is 660000"), std::string::npos) << s;
  s = Nf4LinearBackward(
      owned.ctx(),
      {.dout = View(dout, {kM, kN}), .weight = w.buffers.View(), .dinp = View(dinp, {kM - 1, kK})});
  EXPECT_NE(s.message().find("rows M differ"), std::string::npos) << s;
  std::vector<float> bias(kN - 1);
  s = Nf4LinearForward(owned.ctx(), {.inp = View(inp, {kM, kK}),
                                     .weight = w.buffers.View(),
                                     .bias = View(bias, {kN - 1}),
                                     .out = View(out, {kM, kN})});
  EXPECT_NE(s.message().find("bias"), std::string::npos) << s;
}

}  // namespace
}  // namespace zt
