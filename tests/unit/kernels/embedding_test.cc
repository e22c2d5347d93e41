// kernels/embedding: forward against a float64 gather, backward against finite differences
// of L = Σ w·out, determinism of the scatter-add, and the errors for bad input.
#include "kernels/embedding.h"

#include <cstdint>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using testing::FiniteDifferenceGradient;
using testing::MaxRelativeError;
using testing::RandomVector;
using testing::SameBits;
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
}

TEST(EmbeddingTest, CudaContextIsUnimplemented) {
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

}  // namespace
}  // namespace zt
