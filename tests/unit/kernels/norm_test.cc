// kernels/norm: LayerNorm and RMSNorm forward against float64, backward against finite
// differences of L = Σ w·out, the dinp_mode and += rules, thread-count determinism, errors.
#include "kernels/norm.h"

#include <algorithm>
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

constexpr float kEps = 1e-5f;

// Float64 reference of either norm: out, and per row the saved mean (0 for RMSNorm) and rstd.
struct Reference {
  std::vector<double> out, mean, rstd;
};
Reference ReferenceNorm(bool layer_norm, int64_t n, int64_t c, const std::vector<double>& x,
                        const std::vector<double>& w, const std::vector<double>& b) {
  Reference r{std::vector<double>(n * c), std::vector<double>(n), std::vector<double>(n)};
  for (int64_t i = 0; i < n; ++i) {
    const double* row = &x[i * c];
    double mean = 0;
    if (layer_norm) {
      for (int64_t j = 0; j < c; ++j) mean += row[j];
      mean /= c;
    }
    double ms = 0;
    for (int64_t j = 0; j < c; ++j) ms += (row[j] - mean) * (row[j] - mean);
    const double rstd = 1.0 / std::sqrt(ms / c + kEps);
    for (int64_t j = 0; j < c; ++j) {
      r.out[i * c + j] = (row[j] - mean) * rstd * w[j] + (layer_norm ? b[j] : 0.0);
    }
    r.mean[i] = mean;
    r.rstd[i] = rstd;
  }
  return r;
}

// Buffers of one norm call; LayerNorm uses all of them, RMSNorm neither bias nor mean.
struct NormBuffers {
  int64_t n, c;
  std::vector<float> inp, weight, bias, out, mean, rstd, dout, dinp, dweight, dbias;
  NormBuffers(int64_t rows, int64_t channels, uint32_t seed)
      : n(rows),
        c(channels),
        inp(RandomVector(rows * channels, seed, -1.0f, 2.0f)),  // mean far from 0
        weight(RandomVector(channels, seed + 1, 0.5f, 1.5f)),
        bias(RandomVector(channels, seed + 2)),
        out(rows * channels),
        mean(rows),
        rstd(rows),
        dout(RandomVector(rows * channels, seed + 3)),
        dinp(RandomVector(rows * channels, seed + 4)),
        dweight(RandomVector(channels, seed + 5)),
        dbias(RandomVector(channels, seed + 6)) {}
  Tensor T(std::vector<float>& v, int64_t rows, int64_t cols) {
    return Tensor(v.data(), DType::kF32, {rows, cols});
  }
  Tensor V(std::vector<float>& v) {
    return Tensor(v.data(), DType::kF32, {static_cast<int64_t>(v.size())});
  }
  absl::Status Forward(bool layer_norm, int threads) {
    if (layer_norm) {
      return LayerNormForward(CpuContext(threads), {.inp = T(inp, n, c),
                                                    .weight = V(weight),
                                                    .bias = V(bias),
                                                    .out = T(out, n, c),
                                                    .mean = V(mean),
                                                    .rstd = V(rstd),
                                                    .eps = kEps});
    }
    return RmsNormForward(CpuContext(threads), {.inp = T(inp, n, c),
                                                .weight = V(weight),
                                                .out = T(out, n, c),
                                                .rstd = V(rstd),
                                                .eps = kEps});
  }
  absl::Status Backward(bool layer_norm, int threads, Accumulate mode) {
    if (layer_norm) {
      return LayerNormBackward(CpuContext(threads), {.dout = T(dout, n, c),
                                                     .inp = T(inp, n, c),
                                                     .weight = V(weight),
                                                     .mean = V(mean),
                                                     .rstd = V(rstd),
                                                     .dinp = T(dinp, n, c),
                                                     .dweight = V(dweight),
                                                     .dbias = V(dbias),
                                                     .dinp_mode = mode});
    }
    return RmsNormBackward(CpuContext(threads), {.dout = T(dout, n, c),
                                                 .inp = T(inp, n, c),
                                                 .weight = V(weight),
                                                 .rstd = V(rstd),
                                                 .dinp = T(dinp, n, c),
                                                 .dweight = V(dweight),
                                                 .dinp_mode = mode});
  }
};

class NormTest : public ::testing::TestWithParam<bool> {};  // true: LayerNorm, false: RMSNorm

TEST_P(NormTest, ForwardMatchesFloat64) {
  const bool ln = GetParam();
  NormBuffers buf(9, 70, 1);
  ASSERT_TRUE(buf.Forward(ln, 2).ok());
  const Reference want =
      ReferenceNorm(ln, buf.n, buf.c, ToDouble(buf.inp), ToDouble(buf.weight), ToDouble(buf.bias));
  // out = (x − mean)·rstd·w + b adds O(1) terms, so its f32 error is absolute: a few
  // roundings of 2^-24 plus rstd's error from the C = 70-term sums (~1e-6); the floor of 0.1
  // measures it as such where an output lands near zero.
  EXPECT_LE(MaxRelativeError(buf.out, want.out, 0.1), 1e-5);
  EXPECT_LE(MaxRelativeError(buf.rstd, want.rstd), 1e-5);
  if (ln) EXPECT_LE(MaxRelativeError(buf.mean, want.mean), 1e-5);
}

TEST_P(NormTest, BackwardMatchesFiniteDifferences) {
  const bool ln = GetParam();
  NormBuffers buf(6, 70, 2);
  const std::vector<float> dweight0 = buf.dweight, dbias0 = buf.dbias;
  ASSERT_TRUE(buf.Forward(ln, 2).ok());
  ASSERT_TRUE(buf.Backward(ln, 2, Accumulate::kOverwrite).ok());

  // L = Σ dout·out as a function of [inp | weight | bias] in float64.
  const int64_t nc = buf.n * buf.c, c = buf.c;
  std::vector<double> x = ToDouble(buf.inp);
  for (float v : buf.weight) x.push_back(v);
  for (float v : buf.bias) x.push_back(v);
  auto loss = [&](const std::vector<double>& p) {
    const Reference r = ReferenceNorm(ln, buf.n, c, std::vector<double>(p.begin(), p.begin() + nc),
                                      std::vector<double>(p.begin() + nc, p.begin() + nc + c),
                                      std::vector<double>(p.begin() + nc + c, p.end()));
    double l = 0;
    for (int64_t i = 0; i < nc; ++i) l += buf.dout[i] * r.out[i];
    return l;
  };
  const std::vector<double> g = FiniteDifferenceGradient(x, loss);
  const std::vector<double> want_dinp(g.begin(), g.begin() + nc);
  std::vector<double> want_dw(g.begin() + nc, g.begin() + nc + c);
  std::vector<double> want_db(g.begin() + nc + c, g.end());
  for (int64_t j = 0; j < c; ++j) {
    want_dw[j] += dweight0[j];
    want_db[j] += dbias0[j];
  }
  // dinp is a difference of O(1) terms, so its f32 error is absolute (~C·2^-24 ≈ 4e-6 in the
  // worst case); a floor of 0.1 turns that into the bound. Central differences with h = 1e-6
  // add ~1e-9. dweight and dbias sum N = 6 rows of O(1) products.
  EXPECT_LE(MaxRelativeError(buf.dinp, want_dinp, 0.1), 1e-4);
  EXPECT_LE(MaxRelativeError(buf.dweight, want_dw), 1e-5);
  if (ln) {
    EXPECT_LE(MaxRelativeError(buf.dbias, want_db), 1e-5);
  } else {
    EXPECT_TRUE(SameBits(buf.dbias, dbias0));  // RMSNorm has no bias to touch
  }
}

TEST_P(NormTest, AddModeAddsExactlyWhatOverwriteWrites) {
  const bool ln = GetParam();
  NormBuffers over(5, 90, 3), add(5, 90, 3);
  const std::vector<float> dinp0 = add.dinp;
  ASSERT_TRUE(over.Forward(ln, 1).ok());
  ASSERT_TRUE(add.Forward(ln, 1).ok());
  ASSERT_TRUE(over.Backward(ln, 1, Accumulate::kOverwrite).ok());
  ASSERT_TRUE(add.Backward(ln, 1, Accumulate::kAdd).ok());
  for (size_t i = 0; i < dinp0.size(); ++i) {
    // The same value added: at most one rounding of the sum apart (the compiler may fuse the
    // last multiply into the add in kAdd mode, which rounds once instead of twice).
    const float sum = dinp0[i] + over.dinp[i];
    const float scale = std::max({std::abs(dinp0[i]), std::abs(over.dinp[i]), std::abs(sum)});
    EXPECT_LE(std::abs(add.dinp[i] - sum), scale * 0x1p-23f) << "element " << i;
  }
  EXPECT_TRUE(SameBits(add.dweight, over.dweight));  // parameters always accumulate
}

TEST_P(NormTest, ResultsAreBitwiseIndependentOfThreadCount) {
  const bool ln = GetParam();
  // 150 channels: two full channel blocks and a partial one; 37 rows split unevenly.
  NormBuffers one(37, 150, 4), three(37, 150, 4);
  ASSERT_TRUE(one.Forward(ln, 1).ok());
  ASSERT_TRUE(three.Forward(ln, 3).ok());
  ASSERT_TRUE(one.Backward(ln, 1, Accumulate::kAdd).ok());
  ASSERT_TRUE(three.Backward(ln, 3, Accumulate::kAdd).ok());
  EXPECT_TRUE(SameBits(one.out, three.out));
  EXPECT_TRUE(SameBits(one.rstd, three.rstd));
  EXPECT_TRUE(SameBits(one.dinp, three.dinp));
  EXPECT_TRUE(SameBits(one.dweight, three.dweight));
  EXPECT_TRUE(SameBits(one.dbias, three.dbias));
}

// The data tensors' dtypes of one 16-bit norm test (mean and rstd stay f32).
struct NormDTypes {
  DType inp, weight, bias, out, dout, dinp, dweight, dbias;
};

struct StoredNorm {
  int64_t n, c;
  Stored inp, weight, bias, out, dout, dinp, dweight, dbias;
  std::vector<float> mean, rstd;
  StoredNorm(int64_t rows, int64_t channels, uint32_t seed, const NormDTypes& t)
      : n(rows),
        c(channels),
        inp(RandomVector(rows * channels, seed, -1.0f, 2.0f), t.inp),
        weight(RandomVector(channels, seed + 1, 0.5f, 1.5f), t.weight),
        bias(RandomVector(channels, seed + 2), t.bias),
        out(rows * channels, t.out),
        dout(RandomVector(rows * channels, seed + 3), t.dout),
        dinp(rows * channels, t.dinp),
        dweight(RandomVector(channels, seed + 5), t.dweight),
        dbias(RandomVector(channels, seed + 6), t.dbias),
        mean(rows),
        rstd(rows) {}
  Tensor V(std::vector<float>& v) {
    return Tensor(v.data(), DType::kF32, {static_cast<int64_t>(v.size())});
  }
  absl::Status Run(bool layer_norm, int threads) {
    const DeviceContext ctx = CpuContext(threads);
    if (layer_norm) {
      absl::Status st = LayerNormForward(ctx, {.inp = inp.View({n, c}),
                                               .weight = weight.Flat(),
                                               .bias = bias.Flat(),
                                               .out = out.View({n, c}),
                                               .mean = V(mean),
                                               .rstd = V(rstd),
                                               .eps = kEps});
      if (!st.ok()) return st;
      return LayerNormBackward(ctx, {.dout = dout.View({n, c}),
                                     .inp = inp.View({n, c}),
                                     .weight = weight.Flat(),
                                     .mean = V(mean),
                                     .rstd = V(rstd),
                                     .dinp = dinp.View({n, c}),
                                     .dweight = dweight.Flat(),
                                     .dbias = dbias.Flat()});
    }
    absl::Status st = RmsNormForward(ctx, {.inp = inp.View({n, c}),
                                           .weight = weight.Flat(),
                                           .out = out.View({n, c}),
                                           .rstd = V(rstd),
                                           .eps = kEps});
    if (!st.ok()) return st;
    return RmsNormBackward(ctx, {.dout = dout.View({n, c}),
                                 .inp = inp.View({n, c}),
                                 .weight = weight.Flat(),
                                 .rstd = V(rstd),
                                 .dinp = dinp.View({n, c}),
                                 .dweight = dweight.Flat()});
  }
};

constexpr NormDTypes kAllBf16{DType::kBF16, DType::kBF16, DType::kBF16, DType::kBF16,
                              DType::kBF16, DType::kBF16, DType::kBF16, DType::kBF16};
constexpr NormDTypes kMixed{DType::kF16,  DType::kBF16, DType::kF32, DType::kF16,
                            DType::kBF16, DType::kF32,  DType::kF32, DType::kBF16};

// The reference runs in float64 on the stored (16-bit-rounded) inputs; every output may
// differ from it by one rounding to its dtype (one ulp allowed for the reference's double
// rounding) plus the f32 path's tolerance from ForwardMatchesFloat64 and
// BackwardMatchesFiniteDifferences (the same sizes and magnitudes are used).
TEST_P(NormTest, SixteenBitStorageMatchesFloat64) {
  const bool ln = GetParam();
  for (const NormDTypes& t : {kAllBf16, kMixed}) {
    StoredNorm buf(6, 70, 7, t);
    const std::vector<double> dweight0 = buf.dweight.Doubles(), dbias0 = buf.dbias.Doubles();
    ASSERT_TRUE(buf.Run(ln, 2).ok());
    const int64_t nc = buf.n * buf.c, c = buf.c;
    const std::vector<double> x0 = buf.inp.Doubles(), w0 = buf.weight.Doubles(),
                              b0 = buf.bias.Doubles(), dy = buf.dout.Doubles();
    const Reference want = ReferenceNorm(ln, buf.n, c, x0, w0, b0);
    EXPECT_EQ(CountOutsideUlp(buf.out, want.out, 1e-5, 0.1), 0);
    EXPECT_LE(MaxRelativeError(buf.rstd, want.rstd), 1e-5);

    std::vector<double> x = x0;
    x.insert(x.end(), w0.begin(), w0.end());
    x.insert(x.end(), b0.begin(), b0.end());
    auto loss = [&](const std::vector<double>& p) {
      const Reference r =
          ReferenceNorm(ln, buf.n, c, std::vector<double>(p.begin(), p.begin() + nc),
                        std::vector<double>(p.begin() + nc, p.begin() + nc + c),
                        std::vector<double>(p.begin() + nc + c, p.end()));
      double l = 0;
      for (int64_t i = 0; i < nc; ++i) l += dy[i] * r.out[i];
      return l;
    };
    const std::vector<double> g = FiniteDifferenceGradient(x, loss);
    std::vector<double> want_dinp(g.begin(), g.begin() + nc);
    std::vector<double> want_dw(g.begin() + nc, g.begin() + nc + c);
    std::vector<double> want_db(g.begin() + nc + c, g.end());
    for (int64_t j = 0; j < c; ++j) {
      want_dw[j] += dweight0[j];
      want_db[j] += dbias0[j];
    }
    EXPECT_EQ(CountOutsideUlp(buf.dinp, want_dinp, 1e-4, 0.1), 0);
    EXPECT_EQ(CountOutsideUlp(buf.dweight, want_dw, 1e-5, 1e-3), 0);
    if (ln) {
      EXPECT_EQ(CountOutsideUlp(buf.dbias, want_db, 1e-5, 1e-3), 0);
    } else {
      EXPECT_EQ(buf.dbias.Doubles(), dbias0);
    }
  }
}

TEST_P(NormTest, SixteenBitBitwiseIndependentOfThreadCount) {
  const bool ln = GetParam();
  StoredNorm one(37, 150, 8, kMixed), three(37, 150, 8, kMixed);
  ASSERT_TRUE(one.Run(ln, 1).ok());
  ASSERT_TRUE(three.Run(ln, 3).ok());
  EXPECT_TRUE(SameWords(one.out, three.out));
  EXPECT_TRUE(SameWords(one.dinp, three.dinp));
  EXPECT_TRUE(SameWords(one.dweight, three.dweight));
  EXPECT_TRUE(SameWords(one.dbias, three.dbias));
}

INSTANTIATE_TEST_SUITE_P(LayerAndRms, NormTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "LayerNorm" : "RmsNorm";
                         });

void ExpectInvalid(const absl::Status& st, const std::string& needle) {
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find(needle), std::string::npos) << st;
}

TEST(NormErrorsTest, BadArgumentsAreNamed) {
  NormBuffers b(4, 8, 5);
  const LayerNormForwardArgs good{.inp = b.T(b.inp, 4, 8),
                                  .weight = b.V(b.weight),
                                  .bias = b.V(b.bias),
                                  .out = b.T(b.out, 4, 8),
                                  .mean = b.V(b.mean),
                                  .rstd = b.V(b.rstd)};
  ASSERT_TRUE(LayerNormForward(CpuContext(1), good).ok());
  LayerNormForwardArgs a = good;
  a.weight = Tensor(b.weight.data(), DType::kF32, {7});
  ExpectInvalid(LayerNormForward(CpuContext(1), a), "LayerNormForward: weight has shape f32[7]");
  a = good;
  a.rstd = Tensor(b.rstd.data(), DType::kBF16, {4});
  ExpectInvalid(LayerNormForward(CpuContext(1), a), "rstd has dtype bf16");
  a = good;
  a.inp = Tensor(b.inp.data(), DType::kF32, {2, 2, 8});
  ExpectInvalid(LayerNormForward(CpuContext(1), a), "inp has shape f32[2, 2, 8]");
  a = good;
  a.eps = 0;
  ExpectInvalid(LayerNormForward(CpuContext(1), a), "eps is 0");
  ExpectInvalid(RmsNormBackward(CpuContext(1), {.dout = b.T(b.dout, 4, 8),
                                                .inp = b.T(b.inp, 4, 8),
                                                .weight = b.V(b.weight),
                                                .rstd = b.V(b.rstd),
                                                .dinp = b.T(b.dinp, 8, 4),
                                                .dweight = b.V(b.dweight)}),
                "RmsNormBackward: dinp has shape f32[8, 4]");
  ExpectInvalid(LayerNormForward(DeviceContext{.num_threads = 0}, good), "num_threads is 0");
}

}  // namespace
}  // namespace zt
