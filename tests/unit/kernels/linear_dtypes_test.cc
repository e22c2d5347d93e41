// Tests of kernels/linear.h with 16-bit operands: Gemm and the linear layer with f32, bf16 and
// f16 tensors in the combinations mixed precision uses, on both CPU GEMM backends, against a
// float64 reference computed from the 16-bit-rounded inputs; the workspace each combination
// takes (exact to the byte) and determinism.
//
// The bound every comparison uses: the kernel sums its products in fp32 and rounds the sum
// once (to nearest even) to the output dtype. Any fp32 summation order of n terms errs by at
// most (n − 1)·u·Σ|term| (u = 2⁻²⁴, Higham §3.1); alpha's scaling, beta·c's addition and the
// sum post-op add at most three more roundings, so the fp32 result is within
// (n + 3)·u·Σ|term| of the exact value. Rounding that to nearest in the output dtype adds at
// most half an ulp of |exact| (also when the fp32 value and the exact one straddle a power of
// two: the grid below it is the finer one). A kernel that truncated instead of rounding,
// accumulated in 16 bits, or rounded an input or the result twice misses this bound (bf16's
// ulp is 2¹⁶ times f32's).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/dtype.h"
#include "kernels/linear.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using ::zt::testing::RandomVector;

// A matrix stored in `dtype`: f32 values are rounded to it on construction.
class Stored {
 public:
  Stored(const std::vector<float>& values, DType dtype)
      : dtype_(dtype), bytes_(values.size() * DTypeSize(dtype)) {
    for (size_t i = 0; i < values.size(); ++i) {
      if (dtype == DType::kF32) {
        std::memcpy(bytes_.data() + 4 * i, &values[i], 4);
      } else {
        const uint16_t h = dtype == DType::kBF16 ? FloatToBf16(values[i]) : FloatToHalf(values[i]);
        std::memcpy(bytes_.data() + 2 * i, &h, 2);
      }
    }
  }

  Tensor View(std::initializer_list<int64_t> shape) { return Tensor(bytes_.data(), dtype_, shape); }
  // The stored values, exactly.
  std::vector<double> Values() const {
    const size_t n = bytes_.size() / DTypeSize(dtype_);
    std::vector<double> v(n);
    for (size_t i = 0; i < n; ++i) {
      if (dtype_ == DType::kF32) {
        float f;
        std::memcpy(&f, bytes_.data() + 4 * i, 4);
        v[i] = f;
      } else {
        uint16_t h;
        std::memcpy(&h, bytes_.data() + 2 * i, 2);
        v[i] = dtype_ == DType::kBF16 ? Bf16ToFloat(h) : HalfToFloat(h);
      }
    }
    return v;
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  DType dtype_;
  std::vector<uint8_t> bytes_;
};

Stored RandomStored(size_t n, uint32_t seed, DType dtype) {
  return Stored(RandomVector(n, seed), dtype);
}

// One unit in the last place of `x` in `dtype` (subnormals included).
double Ulp(DType dtype, double x) {
  const int mantissa = dtype == DType::kF32 ? 23 : dtype == DType::kBF16 ? 7 : 10;
  const int min_exp = dtype == DType::kF16 ? -14 : -126;
  int e = min_exp + 1;
  if (x != 0.0) std::frexp(x, &e);  // |x| = f · 2^e, f in [0.5, 1)
  return std::ldexp(1.0, std::max(e - 1, min_exp) - mantissa);
}

// An exact result and the Σ|term| its rounding error scales with.
struct Reference {
  std::vector<double> exact, magnitude;
};

// The worst |got − exact| over the bound of the file comment for n-term sums; ≤ 1 passes.
double WorstBoundRatio(const Stored& got, DType dtype, const Reference& ref, int64_t n) {
  const std::vector<double> values = got.Values();
  EXPECT_EQ(values.size(), ref.exact.size());
  const double u = std::ldexp(1.0, -24);
  double worst = 0;
  for (size_t i = 0; i < values.size() && i < ref.exact.size(); ++i) {
    const double bound =
        0.5 * Ulp(dtype, ref.exact[i]) + static_cast<double>(n + 3) * u * ref.magnitude[i];
    worst = std::max(worst, std::abs(values[i] - ref.exact[i]) / bound);
  }
  return worst;
}

// c = alpha · op(a) · op(b) + beta · c in float64, from the stored values.
Reference GemmRef(const std::vector<double>& a, const std::vector<double>& b,
                  const std::vector<double>& c, int64_t m, int64_t n, int64_t k, Transpose ta,
                  Transpose tb, double alpha, double beta) {
  Reference r{std::vector<double>(m * n), std::vector<double>(m * n)};
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0, mag = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = ta == Transpose::kYes ? a[p * m + i] : a[i * k + p];
        const double bv = tb == Transpose::kYes ? b[j * k + p] : b[p * n + j];
        acc += av * bv;
        mag += std::abs(av * bv);
      }
      r.exact[i * n + j] = alpha * acc + beta * c[i * n + j];
      r.magnitude[i * n + j] = std::abs(alpha) * mag + std::abs(beta * c[i * n + j]);
    }
  }
  return r;
}

DeviceContext BareContext(CpuGemm gemm, int threads = 2) {
  DeviceContext ctx = CpuContext(threads);
  ctx.cpu_gemm = gemm;
  return ctx;
}

// A context whose workspace is exactly `bytes` long, followed by guard bytes that a GEMM
// writing past its figure would change.
class GuardedContext {
 public:
  static constexpr size_t kGuard = 4096;
  GuardedContext(CpuGemm gemm, int64_t bytes, int threads = 2)
      : ctx_(BareContext(gemm, threads)), buffer_(static_cast<size_t>(bytes) + kGuard, 0xA5) {
    ctx_.workspace = {.data = buffer_.data(), .bytes = bytes};
  }
  GuardedContext(const GuardedContext&) = delete;
  GuardedContext& operator=(const GuardedContext&) = delete;

  const DeviceContext& ctx() const { return ctx_; }
  bool GuardIntact() const {
    return std::all_of(buffer_.end() - kGuard, buffer_.end(), [](uint8_t x) { return x == 0xA5; });
  }

 private:
  DeviceContext ctx_;
  std::vector<uint8_t> buffer_;
};

const char* Name(CpuGemm gemm) { return gemm == CpuGemm::kOneDnn ? "OneDnn" : "OpenBlas"; }

class LinearDTypeTest : public ::testing::TestWithParam<CpuGemm> {};

struct GemmCase {
  DType a, b, c;
};

TEST_P(LinearDTypeTest, GemmRoundsOnceForEveryTransposeAndDTypeMix) {
  const int64_t m = 37, n = 29, k = 83;
  const float alpha = 0.5f, beta = 0.75f;
  const GemmCase cases[] = {
      {DType::kBF16, DType::kBF16, DType::kBF16},  // oneDNN's bf16 kernel, sum read in bf16
      {DType::kBF16, DType::kBF16, DType::kF32},   // oneDNN's bf16 kernel, f32 out
      {DType::kF16, DType::kF16, DType::kF16},     // widened, f16 result scratch
      {DType::kF32, DType::kBF16, DType::kF32},    // one operand widened
      {DType::kF16, DType::kBF16, DType::kBF16},   // two different 16-bit operands
      {DType::kF32, DType::kF32, DType::kBF16},    // only the result narrowed
  };
  for (const GemmCase& cs : cases) {
    for (Transpose ta : {Transpose::kNo, Transpose::kYes}) {
      for (Transpose tb : {Transpose::kNo, Transpose::kYes}) {
        Stored a = RandomStored(m * k, 1, cs.a), b = RandomStored(k * n, 2, cs.b);
        Stored c = RandomStored(m * n, 3, cs.c);
        const Reference ref =
            GemmRef(a.Values(), b.Values(), c.Values(), m, n, k, ta, tb, alpha, beta);
        const GemmShape shape = {.m = m,
                                 .n = n,
                                 .k = k,
                                 .trans_a = ta,
                                 .trans_b = tb,
                                 .accumulate = true,
                                 .a_dtype = cs.a,
                                 .b_dtype = cs.b,
                                 .c_dtype = cs.c};
        const GuardedContext owned(GetParam(),
                                   GemmWorkspaceBytes(BareContext(GetParam()), shape).value());
        const std::string label =
            absl::StrCat(DTypeName(cs.a), " x ", DTypeName(cs.b), " -> ", DTypeName(cs.c),
                         " trans ", ta == Transpose::kYes, tb == Transpose::kYes);
        const Tensor av = ta == Transpose::kYes ? a.View({k, m}) : a.View({m, k});
        const Tensor bv = tb == Transpose::kYes ? b.View({n, k}) : b.View({k, n});
        const absl::Status s = Gemm(owned.ctx(), av, bv, c.View({m, n}),
                                    {.trans_a = ta, .trans_b = tb, .alpha = alpha, .beta = beta});
        ASSERT_TRUE(s.ok()) << label << ": " << s;
        EXPECT_LE(WorstBoundRatio(c, cs.c, ref, k), 1.0) << label;
        EXPECT_TRUE(owned.GuardIntact()) << label;
      }
    }
  }
}

// The forward of a layer: out = inp · weightᵀ + bias, bias taken in out's dtype.
struct ForwardCase {
  DType inp, weight, bias, out;
};

TEST_P(LinearDTypeTest, ForwardMatchesFloat64ReferenceOfTheRoundedInputs) {
  const int64_t m = 64, k = 96, n = 48;
  const ForwardCase cases[] = {
      {DType::kBF16, DType::kBF16, DType::kBF16, DType::kBF16},
      {DType::kBF16, DType::kBF16, DType::kF32, DType::kF32},
      {DType::kF16, DType::kF16, DType::kF16, DType::kF16},
      {DType::kF32, DType::kBF16, DType::kF32, DType::kF32},
  };
  for (const ForwardCase& cs : cases) {
    Stored inp = RandomStored(m * k, 4, cs.inp), weight = RandomStored(n * k, 5, cs.weight);
    Stored bias = RandomStored(n, 6, cs.bias);
    const std::vector<double> x = inp.Values(), w = weight.Values(), b = bias.Values();
    Reference ref{std::vector<double>(m * n), std::vector<double>(m * n)};
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        // The bias in out's dtype: exact here, since each case stores it there already.
        double acc = b[j], mag = std::abs(b[j]);
        for (int64_t p = 0; p < k; ++p) {
          acc += x[i * k + p] * w[j * k + p];
          mag += std::abs(x[i * k + p] * w[j * k + p]);
        }
        ref.exact[i * n + j] = acc;
        ref.magnitude[i * n + j] = mag;
      }
    }
    const LinearDTypes dtypes = {.inp = cs.inp, .weight = cs.weight, .out = cs.out};
    const GuardedContext owned(
        GetParam(), LinearWorkspaceBytes(BareContext(GetParam()), m, k, n, dtypes).value());
    Stored out(std::vector<float>(m * n, 7.0f), cs.out);  // stale values must be overwritten
    const std::string label =
        absl::StrCat(DTypeName(cs.inp), " x ", DTypeName(cs.weight), " -> ", DTypeName(cs.out));
    const absl::Status s = LinearForward(owned.ctx(), {.inp = inp.View({m, k}),
                                                       .weight = weight.View({n, k}),
                                                       .bias = bias.View({n}),
                                                       .out = out.View({m, n})});
    ASSERT_TRUE(s.ok()) << label << ": " << s;
    EXPECT_LE(WorstBoundRatio(out, cs.out, ref, k), 1.0) << label;
    EXPECT_TRUE(owned.GuardIntact()) << label;
  }
}

// The backward of a layer with dout, inp and weight in one dtype, dinp and the parameter
// gradients in theirs.
struct BackwardCase {
  DType act, weight, dinp, dweight, dbias;
  Accumulate dinp_mode;
};

TEST_P(LinearDTypeTest, BackwardMatchesFloat64ReferenceOfTheRoundedInputs) {
  const int64_t m = 80, k = 40, n = 56;
  const BackwardCase cases[] = {
      // bf16 activations, f32 parameter gradients accumulated, bf16 dinp added to.
      {DType::kBF16, DType::kBF16, DType::kBF16, DType::kF32, DType::kF32, Accumulate::kAdd},
      // f16 activations, f32 weight gradient, f16 dinp written.
      {DType::kF16, DType::kF16, DType::kF16, DType::kF32, DType::kF16, Accumulate::kOverwrite},
      // 16-bit gradients accumulated in place: read, added in fp32, rounded back.
      {DType::kBF16, DType::kBF16, DType::kF32, DType::kBF16, DType::kBF16, Accumulate::kAdd},
  };
  for (const BackwardCase& cs : cases) {
    Stored dout = RandomStored(m * n, 7, cs.act), inp = RandomStored(m * k, 8, cs.act);
    Stored weight = RandomStored(n * k, 9, cs.weight);
    Stored dinp = RandomStored(m * k, 10, cs.dinp), dweight = RandomStored(n * k, 11, cs.dweight);
    Stored dbias = RandomStored(n, 12, cs.dbias);
    const std::vector<double> g = dout.Values(), x = inp.Values(), w = weight.Values();
    const bool add = cs.dinp_mode == Accumulate::kAdd;
    // dinp = dout · weight (+ prior), dweight += doutᵀ · inp, dbias += Σ rows of dout.
    const Reference want_dinp =
        GemmRef(g, w, dinp.Values(), m, k, n, Transpose::kNo, Transpose::kNo, 1.0, add ? 1.0 : 0.0);
    const Reference want_dweight =
        GemmRef(g, x, dweight.Values(), n, k, m, Transpose::kYes, Transpose::kNo, 1.0, 1.0);
    const std::vector<double> ones(m, 1.0);
    const Reference want_dbias =
        GemmRef(ones, g, dbias.Values(), 1, n, m, Transpose::kNo, Transpose::kNo, 1.0, 1.0);
    const LinearDTypes dtypes = {.inp = cs.act,
                                 .weight = cs.weight,
                                 .out = cs.act,
                                 .dout = cs.act,
                                 .dinp = cs.dinp,
                                 .dweight = cs.dweight};
    const GuardedContext owned(
        GetParam(), LinearWorkspaceBytes(BareContext(GetParam()), m, k, n, dtypes).value());
    const std::string label =
        absl::StrCat(DTypeName(cs.act), " -> dinp ", DTypeName(cs.dinp), " dweight ",
                     DTypeName(cs.dweight), " dbias ", DTypeName(cs.dbias));
    const absl::Status s = LinearBackward(owned.ctx(), {.dout = dout.View({m, n}),
                                                        .inp = inp.View({m, k}),
                                                        .weight = weight.View({n, k}),
                                                        .dinp = dinp.View({m, k}),
                                                        .dweight = dweight.View({n, k}),
                                                        .dbias = dbias.View({n}),
                                                        .dinp_mode = cs.dinp_mode});
    ASSERT_TRUE(s.ok()) << label << ": " << s;
    EXPECT_LE(WorstBoundRatio(dinp, cs.dinp, want_dinp, n), 1.0) << label;
    EXPECT_LE(WorstBoundRatio(dweight, cs.dweight, want_dweight, m), 1.0) << label;
    // dbias is summed in float64 and rounded to f32, then to its dtype: within the same bound.
    EXPECT_LE(WorstBoundRatio(dbias, cs.dbias, want_dbias, m), 1.0) << label;
    EXPECT_TRUE(owned.GuardIntact()) << label;
  }
}

TEST_P(LinearDTypeTest, WorkspaceFigureIsExactlyWhatTheGemmNeeds) {
  const int64_t m = 96, n = 80, k = 112;
  const GemmCase cases[] = {
      {DType::kBF16, DType::kBF16, DType::kF32}, {DType::kBF16, DType::kBF16, DType::kBF16},
      {DType::kF16, DType::kF16, DType::kF16},   {DType::kF32, DType::kBF16, DType::kF32},
      {DType::kBF16, DType::kF32, DType::kBF16},
  };
  for (const GemmCase& cs : cases) {
    for (bool accumulate : {false, true}) {
      const GemmShape shape = {.m = m,
                               .n = n,
                               .k = k,
                               .trans_b = Transpose::kYes,
                               .accumulate = accumulate,
                               .a_dtype = cs.a,
                               .b_dtype = cs.b,
                               .c_dtype = cs.c};
      const std::string label = absl::StrCat(DTypeName(cs.a), " x ", DTypeName(cs.b), " -> ",
                                             DTypeName(cs.c), " accumulate ", accumulate);
      const int64_t need = GemmWorkspaceBytes(BareContext(GetParam()), shape).value();
      if (GetParam() == CpuGemm::kOpenBlas) {
        // OpenBLAS needs nothing of its own: the figure is the f32 copies of the 16-bit
        // matrices, each rounded up to 64 bytes.
        auto copy = [](DType t, int64_t elements) {
          return t == DType::kF32 ? 0 : (elements * 4 + 63) / 64 * 64;
        };
        EXPECT_EQ(need, copy(cs.a, m * k) + copy(cs.b, k * n) + copy(cs.c, m * n)) << label;
      }
      ASSERT_GT(need, 0) << label;
      Stored a = RandomStored(m * k, 13, cs.a), b = RandomStored(n * k, 14, cs.b);
      Stored c = RandomStored(m * n, 15, cs.c);
      const Reference ref = GemmRef(a.Values(), b.Values(), c.Values(), m, n, k, Transpose::kNo,
                                    Transpose::kYes, 1.0, accumulate ? 1.0 : 0.0);
      const GemmArgs args = {.trans_b = Transpose::kYes, .beta = accumulate ? 1.0f : 0.0f};
      {
        const GuardedContext exact(GetParam(), need);
        const absl::Status s =
            Gemm(exact.ctx(), a.View({m, k}), b.View({n, k}), c.View({m, n}), args);
        ASSERT_TRUE(s.ok()) << label << ": " << s;
        EXPECT_LE(WorstBoundRatio(c, cs.c, ref, k), 1.0) << label;
        EXPECT_TRUE(exact.GuardIntact()) << label;
      }
      const GuardedContext short_by_one(GetParam(), need - 1);
      const absl::Status s =
          Gemm(short_by_one.ctx(), a.View({m, k}), b.View({n, k}), c.View({m, n}), args);
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << label << ": " << s;
      EXPECT_NE(s.message().find(
                    absl::StrCat("needs ", need, " workspace bytes, context has ", need - 1)),
                std::string::npos)
          << label << ": " << s;
      EXPECT_NE(s.message().find(absl::StrCat(DTypeName(cs.a), " x ", DTypeName(cs.b))),
                std::string::npos)
          << label << ": " << s;
    }
  }
}

TEST_P(LinearDTypeTest, RepeatedCallsAreBitwiseIdentical) {
  const int64_t m = 120, k = 200, n = 72;
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    Stored inp = RandomStored(m * k, 16, dtype), weight = RandomStored(n * k, 17, dtype);
    const LinearDTypes dtypes = LinearDTypes::ForPrecision(dtype, dtype, DType::kF32);
    const GuardedContext owned(
        GetParam(), LinearWorkspaceBytes(BareContext(GetParam()), m, k, n, dtypes).value());
    std::vector<uint8_t> first;
    for (int i = 0; i < 3; ++i) {
      Stored out(std::vector<float>(m * n, 0.0f), dtype);
      ASSERT_TRUE(LinearForward(owned.ctx(), {.inp = inp.View({m, k}),
                                              .weight = weight.View({n, k}),
                                              .out = out.View({m, n})})
                      .ok());
      if (i == 0) {
        first = out.bytes();
        // Guards against three identically wrong answers.
        const Reference ref = GemmRef(inp.Values(), weight.Values(), std::vector<double>(m * n), m,
                                      n, k, Transpose::kNo, Transpose::kYes, 1.0, 0.0);
        EXPECT_LE(WorstBoundRatio(out, dtype, ref, k), 1.0) << DTypeName(dtype);
      } else {
        EXPECT_EQ(out.bytes(), first) << DTypeName(dtype) << " call " << i;
      }
    }
  }
}

// oneDNN's AVX-512 f32 matmul gives the same bits for any thread count at this shape (it
// splits rows and columns, never the sum); the bf16 kernel and the widened path keep that.
// Its AVX2 f32 kernels (a CPU without AVX-512) split the sum across threads, so there an f32
// result (f32 inputs, or bf16 widened to f32) is held to the error bound at every thread count
// instead. OpenBLAS's f32 sgemm does not keep
// the bits either, so neither do its widened calls.
TEST(LinearDTypeDeterminismTest, OneDnnResultsDoNotDependOnTheThreadCount) {
  const bool f32_splits_rows_only =
      absl::StrContains(CpuGemmDescription(CpuGemm::kOneDnn), "avx512");
  const int64_t m = 200, n = 150, k = 300;
  const GemmCase cases[] = {{DType::kF32, DType::kF32, DType::kF32},
                            {DType::kBF16, DType::kBF16, DType::kBF16},
                            {DType::kBF16, DType::kBF16, DType::kF32},
                            {DType::kF16, DType::kF16, DType::kF16}};
  for (const GemmCase& cs : cases) {
    for (Transpose ta : {Transpose::kNo, Transpose::kYes}) {
      const std::string label = absl::StrCat(DTypeName(cs.a), " -> ", DTypeName(cs.c), " trans_a ",
                                             ta == Transpose::kYes);
      Stored a = RandomStored(m * k, 19, cs.a), b = RandomStored(n * k, 20, cs.b);
      const Stored c0 = RandomStored(m * n, 21, cs.c);
      std::vector<uint8_t> first;
      for (int threads : {1, 2, 3}) {
        const GemmShape shape = {.m = m,
                                 .n = n,
                                 .k = k,
                                 .trans_a = ta,
                                 .trans_b = Transpose::kYes,
                                 .accumulate = true,
                                 .a_dtype = cs.a,
                                 .b_dtype = cs.b,
                                 .c_dtype = cs.c};
        const GuardedContext owned(
            CpuGemm::kOneDnn,
            GemmWorkspaceBytes(BareContext(CpuGemm::kOneDnn, threads), shape).value(), threads);
        Stored c = c0;
        const Tensor av = ta == Transpose::kYes ? a.View({k, m}) : a.View({m, k});
        ASSERT_TRUE(Gemm(owned.ctx(), av, b.View({n, k}), c.View({m, n}),
                         {.trans_a = ta, .trans_b = Transpose::kYes, .beta = 1.0f})
                        .ok())
            << label;
        // An f32 result comes from the f32 kernel, also on the widened path from bf16.
        const bool f32_kernel = cs.c == DType::kF32;
        if (threads == 1 || (f32_kernel && !f32_splits_rows_only)) {
          if (threads == 1) first = c.bytes();
          const Reference ref =
              GemmRef(a.Values(), b.Values(), c0.Values(), m, n, k, ta, Transpose::kYes, 1.0, 1.0);
          EXPECT_LE(WorstBoundRatio(c, cs.c, ref, k), 1.0) << label << ", " << threads << " threads";
        } else {
          EXPECT_EQ(c.bytes(), first) << label << ", " << threads << " threads";
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, LinearDTypeTest,
                         ::testing::Values(CpuGemm::kOneDnn, CpuGemm::kOpenBlas),
                         [](const ::testing::TestParamInfo<CpuGemm>& info) {
                           return std::string(Name(info.param));
                         });

TEST(LinearDTypeWorkspaceTest, LayerFigureIsTheLargestOfItsGemms) {
  const DeviceContext ctx = BareContext(CpuGemm::kOneDnn);
  const int64_t m = 256, k = 192, n = 320;
  // f16 activations with bf16 parameters and f32 gradients: every GEMM widens something.
  const LinearDTypes d = {.inp = DType::kF16,
                          .weight = DType::kBF16,
                          .out = DType::kF16,
                          .dout = DType::kF16,
                          .dinp = DType::kF16,
                          .dweight = DType::kF32};
  int64_t most = 0;
  for (bool acc : {false, true}) {
    most = std::max(most, GemmWorkspaceBytes(ctx, {.m = m,
                                                   .n = n,
                                                   .k = k,
                                                   .trans_b = Transpose::kYes,
                                                   .accumulate = acc,
                                                   .a_dtype = d.inp,
                                                   .b_dtype = d.weight,
                                                   .c_dtype = d.out})
                              .value());
    most = std::max(most, GemmWorkspaceBytes(ctx, {.m = m,
                                                   .n = k,
                                                   .k = n,
                                                   .accumulate = acc,
                                                   .a_dtype = d.dout,
                                                   .b_dtype = d.weight,
                                                   .c_dtype = d.dinp})
                              .value());
  }
  most = std::max(most, GemmWorkspaceBytes(ctx, {.m = n,
                                                 .n = k,
                                                 .k = m,
                                                 .trans_a = Transpose::kYes,
                                                 .accumulate = true,
                                                 .a_dtype = d.dout,
                                                 .b_dtype = d.inp,
                                                 .c_dtype = d.dweight})
                            .value());
  EXPECT_EQ(LinearWorkspaceBytes(ctx, m, k, n, d).value(), most);
  // Widening needs more than the f32 layer: at least the f32 copy of the (m, n) output.
  EXPECT_GE(most, LinearWorkspaceBytes(ctx, m, k, n).value());
  EXPECT_GE(most, m * n * 4);
  // ForPrecision maps compute, parameter and gradient dtypes onto the layer's tensors.
  const LinearDTypes p = LinearDTypes::ForPrecision(DType::kF16, DType::kBF16, DType::kF32);
  EXPECT_EQ(LinearWorkspaceBytes(ctx, m, k, n, p).value(), most);
}

TEST(LinearDTypeWorkspaceTest, NonFloatDTypesAreInvalidArgumentsNamingTheArgument) {
  const DeviceContext ctx = CpuContext(1);
  const absl::StatusOr<int64_t> bytes =
      GemmWorkspaceBytes(ctx, {.m = 4, .n = 4, .k = 4, .b_dtype = DType::kI32});
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bytes.status().message().find("shape.b_dtype"), std::string::npos) << bytes.status();
  std::vector<float> buf(64, 0.0f);
  const Tensor f(buf.data(), DType::kF32, {4, 4});
  const absl::Status s = Gemm(ctx, f, f, Tensor(buf.data(), DType::kU8, {4, 4}), {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("c has dtype u8"), std::string::npos) << s;
}

TEST(LinearDTypeTest, ZeroInnerDimensionScalesA16BitCByBeta) {
  const int64_t m = 5, n = 7;
  std::vector<uint16_t> a(1), b(1);
  Stored c = RandomStored(m * n, 18, DType::kBF16);
  const std::vector<double> before = c.Values();
  ASSERT_TRUE(Gemm(BareContext(CpuGemm::kOneDnn), Tensor(a.data(), DType::kBF16, {m, 0}),
                   Tensor(b.data(), DType::kBF16, {0, n}), c.View({m, n}), {.beta = 0.5f})
                  .ok());
  const std::vector<double> after = c.Values();
  // Halving a bf16 value is exact.
  for (int64_t i = 0; i < m * n; ++i) EXPECT_EQ(after[i], 0.5 * before[i]) << i;
}

}  // namespace
}  // namespace zt
