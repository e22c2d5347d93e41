// kernels/embedding: forward against a float64 gather, backward against finite differences
// of L = Σ w·out, determinism of the scatter-add, and the errors for bad input.
#include "kernels/embedding.h"

#include <cstdint>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/kernels/mixed_check.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using testing::CountOutsideUlp;
using testing::FiniteDifferenceGradient;
using testing::MaxRelativeError;
using testing::RandomVector;
using testing::RoundTo;
using testing::SameBits;
using testing::SameWords;
using testing::Stored;
using testing::ToDouble;

struct Sizes {
  int64_t b = 2, t = 5, c = 70, v = 7, p = 8;  // C spans a full and a partial channel block
};

std::vector<int32_t> RandomTokens(const Sizes& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> tokens(s.b * s.t);
  // V is small, so tokens repeat and the scatter-add sums several rows into one.
  for (int32_t& tok : tokens) tok = static_cast<int32_t>(rng() % s.v);
  return tokens;
}

// out[b, t, :] = wte[tok] + wpe[t] in float64; wpe empty means no positions.
std::vector<double> ReferenceForward(const Sizes& s, const std::vector<int32_t>& tokens,
                                     const std::vector<double>& wte,
                                     const std::vector<double>& wpe) {
  std::vector<double> out(s.b * s.t * s.c);
  for (int64_t bt = 0; bt < s.b * s.t; ++bt) {
    for (int64_t i = 0; i < s.c; ++i) {
      out[bt * s.c + i] =
          wte[tokens[bt] * s.c + i] + (wpe.empty() ? 0.0 : wpe[(bt % s.t) * s.c + i]);
    }
  }
  return out;
}

TEST(EmbeddingTest, ForwardMatchesFloat64Gather) {
  const Sizes s;
  std::vector<int32_t> tokens = RandomTokens(s, 1);
  std::vector<float> wte = RandomVector(s.v * s.c, 2), wpe = RandomVector(s.p * s.c, 3);
  for (bool with_positions : {true, false}) {
    std::vector<float> out(s.b * s.t * s.c);
    EmbeddingForwardArgs args{
        .tokens = Tensor(tokens.data(), DType::kI32, {s.b, s.t}),
        .wte = Tensor(wte.data(), DType::kF32, {s.v, s.c}),
        .wpe = with_positions ? Tensor(wpe.data(), DType::kF32, {s.p, s.c}) : Tensor(),
        .out = Tensor(out.data(), DType::kF32, {s.b, s.t, s.c})};
    ASSERT_TRUE(EmbeddingForward(CpuContext(2), args).ok());
    const std::vector<double> want = ReferenceForward(
        s, tokens, ToDouble(wte), with_positions ? ToDouble(wpe) : std::vector<double>());
    // One f32 addition: half an ulp (6e-8) relative to the sum's magnitude.
    EXPECT_LE(MaxRelativeError(out, want), 1e-6) << "with_positions " << with_positions;
  }
}

TEST(EmbeddingTest, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const Sizes s;
  std::vector<int32_t> tokens = RandomTokens(s, 4);
  const std::vector<float> wte = RandomVector(s.v * s.c, 5), wpe = RandomVector(s.p * s.c, 6);
  const std::vector<float> w = RandomVector(s.b * s.t * s.c, 7);  // L = Σ w·out, dout = w
  // Start from non-zero gradients: the op adds to them.
  const std::vector<float> dwte0 = RandomVector(s.v * s.c, 8), dwpe0 = RandomVector(s.p * s.c, 9);
  std::vector<float> dwte = dwte0, dwpe = dwpe0, dout = w;
  EmbeddingBackwardArgs args{.tokens = Tensor(tokens.data(), DType::kI32, {s.b, s.t}),
                             .dout = Tensor(dout.data(), DType::kF32, {s.b, s.t, s.c}),
                             .dwte = Tensor(dwte.data(), DType::kF32, {s.v, s.c}),
                             .dwpe = Tensor(dwpe.data(), DType::kF32, {s.p, s.c})};
  ASSERT_TRUE(EmbeddingBackward(CpuContext(2), args).ok());

  // The loss as a function of [wte | wpe] in float64.
  std::vector<double> params = ToDouble(wte);
  const std::vector<double> wpe64 = ToDouble(wpe);
  params.insert(params.end(), wpe64.begin(), wpe64.end());
  const int64_t split = s.v * s.c;
  auto loss = [&](const std::vector<double>& x) {
    const std::vector<double> out =
        ReferenceForward(s, tokens, std::vector<double>(x.begin(), x.begin() + split),
                         std::vector<double>(x.begin() + split, x.end()));
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += w[i] * out[i];
    return l;
  };
  const std::vector<double> grad = FiniteDifferenceGradient(params, loss);
  std::vector<double> want_dwte(grad.begin(), grad.begin() + split);
  std::vector<double> want_dwpe(grad.begin() + split, grad.end());
  for (int64_t i = 0; i < split; ++i) want_dwte[i] += dwte0[i];
  for (size_t i = 0; i < want_dwpe.size(); ++i) want_dwpe[i] += dwpe0[i];
  // L is linear, so central differences are exact up to float64 rounding of L/h (~1e-9);
  // the kernel sums at most B·T = 10 f32 terms (~10 half-ulps).
  EXPECT_LE(MaxRelativeError(dwte, want_dwte), 1e-5);
  EXPECT_LE(MaxRelativeError(dwpe, want_dwpe), 1e-5);
}

TEST(EmbeddingTest, BackwardIsBitwiseIndependentOfThreadCount) {
  Sizes s{.b = 4, .t = 33, .c = 200, .v = 5, .p = 40};
  std::vector<int32_t> tokens = RandomTokens(s, 10);
  std::vector<float> dout = RandomVector(s.b * s.t * s.c, 11);
  std::vector<std::vector<float>> dwte(2, RandomVector(s.v * s.c, 12));
  std::vector<std::vector<float>> dwpe(2, RandomVector(s.p * s.c, 13));
  const int threads[2] = {1, 3};
  for (int k = 0; k < 2; ++k) {
    EmbeddingBackwardArgs args{.tokens = Tensor(tokens.data(), DType::kI32, {s.b, s.t}),
                               .dout = Tensor(dout.data(), DType::kF32, {s.b, s.t, s.c}),
                               .dwte = Tensor(dwte[k].data(), DType::kF32, {s.v, s.c}),
                               .dwpe = Tensor(dwpe[k].data(), DType::kF32, {s.p, s.c})};
    ASSERT_TRUE(EmbeddingBackward(CpuContext(threads[k]), args).ok());
  }
  EXPECT_TRUE(SameBits(dwte[0], dwte[1]));
  EXPECT_TRUE(SameBits(dwpe[0], dwpe[1]));
}

// The dtypes of one 16-bit embedding test.
struct EmbeddingDTypes {
  DType wte, wpe, out, dout, dwte, dwpe;
};
constexpr EmbeddingDTypes kAllBf16{DType::kBF16, DType::kBF16, DType::kBF16,
                                   DType::kBF16, DType::kBF16, DType::kBF16};
constexpr EmbeddingDTypes kMixed{DType::kF16,  DType::kBF16, DType::kF32,
                                 DType::kBF16, DType::kF16,  DType::kF32};
constexpr EmbeddingDTypes kMixedGrads{DType::kBF16, DType::kF16, DType::kF16,
                                      DType::kF32,  DType::kF32, DType::kBF16};

struct StoredEmbedding {
  Sizes s;
  std::vector<int32_t> tokens;
  Stored wte, wpe, out, dout, dwte, dwpe;
  StoredEmbedding(const Sizes& sizes, uint32_t seed, const EmbeddingDTypes& d)
      : s(sizes),
        tokens(RandomTokens(sizes, seed)),
        wte(RandomVector(s.v * s.c, seed + 1), d.wte),
        wpe(RandomVector(s.p * s.c, seed + 2), d.wpe),
        out(s.b * s.t * s.c, d.out),
        dout(RandomVector(s.b * s.t * s.c, seed + 3), d.dout),
        dwte(RandomVector(s.v * s.c, seed + 4), d.dwte),
        dwpe(RandomVector(s.p * s.c, seed + 5), d.dwpe) {}
  absl::Status Run(int threads) {
    const DeviceContext ctx = CpuContext(threads);
    const Tensor tok(tokens.data(), DType::kI32, {s.b, s.t});
    absl::Status st = EmbeddingForward(ctx, {.tokens = tok,
                                             .wte = wte.View({s.v, s.c}),
                                             .wpe = wpe.View({s.p, s.c}),
                                             .out = out.View({s.b, s.t, s.c})});
    if (!st.ok()) return st;
    return EmbeddingBackward(ctx, {.tokens = tok,
                                   .dout = dout.View({s.b, s.t, s.c}),
                                   .dwte = dwte.View({s.v, s.c}),
                                   .dwpe = dwpe.View({s.p, s.c})});
  }
};

// The reference runs in float64 on the stored (16-bit-rounded) inputs. Every output may differ
// from it by one rounding to its dtype (one ulp allowed for the reference's double rounding)
// plus the f32 path's error: out is one f32 addition (half an f32 ulp, inside 1e-6 of |out|);
// dwte/dwpe sum at most B·T + 1 = 11 terms of magnitude ≤ 1 in f32, each rounding by at most
// an f32 half-ulp of the partial sum, so their absolute error stays under 1e-5 · (1 + |sum|).
TEST(EmbeddingTest, SixteenBitStorageMatchesFloat64) {
  for (const EmbeddingDTypes& d : {kAllBf16, kMixed, kMixedGrads}) {
    StoredEmbedding buf(Sizes{}, 20, d);
    const Sizes& s = buf.s;
    const std::vector<double> dwte0 = buf.dwte.Doubles(), dwpe0 = buf.dwpe.Doubles();
    ASSERT_TRUE(buf.Run(2).ok());
    const std::vector<double> wte = buf.wte.Doubles(), wpe = buf.wpe.Doubles();
    EXPECT_EQ(CountOutsideUlp(buf.out, ReferenceForward(s, buf.tokens, wte, wpe), 1e-6, 0.0), 0);

    std::vector<double> params = wte;
    params.insert(params.end(), wpe.begin(), wpe.end());
    const int64_t split = s.v * s.c;
    const std::vector<double> dy = buf.dout.Doubles();
    auto loss = [&](const std::vector<double>& x) {
      const std::vector<double> out =
          ReferenceForward(s, buf.tokens, std::vector<double>(x.begin(), x.begin() + split),
                           std::vector<double>(x.begin() + split, x.end()));
      double l = 0;
      for (size_t i = 0; i < out.size(); ++i) l += dy[i] * out[i];
      return l;
    };
    const std::vector<double> grad = FiniteDifferenceGradient(params, loss);
    std::vector<double> want_dwte(grad.begin(), grad.begin() + split);
    std::vector<double> want_dwpe(grad.begin() + split, grad.end());
    for (int64_t i = 0; i < split; ++i) want_dwte[i] += dwte0[i];
    for (size_t i = 0; i < want_dwpe.size(); ++i) want_dwpe[i] += dwpe0[i];
    EXPECT_EQ(CountOutsideUlp(buf.dwte, want_dwte, 1e-5, 1.0), 0);
    EXPECT_EQ(CountOutsideUlp(buf.dwpe, want_dwpe, 1e-5, 1.0), 0);
  }
}

// A 16-bit gradient table gets the batch's sum added in f32 and is rounded once: bit for bit
// the f32 path's sum (same order) rounded to the table's dtype. With V = 2 every row collects
// many tokens, where rounding after each token would drift by several ulps.
TEST(EmbeddingTest, SixteenBitGradientIsTheF32SumRoundedOnce) {
  const Sizes s{.b = 3, .t = 9, .c = 70, .v = 2, .p = 9};
  for (const EmbeddingDTypes& d : {kAllBf16, kMixed}) {
    StoredEmbedding buf(s, 30, d);
    std::vector<float> want_dwte = buf.dwte.Values(), want_dwpe = buf.dwpe.Values();
    const std::vector<float> dy = buf.dout.Values();
    for (int64_t bt = 0; bt < s.b * s.t; ++bt) {
      for (int64_t i = 0; i < s.c; ++i) {
        want_dwte[buf.tokens[bt] * s.c + i] += dy[bt * s.c + i];
        want_dwpe[(bt % s.t) * s.c + i] += dy[bt * s.c + i];
      }
    }
    ASSERT_TRUE(buf.Run(2).ok());
    for (size_t i = 0; i < want_dwte.size(); ++i) {
      ASSERT_EQ(buf.dwte.Get(i), RoundTo(d.dwte, want_dwte[i])) << "dwte " << i;
    }
    for (size_t i = 0; i < want_dwpe.size(); ++i) {
      ASSERT_EQ(buf.dwpe.Get(i), RoundTo(d.dwpe, want_dwpe[i])) << "dwpe " << i;
    }
  }
}

TEST(EmbeddingTest, SixteenBitBitwiseIndependentOfThreadCount) {
  const Sizes s{.b = 4, .t = 33, .c = 200, .v = 5, .p = 40};
  for (const EmbeddingDTypes& d : {kAllBf16, kMixed}) {
    StoredEmbedding one(s, 40, d), three(s, 40, d);
    ASSERT_TRUE(one.Run(1).ok());
    ASSERT_TRUE(three.Run(3).ok());
    EXPECT_TRUE(SameWords(one.out, three.out));
    EXPECT_TRUE(SameWords(one.dwte, three.dwte));
    EXPECT_TRUE(SameWords(one.dwpe, three.dwpe));
  }
}

TEST(EmbeddingTest, TokenOutsideVocabularyNamesIdAndPosition) {
  const Sizes s;
  std::vector<int32_t> tokens = RandomTokens(s, 14);
  std::vector<float> wte(s.v * s.c), out(s.b * s.t * s.c), dout(s.b * s.t * s.c);
  for (int32_t bad : {static_cast<int32_t>(s.v), -3}) {
    tokens[1 * s.t + 3] = bad;
    const absl::Status fwd =
        EmbeddingForward(CpuContext(1), {.tokens = Tensor(tokens.data(), DType::kI32, {s.b, s.t}),
                                         .wte = Tensor(wte.data(), DType::kF32, {s.v, s.c}),
                                         .out = Tensor(out.data(), DType::kF32, {s.b, s.t, s.c})});
    EXPECT_EQ(fwd.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(fwd.message().find(absl::StrCat("tokens[1, 3] = ", bad, " is outside [0, 7)")),
              std::string::npos)
        << fwd;
    const absl::Status bwd =
        EmbeddingBackward(CpuContext(1), {.tokens = Tensor(tokens.data(), DType::kI32, {s.b, s.t}),
                                          .dout = Tensor(dout.data(), DType::kF32, {s.b, s.t, s.c}),
                                          .dwte = Tensor(wte.data(), DType::kF32, {s.v, s.c})});
    EXPECT_EQ(bwd.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(bwd.message().find("tokens[1, 3]"), std::string::npos) << bwd;
  }
}

TEST(EmbeddingTest, BadShapesAndDTypesNameTheArgument) {
  const Sizes s;
  std::vector<int32_t> tokens = RandomTokens(s, 15);
  std::vector<float> wte(s.v * s.c), wpe(s.p * s.c), out(s.b * s.t * s.c);
  const EmbeddingForwardArgs good{.tokens = Tensor(tokens.data(), DType::kI32, {s.b, s.t}),
                                  .wte = Tensor(wte.data(), DType::kF32, {s.v, s.c}),
                                  .wpe = Tensor(wpe.data(), DType::kF32, {s.p, s.c}),
                                  .out = Tensor(out.data(), DType::kF32, {s.b, s.t, s.c})};
  ASSERT_TRUE(EmbeddingForward(CpuContext(1), good).ok());
  auto expect_error = [](const EmbeddingForwardArgs& args, const std::string& needle) {
    const absl::Status st = EmbeddingForward(CpuContext(1), args);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st;
  };
  EmbeddingForwardArgs a = good;
  a.out = Tensor(out.data(), DType::kF32, {s.b, s.t, s.c - 1});
  expect_error(a, "out has shape");
  a = good;
  a.tokens = Tensor(tokens.data(), DType::kF32, {s.b, s.t});
  expect_error(a, "tokens has dtype f32, expected i32");
  a = good;
  a.wpe = Tensor(wpe.data(), DType::kF32, {s.t - 1, s.c});
  expect_error(a, "wpe has 4 positions");
  a = good;
  a.wpe = Tensor(wpe.data(), DType::kF32, {s.c, s.p});
  expect_error(a, "wpe has 8 channels");
  a = good;
  a.wte = Tensor();
  expect_error(a, "wte is empty");
  a = good;
  a.wpe = Tensor(wpe.data(), DType::kI32, {s.p, s.c});
  expect_error(a, "wpe has dtype i32, expected one of f32, bf16, f16");
}

// In a build with nvcc the CUDA twin runs instead (tests/gpu/kernels/embedding_test.cc).
#if !ZT_HAVE_CUDA
TEST(EmbeddingTest, CudaContextIsUnimplementedInACpuOnlyBuild) {
  const Sizes s;
  std::vector<int32_t> tokens = RandomTokens(s, 16);
  std::vector<float> wte(s.v * s.c), out(s.b * s.t * s.c);
  const Device gpu{.kind = DeviceKind::kCuda};
  DeviceContext ctx;
  ctx.device = gpu;
  const absl::Status st =
      EmbeddingForward(ctx, {.tokens = Tensor(tokens.data(), DType::kI32, {s.b, s.t}, gpu),
                             .wte = Tensor(wte.data(), DType::kF32, {s.v, s.c}, gpu),
                             .out = Tensor(out.data(), DType::kF32, {s.b, s.t, s.c}, gpu)});
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
}
#endif  // !ZT_HAVE_CUDA

}  // namespace
}  // namespace zt
