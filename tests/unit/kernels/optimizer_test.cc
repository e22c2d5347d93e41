// kernels/optimizer: AdamW and SGD over several steps against float64 references of the
// update rules in optimizer.h, thread-count determinism, errors.
#include "kernels/optimizer.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using testing::MaxRelativeError;
using testing::RandomVector;
using testing::SameBits;
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
}

}  // namespace
}  // namespace zt
