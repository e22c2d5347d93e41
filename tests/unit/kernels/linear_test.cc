// Tests of kernels/linear.h: Gemm and the linear layer against float64 references, backward
// against central finite differences, on both CPU GEMM backends; the workspace the GEMM takes
// from its context, and the oneDNN primitive cache. 16-bit operands: linear_dtypes_test.cc.
#include "kernels/linear.h"

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using ::zt::testing::FiniteDifferenceGradient;
using ::zt::testing::MaxRelativeError;
using ::zt::testing::RandomVector;
using ::zt::testing::SameBits;
using ::zt::testing::ToDouble;

Tensor View(std::vector<float>& v, std::initializer_list<int64_t> shape) {
  return Tensor(v.data(), DType::kF32, shape);
}

DeviceContext BareContext(CpuGemm gemm, int threads = 2) {
  DeviceContext ctx = CpuContext(threads);
  ctx.cpu_gemm = gemm;
  return ctx;
}

// A context with a workspace of its own, sized the way the memory plan sizes it.
class OwnedContext {
 public:
  OwnedContext(CpuGemm gemm, int threads, int64_t workspace_bytes)
      : ctx_(BareContext(gemm, threads)), workspace_(static_cast<size_t>(workspace_bytes)) {
    ctx_.workspace = {.data = workspace_.data(), .bytes = workspace_bytes};
  }
  OwnedContext(const OwnedContext&) = delete;
  OwnedContext& operator=(const OwnedContext&) = delete;

  const DeviceContext& ctx() const { return ctx_; }

 private:
  DeviceContext ctx_;
  std::vector<uint8_t> workspace_;
};

// For every GEMM of a linear layer with M rows, K inputs, N outputs.
OwnedContext LinearContext(CpuGemm gemm, int64_t m, int64_t k, int64_t n, int threads = 2) {
  return OwnedContext(gemm, threads,
                      LinearWorkspaceBytes(BareContext(gemm, threads), m, k, n).value());
}

OwnedContext GemmContext(CpuGemm gemm, const GemmShape& shape, int threads = 2) {
  return OwnedContext(gemm, threads, GemmWorkspaceBytes(BareContext(gemm, threads), shape).value());
}

// out (M, N) = inp (M, K) · weight (N, K)ᵀ + bias (N), in float64.
std::vector<double> LinearRef(const std::vector<double>& inp, const std::vector<double>& weight,
                              const std::vector<double>* bias, int m, int k, int n) {
  std::vector<double> out(static_cast<size_t>(m) * n);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double acc = bias != nullptr ? (*bias)[j] : 0.0;
      for (int p = 0; p < k; ++p) acc += inp[i * k + p] * weight[j * k + p];
      out[i * n + j] = acc;
    }
  }
  return out;
}

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double acc = 0;
  for (size_t i = 0; i < a.size(); ++i) acc += a[i] * b[i];
  return acc;
}

class LinearBackendTest : public ::testing::TestWithParam<CpuGemm> {};

TEST_P(LinearBackendTest, GemmMatchesFloat64ReferenceForEveryTranspose) {
  const int m = 37, n = 29, k = 53;
  const float alpha = 0.5f, beta = 0.25f;
  for (Transpose ta : {Transpose::kNo, Transpose::kYes}) {
    for (Transpose tb : {Transpose::kNo, Transpose::kYes}) {
      std::vector<float> a = RandomVector(m * k, 1);
      std::vector<float> b = RandomVector(k * n, 2);
      std::vector<float> c = RandomVector(m * n, 3);
      std::vector<double> want(m * n);
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          double acc = 0;
          for (int p = 0; p < k; ++p) {
            const double av = ta == Transpose::kYes ? a[p * m + i] : a[i * k + p];
            const double bv = tb == Transpose::kYes ? b[j * k + p] : b[p * n + j];
            acc += av * bv;
          }
          want[i * n + j] = alpha * acc + beta * static_cast<double>(c[i * n + j]);
        }
      }
      const Tensor ta_view = ta == Transpose::kYes ? View(a, {k, m}) : View(a, {m, k});
      const Tensor tb_view = tb == Transpose::kYes ? View(b, {n, k}) : View(b, {k, n});
      const OwnedContext owned = GemmContext(
          GetParam(), {.m = m, .n = n, .k = k, .trans_a = ta, .trans_b = tb, .accumulate = true});
      ASSERT_TRUE(Gemm(owned.ctx(), ta_view, tb_view, View(c, {m, n}),
                       {.trans_a = ta, .trans_b = tb, .alpha = alpha, .beta = beta})
                      .ok());
      // Each element is an f32 sum of 53 products of magnitude < 1: rounding stays below
      // 53 · 2⁻²⁴ ≈ 3e-6 absolute, under 1e-4 relative to |ref| + 0.05.
      EXPECT_LT(MaxRelativeError(c, want, 0.05), 1e-4)
          << "trans_a " << (ta == Transpose::kYes) << " trans_b " << (tb == Transpose::kYes);
    }
  }
}

TEST_P(LinearBackendTest, ForwardMatchesFloat64ReferenceWithAndWithoutBias) {
  const int m = 33, k = 70, n = 45;
  std::vector<float> inp = RandomVector(m * k, 4);
  std::vector<float> weight = RandomVector(n * k, 5);
  std::vector<float> bias = RandomVector(n, 6);
  const std::vector<double> inp64 = ToDouble(inp), w64 = ToDouble(weight), b64 = ToDouble(bias);
  for (bool with_bias : {false, true}) {
    // A stale output must be overwritten, not accumulated into.
    std::vector<float> out(m * n, 7.0f);
    ASSERT_TRUE(LinearForward(LinearContext(GetParam(), m, k, n).ctx(),
                              {.inp = View(inp, {m, k}),
                               .weight = View(weight, {n, k}),
                               .bias = with_bias ? View(bias, {n}) : Tensor(),
                               .out = View(out, {m, n})})
                    .ok());
    const std::vector<double> want = LinearRef(inp64, w64, with_bias ? &b64 : nullptr, m, k, n);
    // f32 sums of 70 products < 1 (plus a bias < 1): ≤ 71 · 2⁻²⁴ ≈ 4e-6 absolute.
    EXPECT_LT(MaxRelativeError(out, want, 0.05), 1e-4) << "bias " << with_bias;
  }
}

TEST_P(LinearBackendTest, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const int m = 6, k = 5, n = 7;
  std::vector<float> inp = RandomVector(m * k, 8);
  std::vector<float> weight = RandomVector(n * k, 9);
  std::vector<float> bias = RandomVector(n, 10);
  const std::vector<double> w_loss = ToDouble(RandomVector(m * n, 11));  // L = Σ w·out
  std::vector<float> dout(w_loss.begin(), w_loss.end());
  const std::vector<double> inp64 = ToDouble(inp), w64 = ToDouble(weight), b64 = ToDouble(bias);

  const std::vector<double> g_inp = FiniteDifferenceGradient(
      inp64, [&](const auto& x) { return Dot(w_loss, LinearRef(x, w64, &b64, m, k, n)); });
  const std::vector<double> g_weight = FiniteDifferenceGradient(
      w64, [&](const auto& x) { return Dot(w_loss, LinearRef(inp64, x, &b64, m, k, n)); });
  const std::vector<double> g_bias = FiniteDifferenceGradient(
      b64, [&](const auto& x) { return Dot(w_loss, LinearRef(inp64, w64, &x, m, k, n)); });

  // Parameter gradients accumulate: start from non-zero values and expect them added.
  const std::vector<float> dweight0 = RandomVector(n * k, 12);
  const std::vector<float> dbias0 = RandomVector(n, 13);
  std::vector<float> dinp(m * k, 3.0f), dweight = dweight0, dbias = dbias0;
  ASSERT_TRUE(LinearBackward(LinearContext(GetParam(), m, k, n).ctx(),
                             {.dout = View(dout, {m, n}),
                              .inp = View(inp, {m, k}),
                              .weight = View(weight, {n, k}),
                              .dinp = View(dinp, {m, k}),
                              .dweight = View(dweight, {n, k}),
                              .dbias = View(dbias, {n}),
                              .dinp_mode = Accumulate::kOverwrite})
                  .ok());
  std::vector<double> want_dweight(n * k), want_dbias(n);
  for (int i = 0; i < n * k; ++i) want_dweight[i] = dweight0[i] + g_weight[i];
  for (int i = 0; i < n; ++i) want_dbias[i] = dbias0[i] + g_bias[i];
  // L is linear in each argument, so central differences are exact up to float64 rounding of
  // L (~1e-16 / 2e-6 ≈ 1e-10); what remains is f32 rounding of sums of ≤ 7 products.
  EXPECT_LT(MaxRelativeError(dinp, g_inp, 0.05), 1e-5);
  EXPECT_LT(MaxRelativeError(dweight, want_dweight, 0.05), 1e-5);
  EXPECT_LT(MaxRelativeError(dbias, want_dbias, 0.05), 1e-5);
}

TEST_P(LinearBackendTest, DinpOverwriteIgnoresAndAddKeepsThePreviousValue) {
  const int m = 9, k = 11, n = 13;
  std::vector<float> inp = RandomVector(m * k, 14);
  std::vector<float> weight = RandomVector(n * k, 15);
  std::vector<float> dout = RandomVector(m * n, 16);
  const std::vector<float> prior = RandomVector(m * k, 17);
  std::vector<double> grad(m * k);
  for (int i = 0; i < m; ++i) {
    for (int p = 0; p < k; ++p) {
      double acc = 0;
      for (int j = 0; j < n; ++j) acc += double{dout[i * n + j]} * weight[j * k + p];
      grad[i * k + p] = acc;
    }
  }
  for (Accumulate mode : {Accumulate::kOverwrite, Accumulate::kAdd}) {
    std::vector<float> dinp = prior, dweight(n * k, 0.0f);
    ASSERT_TRUE(
        LinearBackward(LinearContext(GetParam(), m, k, n).ctx(), {.dout = View(dout, {m, n}),
                                                                  .inp = View(inp, {m, k}),
                                                                  .weight = View(weight, {n, k}),
                                                                  .dinp = View(dinp, {m, k}),
                                                                  .dweight = View(dweight, {n, k}),
                                                                  .dinp_mode = mode})
            .ok());
    std::vector<double> want = grad;
    if (mode == Accumulate::kAdd) {
      for (int i = 0; i < m * k; ++i) want[i] += prior[i];
    }
    // f32 sums of 13 products < 1 plus one prior value < 1.
    EXPECT_LT(MaxRelativeError(dinp, want, 0.05), 1e-5) << "add " << (mode == Accumulate::kAdd);
  }
}

TEST_P(LinearBackendTest, ZeroInnerDimensionScalesCByBeta) {
  const int m = 5, n = 7;
  std::vector<float> a(1), b(1);  // (m, 0) and (0, n): no elements, a valid pointer each
  for (float beta : {0.0f, 0.5f}) {
    std::vector<float> c = RandomVector(m * n, 30);
    const std::vector<float> before = c;
    ASSERT_TRUE(Gemm(BareContext(GetParam()), Tensor(a.data(), DType::kF32, {m, 0}),
                     Tensor(b.data(), DType::kF32, {0, n}), View(c, {m, n}), {.beta = beta})
                    .ok());
    std::vector<double> want(m * n);
    for (int i = 0; i < m * n; ++i) want[i] = beta * static_cast<double>(before[i]);
    // One f32 product by 0.5 or 0 is exact.
    EXPECT_EQ(MaxRelativeError(c, want, 0.05), 0.0) << "beta " << beta;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, LinearBackendTest,
                         ::testing::Values(CpuGemm::kOneDnn, CpuGemm::kOpenBlas),
                         [](const ::testing::TestParamInfo<CpuGemm>& info) {
                           return std::string(info.param == CpuGemm::kOneDnn ? "OneDnn"
                                                                             : "OpenBlas");
                         });

TEST(LinearTest, BackendsAgreeOnAGpt2SizedLayer) {
  const int m = 128, k = 768, n = 96;
  std::vector<float> inp = RandomVector(m * k, 18);
  std::vector<float> weight = RandomVector(n * k, 19, -0.05f, 0.05f);
  std::vector<float> bias = RandomVector(n, 20);
  std::vector<float> dout = RandomVector(m * n, 21);
  struct Result {
    std::vector<float> out, dinp, dweight, dbias;
  };
  auto run = [&](CpuGemm gemm) {
    Result r{std::vector<float>(m * n), std::vector<float>(m * k), std::vector<float>(n * k, 0.0f),
             std::vector<float>(n, 0.0f)};
    const OwnedContext owned = LinearContext(gemm, m, k, n);
    const DeviceContext& ctx = owned.ctx();
    EXPECT_TRUE(LinearForward(ctx, {.inp = View(inp, {m, k}),
                                    .weight = View(weight, {n, k}),
                                    .bias = View(bias, {n}),
                                    .out = View(r.out, {m, n})})
                    .ok());
    EXPECT_TRUE(LinearBackward(ctx, {.dout = View(dout, {m, n}),
                                     .inp = View(inp, {m, k}),
                                     .weight = View(weight, {n, k}),
                                     .dinp = View(r.dinp, {m, k}),
                                     .dweight = View(r.dweight, {n, k}),
                                     .dbias = View(r.dbias, {n})})
                    .ok());
    return r;
  };
  const Result a = run(CpuGemm::kOneDnn);
  const Result b = run(CpuGemm::kOpenBlas);
  auto to64 = [](const std::vector<float>& v) { return ToDouble(v); };
  // The backends sum in different orders and blockings; over K = 768 (or M = 128) terms of
  // f32 each differs from the exact sum by ≲ √K · 2⁻²⁴ · scale, far below 1e-4 of |x| + 0.05.
  EXPECT_LT(MaxRelativeError(a.out, to64(b.out), 0.05), 1e-4);
  EXPECT_LT(MaxRelativeError(a.dinp, to64(b.dinp), 0.05), 1e-4);
  EXPECT_LT(MaxRelativeError(a.dweight, to64(b.dweight), 0.05), 1e-4);
  // dbias is the same code on both backends.
  EXPECT_TRUE(SameBits(a.dbias, b.dbias));
}

TEST(LinearTest, DbiasIsBitwiseIdenticalForAnyThreadCount) {
  const int m = 300, k = 8, n = 150;  // n spans a partial column strip
  std::vector<float> inp = RandomVector(m * k, 22);
  std::vector<float> weight = RandomVector(n * k, 23);
  std::vector<float> dout = RandomVector(m * n, 24);
  std::vector<float> reference;
  for (int threads : {1, 2, 3}) {
    std::vector<float> dweight(n * k, 0.0f), dbias(n, 0.5f);
    ASSERT_TRUE(LinearBackward(LinearContext(CpuGemm::kOneDnn, m, k, n, threads).ctx(),
                               {.dout = View(dout, {m, n}),
                                .inp = View(inp, {m, k}),
                                .weight = View(weight, {n, k}),
                                .dweight = View(dweight, {n, k}),
                                .dbias = View(dbias, {n})})
                    .ok());
    if (reference.empty()) {
      reference = dbias;
    } else {
      EXPECT_TRUE(SameBits(dbias, reference)) << threads << " threads";
    }
  }
}

TEST(LinearTest, BadShapesAreInvalidArgumentsNamingTheArgument) {
  std::vector<float> buf(4096, 0.0f);
  float* p = buf.data();
  const DeviceContext ctx = CpuContext(1);
  auto expect_invalid = [](const absl::Status& s, const std::string& arg) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(arg), std::string::npos) << s;
  };
  const Tensor inp(p, DType::kF32, {4, 8});
  const Tensor weight(p, DType::kF32, {6, 8});
  const Tensor out(p, DType::kF32, {4, 6});
  expect_invalid(
      LinearForward(ctx, {.inp = inp, .weight = Tensor(p, DType::kF32, {6, 7}), .out = out}),
      "weight");
  expect_invalid(
      LinearForward(
          ctx, {.inp = inp, .weight = weight, .bias = Tensor(p, DType::kF32, {5}), .out = out}),
      "bias");
  expect_invalid(
      LinearForward(ctx, {.inp = inp, .weight = weight, .out = Tensor(p, DType::kF32, {4, 5})}),
      "out");
  expect_invalid(
      LinearForward(ctx, {.inp = Tensor(p, DType::kI32, {4, 8}), .weight = weight, .out = out}),
      "inp");
  expect_invalid(LinearBackward(ctx, {.dout = out,
                                      .inp = inp,
                                      .weight = weight,
                                      .dinp = Tensor(p, DType::kF32, {4, 9}),
                                      .dweight = weight}),
                 "dinp");
  expect_invalid(
      LinearBackward(
          ctx,
          {.dout = out, .inp = inp, .weight = weight, .dweight = Tensor(p, DType::kF32, {8, 6})}),
      "dweight");
  expect_invalid(Gemm(ctx, inp, Tensor(p, DType::kF32, {7, 6}), out, {}), "b");
  expect_invalid(Gemm(ctx, inp, Tensor(p, DType::kF32, {8, 6}), Tensor(p, DType::kF32, {6, 4}), {}),
                 "c");
}

#if !ZT_HAVE_CUDA
// In a CUDA build the call goes to cuBLASLt; tests/gpu/kernels/linear_test.cc covers it.
TEST(LinearTest, CudaContextIsUnimplementedInThisBuild) {
  std::vector<float> buf(64, 0.0f);
  DeviceContext ctx;
  ctx.device = {.kind = DeviceKind::kCuda, .index = 0};
  const Device cuda = ctx.device;
  const Tensor a(buf.data(), DType::kF32, {4, 4}, cuda);
  EXPECT_EQ(Gemm(ctx, a, a, a, {}).code(), absl::StatusCode::kUnimplemented);
}
#endif  // !ZT_HAVE_CUDA

TEST(LinearWorkspaceTest, OneDnnNeedsScratchForALargeGemmAndOpenBlasNone) {
  const GemmShape shape = {
      .m = 1024, .n = 768, .k = 3072, .trans_b = Transpose::kYes, .accumulate = true};
  const absl::StatusOr<int64_t> onednn = GemmWorkspaceBytes(BareContext(CpuGemm::kOneDnn), shape);
  ASSERT_TRUE(onednn.ok()) << onednn.status();
  // oneDNN's AVX-512 kernels take scratch for this GEMM; its AVX2 ones (a CPU without
  // AVX-512) may take none. Either way the layer's figure below must cover it.
  if (absl::StrContains(CpuGemmDescription(CpuGemm::kOneDnn), "avx512")) EXPECT_GT(*onednn, 0);
  const absl::StatusOr<int64_t> openblas =
      GemmWorkspaceBytes(BareContext(CpuGemm::kOpenBlas), shape);
  ASSERT_TRUE(openblas.ok()) << openblas.status();
  EXPECT_EQ(*openblas, 0);
  EXPECT_EQ(LinearWorkspaceBytes(BareContext(CpuGemm::kOpenBlas), 1024, 3072, 768).value(), 0);
  // The layer's figure is the largest of its GEMMs', the forward one above included.
  EXPECT_GE(LinearWorkspaceBytes(BareContext(CpuGemm::kOneDnn), 1024, 3072, 768).value(), *onednn);
  // Nothing reaches a library for an empty GEMM.
  EXPECT_EQ(
      GemmWorkspaceBytes(BareContext(CpuGemm::kOneDnn), {.m = 1024, .n = 768, .k = 0}).value(), 0);
}

TEST(LinearWorkspaceTest, NegativeDimensionIsInvalidArgumentNamingTheField) {
  const absl::StatusOr<int64_t> bytes =
      GemmWorkspaceBytes(BareContext(CpuGemm::kOneDnn), {.m = 4, .n = -2, .k = 8});
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bytes.status().message().find("shape.n is -2"), std::string::npos) << bytes.status();
}

TEST(LinearWorkspaceTest, TooSmallWorkspaceIsFailedPreconditionNamingBothSizes) {
  // The first of these shapes for which this CPU's oneDNN kernels take scratch (its AVX-512
  // ones do at the first; its AVX2 ones split a long sum across threads and take scratch for
  // the partial sums).
  int m = 0, n = 0, k = 0;
  int64_t need = 0;
  for (const auto& [mm, nn, kk] : {std::tuple{256, 192, 512}, std::tuple{64, 64, 8192},
                                  std::tuple{16, 16, 65536}, std::tuple{256, 256, 16384}}) {
    need = GemmWorkspaceBytes(BareContext(CpuGemm::kOneDnn), {.m = mm, .n = nn, .k = kk}).value();
    if (need > 0) {
      std::tie(m, n, k) = std::tie(mm, nn, kk);
      break;
    }
  }
  if (need == 0) {
    GTEST_SKIP() << "oneDNN (" << CpuGemmDescription(CpuGemm::kOneDnn)
                 << ") takes no scratch for any GEMM shape tried here";
  }
  std::vector<float> a = RandomVector(int64_t{m} * k, 31), b = RandomVector(int64_t{k} * n, 32);
  std::vector<float> c(int64_t{m} * n, 0.0f);
  const GemmShape shape = {.m = m, .n = n, .k = k};
  ASSERT_EQ(GemmWorkspaceBytes(BareContext(CpuGemm::kOneDnn), shape).value(), need);
  for (const int64_t have : {int64_t{0}, need - 1}) {
    const OwnedContext owned(CpuGemm::kOneDnn, 2, have);
    const absl::Status s = Gemm(owned.ctx(), View(a, {m, k}), View(b, {k, n}), View(c, {m, n}), {});
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find(absl::StrCat(m, "x", n, "x", k, " (NN): needs ", need,
                                            " workspace bytes, context has ", have)),
              std::string::npos)
        << s;
  }
  // The linear layer passes the same error up (its GEMM is NT: asked separately).
  std::vector<float> weight = RandomVector(int64_t{n} * k, 33);
  if (LinearWorkspaceBytes(BareContext(CpuGemm::kOneDnn), m, k, n).value() > 0) {
    const absl::Status s = LinearForward(
        BareContext(CpuGemm::kOneDnn),
        {.inp = View(a, {m, k}), .weight = View(weight, {n, k}), .out = View(c, {m, n})});
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  }
  // OpenBLAS takes no workspace, so an empty one is enough.
  EXPECT_TRUE(
      Gemm(BareContext(CpuGemm::kOpenBlas), View(a, {m, k}), View(b, {k, n}), View(c, {m, n}), {})
          .ok());
}

TEST(LinearWorkspaceTest, RepeatedGemmReusesTheCachedPrimitive) {
  // A shape no other test uses, so the cache grows by this test's entries only.
  const int m = 41, n = 43, k = 47;
  std::vector<float> a = RandomVector(m * k, 34), b = RandomVector(k * n, 35), c(m * n);
  const int64_t before = internal::GemmPrimitiveCacheSize();
  const OwnedContext owned = GemmContext(CpuGemm::kOneDnn, {.m = m, .n = n, .k = k});
  EXPECT_EQ(internal::GemmPrimitiveCacheSize(), before + 1);  // sizing created the entry
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(Gemm(owned.ctx(), View(a, {m, k}), View(b, {k, n}), View(c, {m, n}), {}).ok());
    EXPECT_EQ(internal::GemmPrimitiveCacheSize(), before + 1) << "call " << i;
  }
  // The thread count is part of the key: oneDNN splits the work and the scratch by it.
  const OwnedContext one_thread = GemmContext(CpuGemm::kOneDnn, {.m = m, .n = n, .k = k}, 1);
  ASSERT_TRUE(Gemm(one_thread.ctx(), View(a, {m, k}), View(b, {k, n}), View(c, {m, n}), {}).ok());
  EXPECT_EQ(internal::GemmPrimitiveCacheSize(), before + 2);
  // OpenBLAS never touches the cache.
  ASSERT_TRUE(
      Gemm(BareContext(CpuGemm::kOpenBlas), View(a, {m, k}), View(b, {k, n}), View(c, {m, n}), {})
          .ok());
  EXPECT_EQ(internal::GemmPrimitiveCacheSize(), before + 2);
}

TEST(LinearWorkspaceTest, RepeatedCallsAreBitwiseIdentical) {
  const int m = 200, k = 300, n = 150;
  std::vector<float> inp = RandomVector(m * k, 36), weight = RandomVector(n * k, 37);
  std::vector<float> bias = RandomVector(n, 38), dout = RandomVector(m * n, 39);
  const OwnedContext owned = LinearContext(CpuGemm::kOneDnn, m, k, n);
  std::vector<float> first_out, first_dinp, first_dweight;
  for (int i = 0; i < 3; ++i) {
    std::vector<float> out(m * n), dinp(m * k), dweight(n * k, 0.25f);
    ASSERT_TRUE(LinearForward(owned.ctx(), {.inp = View(inp, {m, k}),
                                            .weight = View(weight, {n, k}),
                                            .bias = View(bias, {n}),
                                            .out = View(out, {m, n})})
                    .ok());
    ASSERT_TRUE(LinearBackward(owned.ctx(), {.dout = View(dout, {m, n}),
                                             .inp = View(inp, {m, k}),
                                             .weight = View(weight, {n, k}),
                                             .dinp = View(dinp, {m, k}),
                                             .dweight = View(dweight, {n, k})})
                    .ok());
    if (i == 0) {
      first_out = out;
      first_dinp = dinp;
      first_dweight = dweight;
      // Guards against three identically wrong answers: the float64 forward, f32 sums of 300
      // products < 1 plus a bias (≤ 301 · 2⁻²⁴ ≈ 2e-5 absolute).
      const std::vector<double> bias64 = ToDouble(bias);
      const std::vector<double> want = LinearRef(ToDouble(inp), ToDouble(weight), &bias64, m, k, n);
      EXPECT_LT(MaxRelativeError(out, want, 0.05), 1e-3);
    } else {
      EXPECT_TRUE(SameBits(out, first_out)) << "call " << i;
      EXPECT_TRUE(SameBits(dinp, first_dinp)) << "call " << i;
      EXPECT_TRUE(SameBits(dweight, first_dweight)) << "call " << i;
    }
  }
}

TEST(LinearTest, DescriptionNamesLibraryAndIsa) {
  EXPECT_NE(CpuGemmDescription(CpuGemm::kOneDnn).find("oneDNN"), std::string::npos);
  EXPECT_NE(CpuGemmDescription(CpuGemm::kOneDnn).find("matmul"), std::string::npos);
  EXPECT_NE(CpuGemmDescription(CpuGemm::kOneDnn).find("ISA"), std::string::npos);
  EXPECT_NE(CpuGemmDescription(CpuGemm::kOpenBlas).find("OpenBLAS"), std::string::npos);
}

}  // namespace
}  // namespace zt
