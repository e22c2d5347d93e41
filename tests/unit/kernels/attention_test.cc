// Tests of kernels/attention.h: causal flash attention with grouped key/value heads against a
// float64 reference, its backward against central finite differences and an analytic float64
// backward, bitwise determinism over thread counts, and argument checks.
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/kernels/mixed_check.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using ::zt::testing::CountOutsideUlp;
using ::zt::testing::FiniteDifferenceGradient;
using ::zt::testing::MaxRelativeError;
using ::zt::testing::RandomVector;
using ::zt::testing::SameBits;
using ::zt::testing::SameWords;
using ::zt::testing::Stored;
using ::zt::testing::ToDouble;

struct Shape {
  int b, t, h, hkv, d;
  int heads() const { return h + 2 * hkv; }
  int64_t qkv_size() const { return int64_t{b} * t * heads() * d; }
  int64_t out_size() const { return int64_t{b} * t * h * d; }
  int64_t lse_size() const { return int64_t{b} * h * t; }
};

std::string Name(const Shape& s) {
  return "B" + std::to_string(s.b) + "_T" + std::to_string(s.t) + "_H" + std::to_string(s.h) +
         "_Hkv" + std::to_string(s.hkv) + "_D" + std::to_string(s.d);
}

void PrintTo(const Shape& s, std::ostream* os) { *os << Name(s); }

// Element offsets of q, k, v of head h (k, v: key/value head) at (b, t) in the packed qkv.
struct Index {
  const Shape& s;
  int64_t row(int b, int t) const { return (int64_t{b} * s.t + t) * s.heads() * s.d; }
  int64_t q(int b, int t, int h) const { return row(b, t) + int64_t{h} * s.d; }
  int64_t k(int b, int t, int g) const { return row(b, t) + int64_t{s.h + g} * s.d; }
  int64_t v(int b, int t, int g) const { return row(b, t) + int64_t{s.h + s.hkv + g} * s.d; }
  int64_t o(int b, int t, int h) const { return (int64_t{b} * s.t + t) * s.h * s.d + h * s.d; }
};

// Scaled causal scores of query i of head h against keys 0..i, in float64.
std::vector<double> Scores(const Shape& s, const std::vector<double>& qkv, int b, int h, int i) {
  const Index ix{s};
  const int g = h / (s.h / s.hkv);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  std::vector<double> sc(i + 1);
  for (int j = 0; j <= i; ++j) {
    double acc = 0;
    for (int d = 0; d < s.d; ++d) acc += qkv[ix.q(b, i, h) + d] * qkv[ix.k(b, j, g) + d];
    sc[j] = acc * scale;
  }
  return sc;
}

// Softmax of the scores and its log-sum-exp.
std::vector<double> Probabilities(const std::vector<double>& sc, double* lse) {
  const double mx = *std::max_element(sc.begin(), sc.end());
  double sum = 0;
  for (double x : sc) sum += std::exp(x - mx);
  *lse = mx + std::log(sum);
  std::vector<double> p(sc.size());
  for (size_t j = 0; j < sc.size(); ++j) p[j] = std::exp(sc[j] - *lse);
  return p;
}

void AttentionRef(const Shape& s, const std::vector<double>& qkv, std::vector<double>* out,
                  std::vector<double>* lse) {
  const Index ix{s};
  out->assign(s.out_size(), 0.0);
  lse->assign(s.lse_size(), 0.0);
  for (int b = 0; b < s.b; ++b) {
    for (int h = 0; h < s.h; ++h) {
      const int g = h / (s.h / s.hkv);
      for (int i = 0; i < s.t; ++i) {
        double l;
        const std::vector<double> p = Probabilities(Scores(s, qkv, b, h, i), &l);
        (*lse)[(int64_t{b} * s.h + h) * s.t + i] = l;
        for (int j = 0; j <= i; ++j) {
          for (int d = 0; d < s.d; ++d) (*out)[ix.o(b, i, h) + d] += p[j] * qkv[ix.v(b, j, g) + d];
        }
      }
    }
  }
}

// The gradient of Σ dout·out with respect to qkv, derived by hand, in float64. With `out`
// given, Di = rowsum(dout ∘ out) is taken from it, as the kernel does from its saved output
// (a 16-bit out is the exact output rounded); otherwise from the exact probabilities.
std::vector<double> AttentionBackwardRef(const Shape& s, const std::vector<double>& qkv,
                                         const std::vector<double>& dout,
                                         const std::vector<double>* out = nullptr) {
  const Index ix{s};
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  std::vector<double> dqkv(s.qkv_size(), 0.0);
  for (int b = 0; b < s.b; ++b) {
    for (int h = 0; h < s.h; ++h) {
      const int g = h / (s.h / s.hkv);
      for (int i = 0; i < s.t; ++i) {
        double l;
        const std::vector<double> p = Probabilities(Scores(s, qkv, b, h, i), &l);
        std::vector<double> dp(i + 1);
        double di = 0;
        for (int j = 0; j <= i; ++j) {
          double acc = 0;
          for (int d = 0; d < s.d; ++d) acc += dout[ix.o(b, i, h) + d] * qkv[ix.v(b, j, g) + d];
          dp[j] = acc;
          di += p[j] * acc;
        }
        if (out != nullptr) {
          di = 0;
          for (int d = 0; d < s.d; ++d) di += dout[ix.o(b, i, h) + d] * (*out)[ix.o(b, i, h) + d];
        }
        for (int j = 0; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - di) * scale;
          for (int d = 0; d < s.d; ++d) {
            dqkv[ix.q(b, i, h) + d] += ds * qkv[ix.k(b, j, g) + d];
            dqkv[ix.k(b, j, g) + d] += ds * qkv[ix.q(b, i, h) + d];
            dqkv[ix.v(b, j, g) + d] += p[j] * dout[ix.o(b, i, h) + d];
          }
        }
      }
    }
  }
  return dqkv;
}

struct Buffers {
  std::vector<float> qkv, out, lse, dout, dqkv;
};

Buffers MakeBuffers(const Shape& s, uint32_t seed) {
  // Entries up to ±1.5 make scores spread over a few units, so the softmax is far from
  // uniform and the online rescaling across key tiles matters.
  return {RandomVector(s.qkv_size(), seed, -1.5f, 1.5f), std::vector<float>(s.out_size()),
          std::vector<float>(s.lse_size()), RandomVector(s.out_size(), seed + 1),
          std::vector<float>(s.qkv_size())};
}

absl::Status Forward(const Shape& s, Buffers& buf, int threads = 2) {
  return AttentionForward(
      CpuContext(threads),
      {.qkv = Tensor(buf.qkv.data(), DType::kF32, {s.b, s.t, int64_t{s.heads()} * s.d}),
       .out = Tensor(buf.out.data(), DType::kF32, {s.b, s.t, int64_t{s.h} * s.d}),
       .lse = Tensor(buf.lse.data(), DType::kF32, {s.b, s.h, s.t}),
       .n_head = s.h,
       .n_kv_head = s.hkv});
}

absl::Status Backward(const Shape& s, Buffers& buf, int threads = 2) {
  return AttentionBackward(
      CpuContext(threads),
      {.qkv = Tensor(buf.qkv.data(), DType::kF32, {s.b, s.t, int64_t{s.heads()} * s.d}),
       .out = Tensor(buf.out.data(), DType::kF32, {s.b, s.t, int64_t{s.h} * s.d}),
       .lse = Tensor(buf.lse.data(), DType::kF32, {s.b, s.h, s.t}),
       .dout = Tensor(buf.dout.data(), DType::kF32, {s.b, s.t, int64_t{s.h} * s.d}),
       .dqkv = Tensor(buf.dqkv.data(), DType::kF32, {s.b, s.t, int64_t{s.heads()} * s.d}),
       .n_head = s.h,
       .n_kv_head = s.hkv});
}

class AttentionShapeTest : public ::testing::TestWithParam<Shape> {};

TEST_P(AttentionShapeTest, ForwardMatchesFloat64Reference) {
  const Shape s = GetParam();
  Buffers buf = MakeBuffers(s, 100);
  ASSERT_TRUE(Forward(s, buf).ok());
  std::vector<double> out, lse;
  AttentionRef(s, ToDouble(buf.qkv), &out, &lse);
  // Scores are f32 sums of D ≤ 64 products (error ≲ 64 · 2⁻²⁴ · |q||k| ≈ 1e-5 at these
  // magnitudes, scaled by 1/√D) and exp is good to 2 ulp; the output, a convex combination of
  // values |v| < 1.5, inherits a few 1e-6 absolute, well under 3e-5 of |ref| + 0.05.
  EXPECT_LT(MaxRelativeError(buf.out, out, 0.05), 3e-5);
  // lse is a log of a sum ≥ 1: its error is the scores' absolute error (~1e-7 at |s| ~ 3).
  EXPECT_LT(MaxRelativeError(buf.lse, lse, 1.0), 1e-6);
}

TEST_P(AttentionShapeTest, BackwardMatchesFloat64AnalyticGradient) {
  const Shape s = GetParam();
  Buffers buf = MakeBuffers(s, 200);
  ASSERT_TRUE(Forward(s, buf).ok());
  std::fill(buf.dqkv.begin(), buf.dqkv.end(), 9.0f);  // dqkv is written, not accumulated
  ASSERT_TRUE(Backward(s, buf).ok());
  const std::vector<double> want = AttentionBackwardRef(s, ToDouble(buf.qkv), ToDouble(buf.dout));
  // Gradients are sums over up to T = 130 keys (or queries) of products of the forward's
  // quantities, each carrying the forward's ~1e-6 relative error plus f32 accumulation:
  // ≲ 1e-5 absolute at magnitudes ~1, so 1e-4 relative to |ref| + 0.05.
  EXPECT_LT(MaxRelativeError(buf.dqkv, want, 0.05), 1e-4);
}

TEST_P(AttentionShapeTest, ProbabilitiesOfEveryRowSumToOne) {
  const Shape s = GetParam();
  Buffers buf = MakeBuffers(s, 300);
  // With every value 1 the output is Σ_j p_ij, which must be 1 for every query row.
  const Index ix{s};
  for (int b = 0; b < s.b; ++b) {
    for (int t = 0; t < s.t; ++t) {
      for (int g = 0; g < s.hkv; ++g) std::fill_n(buf.qkv.begin() + ix.v(b, t, g), s.d, 1.0f);
    }
  }
  ASSERT_TRUE(Forward(s, buf).ok());
  // Σ_j p_ij in f32 over ≤ 130 terms: a few ulp of 1.
  for (float x : buf.out) ASSERT_NEAR(x, 1.0f, 2e-6f);
  // The saved lse normalizes the float64 scores: Σ_j exp(s_ij − lse_i) = 1.
  const std::vector<double> qkv64 = ToDouble(buf.qkv);
  for (int b = 0; b < s.b; ++b) {
    for (int h = 0; h < s.h; ++h) {
      for (int i = 0; i < s.t; ++i) {
        double sum = 0;
        for (double x : Scores(s, qkv64, b, h, i)) {
          sum += std::exp(x - buf.lse[(int64_t{b} * s.h + h) * s.t + i]);
        }
        // lse carries the scores' ~1e-6 absolute error, and exp turns it into relative.
        ASSERT_NEAR(sum, 1.0, 1e-5) << "b " << b << " h " << h << " i " << i;
      }
    }
  }
}

TEST_P(AttentionShapeTest, ResultsAreBitwiseIdenticalForAnyThreadCount) {
  const Shape s = GetParam();
  Buffers one = MakeBuffers(s, 400);
  ASSERT_TRUE(Forward(s, one, 1).ok());
  ASSERT_TRUE(Backward(s, one, 1).ok());
  for (int threads : {2, 3}) {
    Buffers many = MakeBuffers(s, 400);
    ASSERT_TRUE(Forward(s, many, threads).ok());
    ASSERT_TRUE(Backward(s, many, threads).ok());
    EXPECT_TRUE(SameBits(many.out, one.out)) << threads << " threads";
    EXPECT_TRUE(SameBits(many.lse, one.lse)) << threads << " threads";
    EXPECT_TRUE(SameBits(many.dqkv, one.dqkv)) << threads << " threads";
  }
}

// The dtypes of one 16-bit attention test (lse stays f32).
struct AttentionDTypes {
  DType qkv, out, dout, dqkv;
};
constexpr AttentionDTypes kAllBf16{DType::kBF16, DType::kBF16, DType::kBF16, DType::kBF16};
constexpr AttentionDTypes kMixed{DType::kF16, DType::kBF16, DType::kF32, DType::kF16};
// out in f32: the backward's Di is then the f32 path's, so its gradient can be compared with
// finite differences of the forward.
constexpr AttentionDTypes kF32Out{DType::kBF16, DType::kF32, DType::kF16, DType::kBF16};

struct StoredBuffers {
  Shape s;
  Stored qkv, out, dout, dqkv;
  std::vector<float> lse;
  StoredBuffers(const Shape& shape, uint32_t seed, const AttentionDTypes& t)
      : s(shape),
        qkv(RandomVector(s.qkv_size(), seed, -1.5f, 1.5f), t.qkv),
        out(s.out_size(), t.out),
        dout(RandomVector(s.out_size(), seed + 1), t.dout),
        // dqkv is written, not accumulated: start it away from zero.
        dqkv(std::vector<float>(s.qkv_size(), 9.0f), t.dqkv),
        lse(s.lse_size()) {}
  absl::Status Run(int threads) {
    const DeviceContext ctx = CpuContext(threads);
    const Tensor lse_t(lse.data(), DType::kF32, {s.b, s.h, s.t});
    const int64_t c3 = int64_t{s.heads()} * s.d, co = int64_t{s.h} * s.d;
    absl::Status st = AttentionForward(ctx, {.qkv = qkv.View({s.b, s.t, c3}),
                                             .out = out.View({s.b, s.t, co}),
                                             .lse = lse_t,
                                             .n_head = s.h,
                                             .n_kv_head = s.hkv});
    if (!st.ok()) return st;
    return AttentionBackward(ctx, {.qkv = qkv.View({s.b, s.t, c3}),
                                   .out = out.View({s.b, s.t, co}),
                                   .lse = lse_t,
                                   .dout = dout.View({s.b, s.t, co}),
                                   .dqkv = dqkv.View({s.b, s.t, c3}),
                                   .n_head = s.h,
                                   .n_kv_head = s.hkv});
  }
};

// The reference runs in float64 on the stored (16-bit-rounded) qkv and dout, and takes the
// backward's Di from the stored out, as the kernel does. Each output may differ from it by
// one rounding to its dtype (one ulp allowed for the reference's double rounding) plus the
// f32 path's tolerances (ForwardMatchesFloat64Reference, BackwardMatchesFloat64AnalyticGradient).
TEST_P(AttentionShapeTest, SixteenBitStorageMatchesFloat64) {
  const Shape s = GetParam();
  for (const AttentionDTypes& t : {kAllBf16, kMixed}) {
    StoredBuffers buf(s, 700, t);
    ASSERT_TRUE(buf.Run(2).ok());
    const std::vector<double> qkv = buf.qkv.Doubles();
    std::vector<double> out, lse;
    AttentionRef(s, qkv, &out, &lse);
    EXPECT_EQ(CountOutsideUlp(buf.out, out, 3e-5, 0.05), 0);
    EXPECT_LT(MaxRelativeError(buf.lse, lse, 1.0), 1e-6);
    const std::vector<double> stored_out = buf.out.Doubles();
    const std::vector<double> want = AttentionBackwardRef(s, qkv, buf.dout.Doubles(), &stored_out);
    EXPECT_EQ(CountOutsideUlp(buf.dqkv, want, 1e-4, 0.05), 0);
  }
}

TEST_P(AttentionShapeTest, SixteenBitBitwiseIndependentOfThreadCount) {
  const Shape s = GetParam();
  StoredBuffers one(s, 800, kMixed);
  ASSERT_TRUE(one.Run(1).ok());
  StoredBuffers three(s, 800, kMixed);
  ASSERT_TRUE(three.Run(3).ok());
  EXPECT_TRUE(SameWords(one.out, three.out));
  EXPECT_TRUE(SameBits(one.lse, three.lse));
  EXPECT_TRUE(SameWords(one.dqkv, three.dqkv));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionShapeTest,
    ::testing::Values(Shape{2, 37, 4, 2, 16},   // T below one tile, GQA 2:1
                      Shape{1, 130, 4, 1, 64},  // three tiles, the last partial; MQA
                      Shape{2, 70, 4, 4, 20},   // plain MHA, D not a multiple of 16
                      Shape{1, 128, 2, 2, 32},  // whole tiles only
                      Shape{3, 1, 2, 1, 8}),    // one token
    [](const ::testing::TestParamInfo<Shape>& info) { return Name(info.param); });

// The gradient of L = Σ w·out from the kernel against central differences of the float64
// forward, on shapes small enough to difference every input.
class AttentionGradientTest : public ::testing::TestWithParam<Shape> {};

TEST_P(AttentionGradientTest, BackwardMatchesFiniteDifferences) {
  const Shape s = GetParam();
  Buffers buf = MakeBuffers(s, 500);
  ASSERT_TRUE(Forward(s, buf).ok());
  ASSERT_TRUE(Backward(s, buf).ok());
  const std::vector<double> w = ToDouble(buf.dout);
  const std::vector<double> fd =
      FiniteDifferenceGradient(ToDouble(buf.qkv), [&](const std::vector<double>& x) {
        std::vector<double> out, lse;
        AttentionRef(s, x, &out, &lse);
        double loss = 0;
        for (size_t i = 0; i < out.size(); ++i) loss += w[i] * out[i];
        return loss;
      });
  // Central differences with h = 1e-6 on an O(1) smooth loss: truncation ~h² and float64
  // cancellation ~1e-16/1e-6 = 1e-10, so the float64 side is exact to ~1e-9. The kernel's f32
  // gradient is good to ~1e-5 absolute (see the analytic comparison).
  EXPECT_LT(MaxRelativeError(buf.dqkv, fd, 0.05), 1e-4);
  // The analytic float64 backward used on the larger shapes agrees with the differences too.
  const std::vector<double> analytic = AttentionBackwardRef(s, ToDouble(buf.qkv), w);
  std::vector<float> analytic32(analytic.begin(), analytic.end());
  EXPECT_LT(MaxRelativeError(analytic32, fd, 0.05), 1e-6);
}

// As BackwardMatchesFiniteDifferences with qkv, dout and dqkv stored in 16 bits (out in f32):
// the differences are taken on the stored qkv with the stored dout as weights, and the
// tolerance is one ulp of dqkv's dtype plus the f32 path's.
TEST_P(AttentionGradientTest, SixteenBitBackwardMatchesFiniteDifferences) {
  const Shape s = GetParam();
  StoredBuffers buf(s, 900, kF32Out);
  ASSERT_TRUE(buf.Run(2).ok());
  const std::vector<double> w = buf.dout.Doubles();
  const std::vector<double> fd =
      FiniteDifferenceGradient(buf.qkv.Doubles(), [&](const std::vector<double>& x) {
        std::vector<double> out, lse;
        AttentionRef(s, x, &out, &lse);
        double loss = 0;
        for (size_t i = 0; i < out.size(); ++i) loss += w[i] * out[i];
        return loss;
      });
  EXPECT_EQ(CountOutsideUlp(buf.dqkv, fd, 1e-4, 0.05), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionGradientTest,
    ::testing::Values(Shape{1, 70, 2, 1, 4},   // crosses a tile boundary, MQA
                      Shape{2, 37, 4, 2, 6}),  // GQA 2:1, T not a multiple of the tile
    [](const ::testing::TestParamInfo<Shape>& info) { return Name(info.param); });

TEST(AttentionTest, BadArgumentsAreInvalidArgumentsNamingTheArgument) {
  const Shape s{1, 8, 4, 2, 8};
  Buffers buf = MakeBuffers(s, 600);
  auto expect_invalid = [](const absl::Status& st, const std::string& arg) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(arg), std::string::npos) << st;
  };
  const DeviceContext ctx = CpuContext(1);
  const Tensor qkv(buf.qkv.data(), DType::kF32, {1, 8, 64});
  const Tensor out(buf.out.data(), DType::kF32, {1, 8, 32});
  const Tensor lse(buf.lse.data(), DType::kF32, {1, 4, 8});
  AttentionForwardArgs args{.qkv = qkv, .out = out, .lse = lse, .n_head = 4, .n_kv_head = 2};
  ASSERT_TRUE(AttentionForward(ctx, args).ok());

  AttentionForwardArgs bad = args;
  bad.qkv = Tensor(buf.qkv.data(), DType::kF32, {1, 8, 63});
  expect_invalid(AttentionForward(ctx, bad), "qkv");
  bad = args;
  bad.lse = Tensor(buf.lse.data(), DType::kF32, {1, 8, 4});
  expect_invalid(AttentionForward(ctx, bad), "lse");
  bad = args;
  bad.out = Tensor(buf.out.data(), DType::kF32, {1, 8, 16});
  expect_invalid(AttentionForward(ctx, bad), "out");
  bad = args;
  bad.n_kv_head = 3;
  expect_invalid(AttentionForward(ctx, bad), "n_kv_head");
  bad = args;
  // Head size 288 (n_head 1, n_kv_head 1: 3 heads) exceeds the CPU tile buffers.
  std::vector<float> wide(8 * 3 * 288);
  bad.qkv = Tensor(wide.data(), DType::kF32, {1, 8, 3 * 288});
  bad.n_head = 1;
  bad.n_kv_head = 1;
  expect_invalid(AttentionForward(ctx, bad), "qkv");

  AttentionBackwardArgs bwd{.qkv = qkv,
                            .out = out,
                            .lse = lse,
                            .dout = Tensor(buf.dout.data(), DType::kF32, {1, 8, 32}),
                            .dqkv = Tensor(buf.dqkv.data(), DType::kF32, {1, 8, 48}),
                            .n_head = 4,
                            .n_kv_head = 2};
  expect_invalid(AttentionBackward(ctx, bwd), "dqkv");
  bwd.dqkv = Tensor(buf.dqkv.data(), DType::kF32, {1, 8, 64});
  bwd.dout = Tensor();
  expect_invalid(AttentionBackward(ctx, bwd), "dout");
  bwd.dout = Tensor(buf.dout.data(), DType::kI32, {1, 8, 32});
  expect_invalid(AttentionBackward(ctx, bwd), "dout has dtype i32, expected one of f32, bf16, f16");
  bad = args;
  bad.lse = Tensor(buf.lse.data(), DType::kBF16, {1, 4, 8});
  expect_invalid(AttentionForward(ctx, bad), "lse has dtype bf16");
}

}  // namespace
}  // namespace zt
