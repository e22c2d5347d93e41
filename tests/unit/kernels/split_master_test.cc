// Split fp32 master weights (kernels/dtype.h SplitMaster, the i16 `param` of the optimizers):
// the split is lossless and its high half is the nearest bf16; every optimizer updating a
// split master produces, bit for bit, the f32 master the same optimizer produces from an f32
// master, and a high half that is that master rounded to nearest; misuse is named.
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/adafactor.h"
#include "kernels/adam8bit.h"
#include "kernels/dtype.h"
#include "kernels/elementwise.h"
#include "kernels/optimizer.h"
#include "tests/unit/kernels/mixed_check.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using testing::RandomVector;

// Checks that (high, low) is a lossless split of m whose high half is a nearest bf16.
void ExpectSplitOf(float m, SplitMasterBits b) {
  const uint32_t u = FloatBits(m);
  ASSERT_EQ(FloatBits(JoinMaster(b.high, b.low)), u) << std::hex << u;
  if (std::isinf(m)) {
    ASSERT_EQ(b.low, 0);
    return;
  }
  const double err = std::fabs(static_cast<double>(Bf16ToFloat(b.high)) - m);
  // The bf16 neighbours of m bracket it; the high half is the nearer (either one on a tie,
  // which FloatToBf16 breaks to even and the split away from zero).
  const float nearest_even = Bf16ToFloat(FloatToBf16(m));
  const double best = std::fabs(static_cast<double>(nearest_even) - m);
  if (std::isinf(nearest_even)) {
    ASSERT_TRUE(std::isinf(Bf16ToFloat(b.high))) << std::hex << u;
  } else {
    ASSERT_EQ(err, best) << std::hex << u;
  }
  if ((u & 0xffffu) != 0x8000u) ASSERT_EQ(b.high, FloatToBf16(m)) << std::hex << u;
}

TEST(SplitMasterTest, EveryHighHalfWithEdgeLowHalvesRoundTrips) {
  // Every sign, exponent and bf16 mantissa, with the low halves where rounding turns: 0, just
  // below and at the tie, just above it, and the largest.
  for (uint32_t high = 0; high <= 0xffffu; ++high) {
    for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      const float m = BitsToFloat((high << 16) | low);
      if (std::isnan(m)) continue;
      ExpectSplitOf(m, SplitMaster(m));
    }
  }
}

TEST(SplitMasterTest, RandomBitPatternsRoundTrip) {
  std::mt19937 rng(3);
  for (int k = 0; k < 2'000'000; ++k) {
    const float m = BitsToFloat(static_cast<uint32_t>(rng()));
    if (std::isnan(m)) continue;
    ExpectSplitOf(m, SplitMaster(m));
  }
}

TEST(SplitMasterTest, TiesGoAwayFromZeroAndInfinitiesAndNansSurvive) {
  // 1 + 2^-8 lies halfway between the bf16 values 1 and 1 + 2^-7.
  const float tie = 1.0f + std::ldexp(1.0f, -8);
  EXPECT_EQ(Bf16ToFloat(SplitMaster(tie).high), 1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(Bf16ToFloat(SplitMaster(-tie).high), -(1.0f + std::ldexp(1.0f, -7)));
  EXPECT_EQ(SplitMaster(tie).low, std::numeric_limits<int16_t>::min());
  // The largest float rounds to +inf in bf16, as FloatToBf16 rounds it; the low half still
  // restores it exactly.
  const float big = std::numeric_limits<float>::max();
  EXPECT_TRUE(std::isinf(Bf16ToFloat(SplitMaster(big).high)));
  EXPECT_EQ(JoinMaster(SplitMaster(big).high, SplitMaster(big).low), big);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(JoinMaster(SplitMaster(-inf).high, SplitMaster(-inf).low), -inf);
  for (float nan :
       {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
        BitsToFloat(0x7f800001u), BitsToFloat(0xffc0ffffu)}) {
    const SplitMasterBits b = SplitMaster(nan);
    EXPECT_TRUE(std::isnan(Bf16ToFloat(b.high)));
    EXPECT_TRUE(std::isnan(JoinMaster(b.high, b.low)));
  }
  EXPECT_EQ(FloatBits(JoinMaster(SplitMaster(-0.0f).high, SplitMaster(-0.0f).low)),
            FloatBits(-0.0f));
}

// An f32 master with a bf16 copy rounded to nearest, and the same master split.
struct Masters {
  std::vector<float> f32;
  std::vector<uint16_t> copy;  // bf16 of f32
  std::vector<uint16_t> high;  // the split
  std::vector<int16_t> low;

  explicit Masters(const std::vector<float>& init)
      : f32(init), copy(init.size()), high(init.size()), low(init.size()) {
    for (size_t i = 0; i < init.size(); ++i) {
      copy[i] = FloatToBf16(init[i]);
      const SplitMasterBits b = SplitMaster(init[i]);
      high[i] = b.high;
      low[i] = b.low;
    }
  }
  int64_t n() const { return static_cast<int64_t>(f32.size()); }
  Tensor F32() { return Tensor(f32.data(), DType::kF32, {n()}); }
  Tensor Copy() { return Tensor(copy.data(), DType::kBF16, {n()}); }
  Tensor High() { return Tensor(high.data(), DType::kBF16, {n()}); }
  Tensor Low() { return Tensor(low.data(), DType::kI16, {n()}); }

  // The split master is the f32 master bit for bit; its high half is the f32 master's
  // nearest bf16, the bf16 copy's bits except on exact ties.
  void ExpectSame(const std::string& what) const {
    for (size_t i = 0; i < f32.size(); ++i) {
      ASSERT_EQ(FloatBits(JoinMaster(high[i], low[i])), FloatBits(f32[i])) << what << " " << i;
      if ((FloatBits(f32[i]) & 0xffffu) != 0x8000u) ASSERT_EQ(high[i], copy[i]) << what << " " << i;
    }
  }
};

// Runs `step(param, copy, t)` for t = 1..steps on an f32 master and on its split, comparing
// after each step. n is above the kernels' parallel threshold, with a partial last block.
void ExpectSplitMatches(const std::string& what,
                        const std::function<void(Tensor, Tensor, int)>& step, int64_t n = 40'000) {
  Masters masters(RandomVector(n, 11));
  for (int t = 1; t <= 4; ++t) {
    step(masters.F32(), masters.Copy(), t);
    step(masters.Low(), masters.High(), t);
    masters.ExpectSame(what + " step " + std::to_string(t));
  }
}

std::vector<uint16_t> Bf16Grad(int64_t n, int t) {
  std::vector<uint16_t> g(n);
  const std::vector<float> f = RandomVector(n, 300 + t, -2.0f, 2.0f);
  for (int64_t i = 0; i < n; ++i) g[i] = FloatToBf16(f[i]);
  return g;
}

TEST(SplitMasterTest, AdamWAndSgdUpdateTheSameMaster) {
  const int64_t n = 40'000;
  // Each master keeps its own state buffers, updated by the same rule.
  std::vector<float> m[2], v[2], buf[2];
  for (int k = 0; k < 2; ++k) m[k] = v[k] = buf[k] = std::vector<float>(n, 0.0f);
  int which = 0;  // alternates: f32 master, then split
  ExpectSplitMatches("AdamW", [&](Tensor param, Tensor copy, int t) {
    std::vector<uint16_t> g = Bf16Grad(n, t);
    const int k = which++ % 2;
    const absl::Status st = AdamWUpdate(CpuContext(3), {.param = param,
                                                        .grad = Tensor(g.data(), DType::kBF16, {n}),
                                                        .m = Tensor(m[k].data(), DType::kF32, {n}),
                                                        .v = Tensor(v[k].data(), DType::kF32, {n}),
                                                        .lr = 1e-2f,
                                                        .beta2 = 0.95f,
                                                        .weight_decay = 0.1f,
                                                        .step = t,
                                                        .grad_scale = 0.5f,
                                                        .param_copy = copy});
    ASSERT_TRUE(st.ok()) << st;
  });
  for (bool momentum : {false, true}) {
    ExpectSplitMatches(momentum ? "SGD momentum" : "SGD", [&](Tensor param, Tensor copy, int t) {
      std::vector<float> g = RandomVector(n, 400 + t, -2.0f, 2.0f);
      const int k = which++ % 2;
      const absl::Status st = SgdUpdate(
          CpuContext(2), {.param = param,
                          .grad = Tensor(g.data(), DType::kF32, {n}),
                          .momentum = momentum ? Tensor(buf[k].data(), DType::kF32, {n}) : Tensor(),
                          .lr = 1e-2f,
                          .momentum_factor = momentum ? 0.9f : 0.0f,
                          .weight_decay = 0.1f,
                          .param_copy = copy});
      ASSERT_TRUE(st.ok()) << st;
    });
  }
}

TEST(SplitMasterTest, EightBitAdamWUpdatesTheSameMaster) {
  const int64_t n = 40'000, block = 2048;
  const int64_t blocks = (n + block - 1) / block;
  std::vector<uint8_t> mc[2], vc[2];
  std::vector<float> ma[2], va[2];
  for (int k = 0; k < 2; ++k) {
    mc[k] = vc[k] = std::vector<uint8_t>(n, 0);
    ma[k] = va[k] = std::vector<float>(blocks, 0.0f);
  }
  int which = 0;
  ExpectSplitMatches("AdamW8bit", [&](Tensor param, Tensor copy, int t) {
    std::vector<uint16_t> g = Bf16Grad(n, t);
    const int k = which++ % 2;
    const absl::Status st =
        AdamW8bitUpdate(CpuContext(3), {.param = param,
                                        .grad = Tensor(g.data(), DType::kBF16, {n}),
                                        .m_codes = Tensor(mc[k].data(), DType::kU8, {n}),
                                        .m_absmax = Tensor(ma[k].data(), DType::kF32, {blocks}),
                                        .v_codes = Tensor(vc[k].data(), DType::kU8, {n}),
                                        .v_absmax = Tensor(va[k].data(), DType::kF32, {blocks}),
                                        .block = block,
                                        .lr = 1e-2f,
                                        .weight_decay = 0.1f,
                                        .step = t,
                                        .param_copy = copy});
    ASSERT_TRUE(st.ok()) << st;
  });
}

TEST(SplitMasterTest, AdafactorUpdatesTheSameMaster) {
  // A matrix (factored) and a vector (full second moment), with Σ param² for the relative
  // step read through the split, and a first moment.
  for (int64_t rows : {int64_t{200}, int64_t{0}}) {
    const int64_t cols = rows > 0 ? 201 : 40'000, n = rows > 0 ? rows * cols : cols;
    std::vector<float> row[2], col[2], full[2], m[2];
    for (int k = 0; k < 2; ++k) {
      row[k] = std::vector<float>(rows, 0.0f);
      col[k] = std::vector<float>(rows > 0 ? cols : 0, 0.0f);
      full[k] = std::vector<float>(rows > 0 ? 0 : n, 0.0f);
      m[k] = std::vector<float>(n, 0.0f);
    }
    int which = 0;
    ExpectSplitMatches(
        rows > 0 ? "Adafactor matrix" : "Adafactor vector",
        [&](Tensor param, Tensor copy, int t) {
          std::vector<uint16_t> g = Bf16Grad(n, t);
          const int k = which++ % 2;
          const auto f32 = [](std::vector<float>& x) {
            return x.empty() ? Tensor()
                             : Tensor(x.data(), DType::kF32, {static_cast<int64_t>(x.size())});
          };
          AdafactorArgs a{.param = param,
                          .grad = Tensor(g.data(), DType::kBF16, {n}),
                          .row_state = f32(row[k]),
                          .col_state = f32(col[k]),
                          .full_state = f32(full[k]),
                          .m = f32(m[k]),
                          .beta1 = 0.9f,
                          .weight_decay = 0.1f,
                          .step = t,
                          .param_copy = copy};
          if (rows > 0) {
            a.param = a.param.Reshape({rows, cols});
            a.grad = a.grad.Reshape({rows, cols});
          }
          const absl::Status st = AdafactorUpdate(CpuContext(3), a);
          ASSERT_TRUE(st.ok()) << st;
        },
        n);
  }
}

// The ops over buffers: SplitMaster and JoinMaster element by element, the high halves alone
// when low is empty, for any thread count.
TEST(SplitMasterTest, SplitAndJoinOpsRoundTrip) {
  const int64_t n = 70'000;  // above the parallel threshold
  std::vector<float> src = RandomVector(n, 5, -3.0f, 3.0f), back(n);
  src[0] = 1.0f + std::ldexp(1.0f, -8);  // a tie
  std::vector<uint16_t> high(n), high_only(n);
  std::vector<int16_t> low(n);
  const auto t = [n](auto& v, DType d) { return Tensor(v.data(), d, {n}); };
  ASSERT_TRUE(SplitMasterWeights(CpuContext(3), t(src, DType::kF32), t(high, DType::kBF16),
                                 t(low, DType::kI16))
                  .ok());
  ASSERT_TRUE(
      SplitMasterWeights(CpuContext(1), t(src, DType::kF32), t(high_only, DType::kBF16), Tensor())
          .ok());
  ASSERT_TRUE(JoinMasterWeights(CpuContext(3), t(high, DType::kBF16), t(low, DType::kI16),
                                t(back, DType::kF32))
                  .ok());
  for (int64_t i = 0; i < n; ++i) {
    const SplitMasterBits b = SplitMaster(src[i]);
    ASSERT_EQ(high[i], b.high) << i;
    ASSERT_EQ(low[i], b.low) << i;
    ASSERT_EQ(high_only[i], b.high) << i;
    ASSERT_EQ(FloatBits(back[i]), FloatBits(src[i])) << i;
  }
}

void ExpectInvalid(const absl::Status& st, const std::string& needle) {
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find(needle), std::string::npos) << st;
}

TEST(SplitMasterTest, MisuseIsNamed) {
  const int64_t n = 8;
  std::vector<int16_t> low(n);
  std::vector<uint16_t> h(n);
  std::vector<float> g(n), m(n), v(n), p(n);
  const Tensor low_t(low.data(), DType::kI16, {n});
  AdamWArgs a{.param = low_t,
              .grad = Tensor(g.data(), DType::kF32, {n}),
              .m = Tensor(m.data(), DType::kF32, {n}),
              .v = Tensor(v.data(), DType::kF32, {n})};
  ExpectInvalid(AdamWUpdate(CpuContext(1), a),
                "AdamWUpdate: param is i16 (the low halves of a split master) but "
                "param_copy is empty");
  a.param_copy = Tensor(h.data(), DType::kF16, {n});
  ExpectInvalid(AdamWUpdate(CpuContext(1), a), "param_copy is f16");
  a.param_copy = Tensor(h.data(), DType::kBF16, {n});
  a.stochastic_rounding = true;
  ExpectInvalid(AdamWUpdate(CpuContext(1), a), "stochastic_rounding with a split master");
  a.stochastic_rounding = false;
  ASSERT_TRUE(AdamWUpdate(CpuContext(1), a).ok());
  a.param = Tensor(h.data(), DType::kBF16, {n});
  ExpectInvalid(AdamWUpdate(CpuContext(1), a),
                "AdamWUpdate: param has dtype bf16, expected f32 (or i16: a split master)");
  const Tensor f32(p.data(), DType::kF32, {n}), bf16(h.data(), DType::kBF16, {n});
  ExpectInvalid(SplitMasterWeights(CpuContext(1), f32, bf16, f32), "SplitMasterWeights: low");
  ExpectInvalid(SplitMasterWeights(CpuContext(1), f32, low_t, Tensor()),
                "SplitMasterWeights: high");
  ExpectInvalid(
      JoinMasterWeights(CpuContext(1), bf16, low_t, Tensor(p.data(), DType::kF32, {n - 1})),
      "JoinMasterWeights: dst");
}

}  // namespace
}  // namespace zt
