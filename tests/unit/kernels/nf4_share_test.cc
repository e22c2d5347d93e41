// kernels/nf4.h's kGroupIndexed format (a tensor-parallel share of a double-quantized weight):
// its layout arithmetic, its dequantization against a float64 reference and against the whole
// weight's dequantized slice bit for bit (row- and column-parallel shares, whose consecutive
// blocks lie in different groups of the whole weight), the NF4 linear layer over a share
// against the f32 linear layer over its dequantized weight, and the errors.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/nf4.h"
#include "kernels/nf4_linear.h"
#include "kernels/quantization.h"
#include "tests/unit/kernels/nf4_buffers.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using testing::Nf4Buffers;
using testing::RandomVector;

Tensor Flat(std::vector<float>& v) {
  return Tensor(v.data(), DType::kF32, {static_cast<int64_t>(v.size())});
}

// The whole weight (rows, cols) and its one-rank double quantization.
constexpr int64_t kRows = 96, kCols = 512;  // 768 blocks: 3 groups of 256

struct Whole {
  Whole() : q(kRows * kCols, Nf4Absmax::kDoubleQuantized), values(kRows * kCols) {
    // Rows of different magnitudes, so the groups' scales differ.
    std::vector<float> w = RandomVector(kRows * kCols, 7, -1.0f, 1.0f);
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t c = 0; c < kCols; ++c) w[r * kCols + c] *= 0.01f * static_cast<float>(1 + r);
    }
    const DeviceContext ctx = CpuContext(2);
    EXPECT_TRUE(Nf4Quantize(ctx, {.src = Flat(w), .dst = q.View()}).ok());
    EXPECT_TRUE(Nf4Dequantize(ctx, {.src = q.View(), .dst = Flat(values)}).ok());
  }
  Nf4Buffers q;
  std::vector<float> values;  // dequantized
};

uint8_t CodeAt(const std::vector<uint8_t>& codes, int64_t i) {
  return i % 2 == 0 ? codes[i / 2] >> 4 : codes[i / 2] & 0xF;
}

Nf4Buffers Share(const Whole& whole, int64_t row_begin, int64_t rows, int64_t col_begin,
                 int64_t cols) {
  return testing::Nf4ShareOf(whole.q, kCols, row_begin, rows, col_begin, cols);
}

TEST(Nf4ShareTest, LayoutArithmetic) {
  // A quarter of 4096 x 4096 by columns: 4096 rows of 1,024 columns (16 blocks a row).
  const int64_t whole = int64_t{4096} * 4096, n = whole / 4;
  const Nf4Layout l =
      Nf4LayoutFor(n, Nf4Absmax::kGroupIndexed, {.row_blocks = 16, .whole_numel = whole});
  EXPECT_EQ(l.code_bytes, n / 2);
  EXPECT_EQ(l.blocks, n / 64);
  EXPECT_EQ(l.absmax_groups, whole / 64 / 256);  // the whole weight's groups
  EXPECT_EQ(l.rows, 4096);
  EXPECT_EQ(l.total_bytes, n / 2 + n / 64 + 4 * (whole / 64 / 256) + 4 + 4 * 4096);
  // 8/64 for the codes, 32 bits a share row of 1,024 weights, the whole weight's group scales
  // over a quarter of its weights, μ: 0.125 + 0.03125 + 4 · 0.00195 = 0.164 bits/weight.
  const double overhead = 8.0 * static_cast<double>(l.total_bytes - l.code_bytes) / n;
  EXPECT_NEAR(overhead, 8.0 / 64 + 32.0 / 1024 + 4 * 32.0 / (64 * 256) + 32.0 / n, 1e-12);
}

// A row-parallel share (a quarter of each row's columns) and a column-parallel one (a range of
// whole rows): each element reads back as the whole weight's dequantized element bit for bit,
// and as levels[c] · fma(map[k], s_g, μ) of the whole weight's block within 2^-23 relative
// (float64 reference: the kernel rounds A_b once (fma) and the product once).
TEST(Nf4ShareTest, DequantizesToTheWholeWeightsSlice) {
  const Whole whole;
  struct Case {
    int64_t row_begin, rows, col_begin, cols;
  };
  for (const Case& c : {Case{0, kRows, 128, 128}, Case{0, kRows, 384, 128},
                        Case{0, kRows, 256, 256}, Case{20, 40, 0, kCols}}) {
    Nf4Buffers share = Share(whole, c.row_begin, c.rows, c.col_begin, c.cols);
    std::vector<float> back(static_cast<size_t>(c.rows * c.cols), -7.0f);
    for (int threads : {1, 3}) {
      ASSERT_TRUE(
          Nf4Dequantize(CpuContext(threads), {.src = share.View(), .dst = Flat(back)}).ok());
      for (int64_t r = 0; r < c.rows; ++r) {
        for (int64_t col = 0; col < c.cols; ++col) {
          const int64_t g = (c.row_begin + r) * kCols + c.col_begin + col;
          const float got = back[r * c.cols + col];
          ASSERT_EQ(std::memcmp(&got, &whole.values[g], sizeof(float)), 0)
              << "row " << r << " col " << col << " (whole element " << g << ")";
          const int64_t b = g / kNf4Block;
          const double a = double{DynamicMapSigned()[whole.q.absmax_codes()[b]]} *
                               whole.q.scale()[b / kNf4AbsmaxGroup] +
                           whole.q.offset();
          const double want = double{Nf4Levels()[CodeAt(whole.q.codes(), g)]} * a;
          ASSERT_LE(std::abs(got - want), 2.5e-7 * std::abs(want) + 1e-30) << g;
        }
      }
    }
  }
}

// The frozen NF4 linear layer over a row-parallel share (W (N, K) = 96 x 128, its blocks in the
// whole weight's three groups) against the float64 linear over the share's dequantized weight
// (the whole weight's slice, checked above), forward and backward.
TEST(Nf4ShareTest, LinearOverAShareIsTheLinearOverItsDequantizedWeight) {
  const Whole whole;
  const int64_t m = 5, n = kRows, k = 128;
  Nf4Buffers share = Share(whole, 0, n, 256, k);
  std::vector<float> w(static_cast<size_t>(n * k)), inp = RandomVector(m * k, 3);
  std::vector<float> bias = RandomVector(n, 4), dout = RandomVector(m * n, 5);
  std::vector<float> out(m * n, -7.0f), dinp(m * k, -7.0f);
  ASSERT_TRUE(Nf4Dequantize(CpuContext(2), {.src = share.View(), .dst = Flat(w)}).ok());
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) ASSERT_EQ(w[r * k + c], whole.values[r * kCols + 256 + c]);
  }
  DeviceContext ctx = CpuContext(2);
  std::vector<uint8_t> workspace(
      static_cast<size_t>(Nf4LinearWorkspaceBytes(ctx, m, k, n).value()));
  ctx.workspace = {.data = workspace.data(), .bytes = static_cast<int64_t>(workspace.size())};
  ASSERT_TRUE(Nf4LinearForward(ctx, {.inp = Tensor(inp.data(), DType::kF32, {m, k}),
                                     .weight = share.View(),
                                     .bias = Tensor(bias.data(), DType::kF32, {n}),
                                     .out = Tensor(out.data(), DType::kF32, {m, n})})
                  .ok());
  ASSERT_TRUE(Nf4LinearBackward(ctx, {.dout = Tensor(dout.data(), DType::kF32, {m, n}),
                                      .weight = share.View(),
                                      .dinp = Tensor(dinp.data(), DType::kF32, {m, k})})
                  .ok());
  std::vector<double> want_out(m * n), want_dinp(m * k, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = bias[j];
      for (int64_t c = 0; c < k; ++c) {
        acc += double{inp[i * k + c]} * w[j * k + c];
        want_dinp[i * k + c] += double{dout[i * n + j]} * w[j * k + c];
      }
      want_out[i * n + j] = acc;
    }
  }
  // f32 sums of K = 128 (forward) and N = 96 (backward) products: 128 · 2^-24 = 7.6e-6
  // relative to the largest output bounds the accumulation error.
  EXPECT_LT(testing::MaxErrorOverLargest(out, want_out), 7.7e-6);
  EXPECT_LT(testing::MaxErrorOverLargest(dinp, want_dinp), 7.7e-6);
}

TEST(Nf4ShareTest, ErrorsNameTheBufferAndTheRule) {
  const DeviceContext ctx = CpuContext(1);
  std::vector<float> src(256, 0.5f);
  Nf4Buffers share(256, Nf4Absmax::kGroupIndexed, {.row_blocks = 2, .whole_numel = 1024});
  absl::Status s = Nf4Quantize(ctx, {.src = Flat(src), .dst = share.View()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("kGroupIndexed"), std::string::npos) << s;

  Nf4Tensor rows = share.View();
  rows.share.row_blocks = 3;  // 256 is no multiple of 3 · 64
  s = Nf4Dequantize(ctx, {.src = rows, .dst = Flat(src)});
  EXPECT_NE(s.message().find("row_blocks"), std::string::npos) << s;

  Nf4Tensor no_base = share.View();
  no_base.block_base = Tensor();
  s = Nf4Dequantize(ctx, {.src = no_base, .dst = Flat(src)});
  EXPECT_NE(s.message().find("src.block_base"), std::string::npos) << s;

  Nf4Buffers dq(256, Nf4Absmax::kDoubleQuantized);
  Nf4Tensor stray = dq.View();
  stray.block_base = share.View().block_base;
  s = Nf4Dequantize(ctx, {.src = stray, .dst = Flat(src)});
  EXPECT_NE(s.message().find("block_base must be empty"), std::string::npos) << s;
}

}  // namespace
}  // namespace zt
