// kernels/optimizer: AdamW and SGD over several steps against float64 references of the
// update rules in optimizer.h, thread-count determinism, errors.
#include "kernels/optimizer.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/kernels/mixed_check.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using testing::MaxRelativeError;
using testing::RandomVector;
using testing::RoundTo;
using testing::SameBits;
using testing::SameWords;
using testing::Stored;
using testing::ToDouble;

Tensor Flat(std::vector<float>& v) {
  return Tensor(v.data(), DType::kF32, {static_cast<int64_t>(v.size())});
}

constexpr int kSteps = 5;

TEST(AdamWTest, FiveStepsMatchFloat64) {
  const size_t n = 1000;
  std::vector<float> param = RandomVector(n, 1), m(n, 0.0f), v(n, 0.0f);
  std::vector<double> p64 = ToDouble(param), m64(n, 0.0), v64(n, 0.0);
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
  for (int step = 1; step <= kSteps; ++step) {
    std::vector<float> grad = RandomVector(n, 100 + step, -2.0f, 2.0f);
    const absl::Status st = AdamWUpdate(CpuContext(2), {.param = Flat(param),
                                                        .grad = Flat(grad),
                                                        .m = Flat(m),
                                                        .v = Flat(v),
                                                        .lr = lr,
                                                        .beta1 = b1,
                                                        .beta2 = b2,
                                                        .eps = eps,
                                                        .weight_decay = wd,
                                                        .step = step,
                                                        .grad_scale = gs});
    ASSERT_TRUE(st.ok()) << st;
    for (size_t i = 0; i < n; ++i) {
      const double g = static_cast<double>(grad[i]) * gs;
      m64[i] = b1 * m64[i] + (1.0 - b1) * g;
      v64[i] = b2 * v64[i] + (1.0 - b2) * g * g;
      const double mhat = m64[i] / (1.0 - std::pow(static_cast<double>(b1), step));
      const double vhat = v64[i] / (1.0 - std::pow(static_cast<double>(b2), step));
      p64[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * p64[i]);
    }
  }
  // Each step rounds a handful of f32 operations (~1e-7 relative each), and 1 − β in f32
  // differs from float64's by ~1e-8; five steps stay below 1e-5. The floor 1e-3 covers
  // moments near zero.
  EXPECT_LE(MaxRelativeError(param, p64), 1e-5);
  EXPECT_LE(MaxRelativeError(m, m64), 1e-5);
  EXPECT_LE(MaxRelativeError(v, v64), 1e-5);
}

TEST(SgdTest, FiveStepsWithAndWithoutMomentumMatchFloat64) {
  const size_t n = 1000;
  for (float mu : {0.0f, 0.9f}) {
    std::vector<float> param = RandomVector(n, 2), buf(n, 0.0f);
    std::vector<double> p64 = ToDouble(param), buf64(n, 0.0);
    const float lr = 0.05f, wd = 0.01f, gs = 2.0f;
    for (int step = 1; step <= kSteps; ++step) {
      std::vector<float> grad = RandomVector(n, 200 + step);
      const absl::Status st = SgdUpdate(CpuContext(2), {.param = Flat(param),
                                                        .grad = Flat(grad),
                                                        .momentum = mu == 0 ? Tensor() : Flat(buf),
                                                        .lr = lr,
                                                        .momentum_factor = mu,
                                                        .weight_decay = wd,
                                                        .grad_scale = gs});
      ASSERT_TRUE(st.ok()) << st;
      for (size_t i = 0; i < n; ++i) {
        buf64[i] = mu * buf64[i] + static_cast<double>(grad[i]) * gs;
        p64[i] -= lr * (buf64[i] + wd * p64[i]);
      }
    }
    // A few f32 roundings per step on O(1) values; five steps.
    EXPECT_LE(MaxRelativeError(param, p64), 1e-5) << "momentum " << mu;
    if (mu != 0) EXPECT_LE(MaxRelativeError(buf, buf64), 1e-5);
  }
}

TEST(AdamWTest, BitwiseIndependentOfThreadCount) {
  const size_t n = 100003;  // above the parallel threshold, odd length
  std::vector<float> grad = RandomVector(n, 3);
  std::vector<std::vector<float>> p(2, RandomVector(n, 4)), m(2, RandomVector(n, 5)),
      v(2, RandomVector(n, 6, 0.0f, 1.0f));
  const int threads[2] = {1, 3};
  for (int k = 0; k < 2; ++k) {
    ASSERT_TRUE(AdamWUpdate(CpuContext(threads[k]), {.param = Flat(p[k]),
                                                     .grad = Flat(grad),
                                                     .m = Flat(m[k]),
                                                     .v = Flat(v[k]),
                                                     .lr = 1e-3f,
                                                     .weight_decay = 0.1f,
                                                     .step = 7})
                    .ok());
  }
  EXPECT_TRUE(SameBits(p[0], p[1]));
  EXPECT_TRUE(SameBits(m[0], m[1]));
  EXPECT_TRUE(SameBits(v[0], v[1]));
}

// A bf16 or f16 gradient is loaded to f32 and used as the f32 path uses it: against a float64
// reference fed the same 16-bit gradient, the f32 path's tolerance holds. The 16-bit parameter
// copy is the updated f32 parameter rounded once, so it equals FloatToBf16/FloatToHalf of it
// bit for bit.
TEST(AdamWTest, SixteenBitGradAndParamCopy) {
  const size_t n = 40000;  // above the parallel threshold
  for (DType gt : {DType::kBF16, DType::kF16}) {
    for (DType ct : {DType::kBF16, DType::kF16}) {
      std::vector<float> param = RandomVector(n, 21), m(n, 0.0f), v(n, 0.0f);
      std::vector<double> p64 = ToDouble(param), m64(n, 0.0), v64(n, 0.0);
      Stored copy(n, ct);
      const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
      for (int step = 1; step <= kSteps; ++step) {
        Stored grad(RandomVector(n, 200 + step, -2.0f, 2.0f), gt);
        const absl::Status st = AdamWUpdate(CpuContext(2), {.param = Flat(param),
                                                            .grad = grad.Flat(),
                                                            .m = Flat(m),
                                                            .v = Flat(v),
                                                            .lr = lr,
                                                            .beta1 = b1,
                                                            .beta2 = b2,
                                                            .eps = eps,
                                                            .weight_decay = wd,
                                                            .step = step,
                                                            .grad_scale = gs,
                                                            .param_copy = copy.Flat()});
        ASSERT_TRUE(st.ok()) << st;
        for (size_t i = 0; i < n; ++i) {
          const double g = static_cast<double>(grad.Get(i)) * gs;
          m64[i] = b1 * m64[i] + (1.0 - b1) * g;
          v64[i] = b2 * v64[i] + (1.0 - b2) * g * g;
          const double mhat = m64[i] / (1.0 - std::pow(static_cast<double>(b1), step));
          const double vhat = v64[i] / (1.0 - std::pow(static_cast<double>(b2), step));
          p64[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * p64[i]);
        }
      }
      // As in FiveStepsMatchFloat64: the f32 update's rounding over five steps.
      EXPECT_LE(MaxRelativeError(param, p64), 1e-5) << DTypeName(gt) << " " << DTypeName(ct);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(FloatBits(copy.Get(i)), FloatBits(RoundTo(ct, param[i]))) << i;
      }
    }
  }
}

TEST(SgdTest, SixteenBitGradAndParamCopy) {
  const size_t n = 40000;
  for (bool with_momentum : {false, true}) {
    std::vector<float> param = RandomVector(n, 31), buf(n, 0.0f);
    Stored grad(RandomVector(n, 32), DType::kF16), copy(n, DType::kBF16);
    std::vector<double> p64 = ToDouble(param);
    const float lr = 0.1f, wd = 0.01f, gs = 2.0f;
    SgdArgs args{.param = Flat(param),
                 .grad = grad.Flat(),
                 .lr = lr,
                 .weight_decay = wd,
                 .grad_scale = gs,
                 .param_copy = copy.Flat()};
    if (with_momentum) {
      args.momentum = Flat(buf);
      args.momentum_factor = 0.9f;
    }
    ASSERT_TRUE(SgdUpdate(CpuContext(2), args).ok());
    // From a zero buffer the first step's buf is g either way.
    for (size_t i = 0; i < n; ++i) {
      p64[i] -= lr * (static_cast<double>(grad.Get(i)) * gs + wd * p64[i]);
    }
    // A few f32 roundings (2^-24 each) of O(1) terms: an absolute error, measured as such by
    // the floor of 1 where the update cancels the parameter.
    EXPECT_LE(MaxRelativeError(param, p64, 1.0), 1e-6);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(copy.Get(i), RoundTo(DType::kBF16, param[i])) << i;
  }
}

// With lr 0 the parameter stays x, so the copy is k stochastic roundings of x: their mean is x
// within 5 standard errors (gap·√(p(1 − p)/k), p the discarded fraction), deterministic for a
// seed and for any thread count, and another seed gives other draws.
TEST(AdamWTest, StochasticParamCopyIsUnbiasedAndDeterministic) {
  const size_t k = 1 << 16;
  const float x = 0.3337f;
  auto run = [&](int threads, uint64_t seed) {
    std::vector<float> param(k, x), grad = RandomVector(k, 41), m(k), v(k);
    Stored copy(k, DType::kBF16);
    EXPECT_TRUE(AdamWUpdate(CpuContext(threads), {.param = Flat(param),
                                                  .grad = Flat(grad),
                                                  .m = Flat(m),
                                                  .v = Flat(v),
                                                  .lr = 0.0f,
                                                  .param_copy = copy.Flat(),
                                                  .stochastic_rounding = true,
                                                  .seed = seed})
                    .ok());
    return copy;
  };
  const Stored one = run(1, 9), three = run(3, 9), other = run(2, 10);
  EXPECT_TRUE(SameWords(one, three));
  EXPECT_FALSE(SameWords(one, other));
  const float down = Bf16ToFloat(static_cast<uint16_t>(FloatBits(x) >> 16));
  const float up = Bf16ToFloat(static_cast<uint16_t>((FloatBits(x) >> 16) + 1));
  double sum = 0;
  for (float r : one.Values()) {
    ASSERT_TRUE(r == down || r == up) << r;
    sum += r;
  }
  const double gap = static_cast<double>(up) - down;
  const double p = (x - static_cast<double>(down)) / gap;
  EXPECT_NEAR(sum / k, x, 5 * gap * std::sqrt(p * (1 - p) / k));
}

TEST(AdamWTest, SixteenBitModesIndependentOfThreadCount) {
  const size_t n = 100003;
  Stored grad(RandomVector(n, 51), DType::kBF16);
  std::vector<std::vector<float>> p(2, RandomVector(n, 52)), m(2, RandomVector(n, 53)),
      v(2, RandomVector(n, 54, 0.0f, 1.0f));
  std::vector<Stored> copy(2, Stored(n, DType::kF16));
  const int threads[2] = {1, 3};
  for (int k = 0; k < 2; ++k) {
    ASSERT_TRUE(AdamWUpdate(CpuContext(threads[k]), {.param = Flat(p[k]),
                                                     .grad = grad.Flat(),
                                                     .m = Flat(m[k]),
                                                     .v = Flat(v[k]),
                                                     .lr = 1e-3f,
                                                     .weight_decay = 0.1f,
                                                     .step = 7,
                                                     .param_copy = copy[k].Flat()})
                    .ok());
  }
  EXPECT_TRUE(SameBits(p[0], p[1]));
  EXPECT_TRUE(SameWords(copy[0], copy[1]));
}

void ExpectInvalid(const absl::Status& st, const std::string& needle) {
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find(needle), std::string::npos) << st;
}

TEST(OptimizerErrorsTest, BadArgumentsAreNamed) {
  std::vector<float> p(10), g(10), m(9), v(10);
  const DeviceContext ctx = CpuContext(1);
  const AdamWArgs good{.param = Flat(p), .grad = Flat(g), .m = Flat(v), .v = Flat(v)};
  ASSERT_TRUE(AdamWUpdate(ctx, good).ok());
  AdamWArgs a = good;
  a.m = Flat(m);
  ExpectInvalid(AdamWUpdate(ctx, a), "AdamWUpdate: m f32[9] has 9 elements, param f32[10]");
  a = good;
  a.step = 0;
  ExpectInvalid(AdamWUpdate(ctx, a), "step is 0, must be at least 1");
  a = good;
  a.beta2 = 1.0f;
  ExpectInvalid(AdamWUpdate(ctx, a), "beta2 is 1, must be in [0, 1)");
  ExpectInvalid(SgdUpdate(ctx, {.param = Flat(p), .grad = Flat(g), .momentum_factor = 0.9f}),
                "SgdUpdate: momentum is empty but momentum_factor is 0.9");
  ExpectInvalid(SgdUpdate(ctx, {.param = Flat(p), .grad = Flat(m)}), "SgdUpdate: grad f32[9]");
  std::vector<uint16_t> h(10);
  a = good;
  a.param_copy = Tensor(h.data(), DType::kF16, {10});
  a.stochastic_rounding = true;
  ExpectInvalid(AdamWUpdate(ctx, a), "stochastic_rounding needs a bf16 param_copy, it is f16");
  a = good;
  a.param_copy = Flat(v);
  ExpectInvalid(AdamWUpdate(ctx, a), "param_copy has dtype f32, expected bf16 or f16");
  a = good;
  a.stochastic_rounding = true;
  ExpectInvalid(AdamWUpdate(ctx, a), "stochastic_rounding is set but param_copy is empty");
}

}  // namespace
}  // namespace zt
