// kernels/adafactor: Adafactor over several steps against a float64 reference of the rule in
// adafactor.h (a matrix with factored statistics and a vector with a full one; with and
// without a first moment; absolute, parameter-scaled, relative and warm-up step sizes; update
// clipping active and inactive), thread-count determinism, errors.
#include "kernels/adafactor.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/kernels/mixed_check.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using testing::MaxErrorOverLargest;
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

// A tensor's optimizer buffers, f32 for the kernel. rows == 0 means a vector of `cols`.
struct Buffers {
  Buffers(int64_t rows_, int64_t cols_, bool first_moment, uint32_t seed)
      : rows(rows_),
        cols(cols_),
        param(RandomVector(numel(), seed)),
        row(rows, 0.0f),
        col(rows > 0 ? cols : 0, 0.0f),
        full(rows > 0 ? 0 : cols, 0.0f),
        m(first_moment ? numel() : 0, 0.0f) {}
  int64_t numel() const { return rows > 0 ? rows * cols : cols; }
  Tensor Param(std::vector<float>& v) const {
    return rows > 0 ? Tensor(v.data(), DType::kF32, {rows, cols}) : Flat(v);
  }
  int64_t rows, cols;
  std::vector<float> param, row, col, full, m;
};

Tensor FlatOrEmpty(std::vector<float>& v) { return v.empty() ? Tensor() : Flat(v); }

// One step with `args`' hyperparameters and 16-bit options on b's buffers and `grad`, or on a
// 16-bit gradient when `grad16` is given.
absl::Status Step(const DeviceContext& ctx, Buffers& b, std::vector<float>& grad,
                  AdafactorArgs args, Stored* grad16 = nullptr) {
  args.param = b.Param(b.param);
  args.grad = grad16 == nullptr ? b.Param(grad)
              : b.rows > 0      ? grad16->View({b.rows, b.cols})
                                : grad16->Flat();
  args.row_state = FlatOrEmpty(b.row);
  args.col_state = FlatOrEmpty(b.col);
  args.full_state = FlatOrEmpty(b.full);
  args.m = FlatOrEmpty(b.m);
  return AdafactorUpdate(ctx, args);
}

// The same buffers in float64, stepped by the rule of adafactor.h.
struct Reference {
  explicit Reference(const Buffers& b)
      : rows(b.rows),
        cols(b.cols),
        param(ToDouble(b.param)),
        row(ToDouble(b.row)),
        col(ToDouble(b.col)),
        full(ToDouble(b.full)),
        m(ToDouble(b.m)) {}

  // Returns max(1, RMS(U) / clip_threshold), the clipping divisor.
  double Step(const std::vector<float>& grad, const AdafactorArgs& a) {
    const int64_t n = static_cast<int64_t>(param.size());
    const double t = static_cast<double>(a.step);
    const double rho = a.relative_step ? std::min(a.warmup_init ? 1e-6 * t : 1e-2, 1 / std::sqrt(t))
                                       : double{a.lr};
    double alpha = rho;
    if (a.scale_parameter) {
      double sq = 0;
      for (double p : param) sq += p * p;
      alpha = std::max(double{a.eps2}, std::sqrt(sq / n)) * rho;
    }
    const double b2t = 1.0 - std::pow(t, double{a.decay_rate});
    const double eps1 = a.eps1;
    std::vector<double> g(n), u(n);
    for (int64_t i = 0; i < n; ++i) g[i] = double{grad[i]} * a.grad_scale;
    if (rows > 0) {
      for (int64_t i = 0; i < rows; ++i) {
        double s = 0;
        for (int64_t j = 0; j < cols; ++j) s += g[i * cols + j] * g[i * cols + j] + eps1;
        row[i] = b2t * row[i] + (1 - b2t) * s / cols;
      }
      for (int64_t j = 0; j < cols; ++j) {
        double s = 0;
        for (int64_t i = 0; i < rows; ++i) s += g[i * cols + j] * g[i * cols + j] + eps1;
        col[j] = b2t * col[j] + (1 - b2t) * s / rows;
      }
      double row_mean = 0;
      for (double r : row) row_mean += r / rows;
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) {
          u[i * cols + j] = g[i * cols + j] / std::sqrt(row[i] * col[j] / row_mean);
        }
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        full[i] = b2t * full[i] + (1 - b2t) * (g[i] * g[i] + eps1);
        u[i] = g[i] / std::sqrt(full[i]);
      }
    }
    double u_sq = 0;
    for (double x : u) u_sq += x * x;
    const double clip = std::max(1.0, std::sqrt(u_sq / n) / a.clip_threshold);
    for (int64_t i = 0; i < n; ++i) {
      double step = alpha * u[i] / clip;
      if (!m.empty()) {
        m[i] = a.beta1 * m[i] + (1 - a.beta1) * step;
        step = m[i];
      }
      param[i] = param[i] - a.weight_decay * alpha * param[i] - step;
    }
    return clip;
  }

  int64_t rows, cols;
  std::vector<double> param, row, col, full, m;
};

enum class StepSize { kAbsolute, kAbsoluteScaled, kRelative, kRelativeWarmup };

AdafactorArgs Hyperparameters(StepSize size, bool first_moment, float clip_threshold) {
  AdafactorArgs a;
  a.lr = size == StepSize::kAbsolute || size == StepSize::kAbsoluteScaled ? 0.05f : 0.0f;
  a.relative_step = size == StepSize::kRelative || size == StepSize::kRelativeWarmup;
  a.warmup_init = size == StepSize::kRelativeWarmup;
  a.scale_parameter = size != StepSize::kAbsolute;
  a.beta1 = first_moment ? 0.9f : 0.0f;
  a.clip_threshold = clip_threshold;
  a.weight_decay = 0.1f;
  a.grad_scale = 0.5f;
  return a;
}

constexpr int kSteps = 6;

// 37 × 300: two column tiles, and fixed-order chunks of 4,096 elements that cut rows. The
// matrix's gradients have a zero row and a zero column, which eps1 keeps finite.
TEST(AdafactorTest, SeveralStepsMatchFloat64) {
  for (int64_t rows : {int64_t{37}, int64_t{0}}) {
    const int64_t cols = rows > 0 ? 300 : 9001;
    for (bool first_moment : {false, true}) {
      for (StepSize size : {StepSize::kAbsolute, StepSize::kAbsoluteScaled, StepSize::kRelative,
                            StepSize::kRelativeWarmup}) {
        for (float clip_threshold : {0.8f, 100.0f}) {
          SCOPED_TRACE(::testing::Message()
                       << "rows " << rows << " first_moment " << first_moment << " step size "
                       << static_cast<int>(size) << " clip " << clip_threshold);
          Buffers b(rows, cols, first_moment, 1);
          Reference ref(b);
          AdafactorArgs args = Hyperparameters(size, first_moment, clip_threshold);
          double most_clipped = 1.0;
          for (int step = 1; step <= kSteps; ++step) {
            std::vector<float> grad = RandomVector(b.numel(), 100 + step, -2.0f, 2.0f);
            if (rows > 0) {
              for (int64_t j = 0; j < cols; ++j) grad[3 * cols + j] = 0.0f;
              for (int64_t i = 0; i < rows; ++i) grad[i * cols + 5] = 0.0f;
            }
            args.step = step;
            const absl::Status st = Step(CpuContext(2), b, grad, args);
            ASSERT_TRUE(st.ok()) << st;
            most_clipped = std::max(most_clipped, ref.Step(grad, args));
          }
          // Fresh gradients give RMS(U) ≈ 1 (exactly 1 at step 1 for the vector): a threshold
          // of 0.8 clips, one of 100 never does.
          if (clip_threshold < 1.0f) {
            EXPECT_GT(most_clipped, 1.1);
          } else {
            EXPECT_EQ(most_clipped, 1.0);
          }
          // Each step rounds a handful of f32 operations per element (~1e-7 relative each),
          // reductions are float64: the error is that of the steps, |step| ≤ α·max|U| ≈ 0.1
          // (α ≤ 0.05, |U| ≤ 1/√(1 − β2t) ≈ 2 by step 6), so relative to |param| + 0.1.
          // Measured ≤ 4e-7 over six steps.
          EXPECT_LE(MaxRelativeError(b.param, ref.param, 0.1), 3e-6);
          // States: the same few roundings (measured ≤ 2.2e-7), relative to values that never
          // approach zero (a zero row's statistic is eps1-sized but exact to f32 precision),
          // so a tiny floor.
          EXPECT_LE(MaxRelativeError(b.row, ref.row, 1e-37), 1e-6);
          EXPECT_LE(MaxRelativeError(b.col, ref.col, 1e-37), 1e-6);
          EXPECT_LE(MaxRelativeError(b.full, ref.full, 1e-37), 1e-6);
          // m sums steps of either sign: a few f32 roundings of terms no larger than max |m|
          // (measured ~1.4e-7 of it).
          EXPECT_LE(MaxErrorOverLargest(b.m, ref.m), 1e-6);
        }
      }
    }
  }
}

TEST(AdafactorTest, SameBitsForAnyThreadCount) {
  for (int64_t rows : {int64_t{300}, int64_t{0}}) {
    const int64_t cols = rows > 0 ? 517 : 100003;
    Buffers b1(rows, cols, /*first_moment=*/true, 5), b3 = b1;
    AdafactorArgs args = Hyperparameters(StepSize::kRelative, /*first_moment=*/true, 1.0f);
    for (int step = 1; step <= 3; ++step) {
      std::vector<float> grad = RandomVector(b1.numel(), 400 + step);
      args.step = step;
      ASSERT_TRUE(Step(CpuContext(1), b1, grad, args).ok());
      ASSERT_TRUE(Step(CpuContext(3), b3, grad, args).ok());
    }
    EXPECT_TRUE(SameBits(b1.param, b3.param)) << rows;
    EXPECT_TRUE(SameBits(b1.row, b3.row)) << rows;
    EXPECT_TRUE(SameBits(b1.col, b3.col)) << rows;
    EXPECT_TRUE(SameBits(b1.full, b3.full)) << rows;
    EXPECT_TRUE(SameBits(b1.m, b3.m)) << rows;
  }
}

// A bf16 or f16 gradient is loaded to f32 and used as the f32 path uses it: against the
// float64 reference fed the stored gradient the f32 path's tolerances hold, and the result is
// bit for bit the f32 path's on an f32 gradient holding the same values. The 16-bit copy is
// the updated f32 parameter rounded once.
TEST(AdafactorTest, SixteenBitGradAndParamCopy) {
  for (int64_t rows : {int64_t{37}, int64_t{0}}) {
    const int64_t cols = rows > 0 ? 300 : 9001;
    for (DType gt : {DType::kBF16, DType::kF16}) {
      for (DType ct : {DType::kBF16, DType::kF16}) {
        SCOPED_TRACE(::testing::Message()
                     << "rows " << rows << " grad " << DTypeName(gt) << " copy " << DTypeName(ct));
        Buffers b(rows, cols, /*first_moment=*/true, 11), b32 = b;
        Reference ref(b);
        Stored copy(b.numel(), ct);
        AdafactorArgs args = Hyperparameters(StepSize::kAbsoluteScaled, true, 0.8f);
        for (int step = 1; step <= kSteps; ++step) {
          Stored grad(RandomVector(b.numel(), 500 + step, -2.0f, 2.0f), gt);
          std::vector<float> g32 = grad.Values();
          args.step = step;
          args.param_copy = copy.Flat();
          ASSERT_TRUE(Step(CpuContext(2), b, g32, args, &grad).ok());
          args.param_copy = Tensor();
          ASSERT_TRUE(Step(CpuContext(2), b32, g32, args).ok());
          ref.Step(g32, args);
        }
        // The tolerances of SeveralStepsMatchFloat64, for the same sizes and steps.
        EXPECT_LE(MaxRelativeError(b.param, ref.param, 0.1), 3e-6);
        EXPECT_LE(MaxRelativeError(b.row, ref.row, 1e-37), 1e-6);
        EXPECT_LE(MaxRelativeError(b.col, ref.col, 1e-37), 1e-6);
        EXPECT_LE(MaxRelativeError(b.full, ref.full, 1e-37), 1e-6);
        EXPECT_LE(MaxErrorOverLargest(b.m, ref.m), 1e-6);
        EXPECT_TRUE(SameBits(b.param, b32.param));
        EXPECT_TRUE(SameBits(b.m, b32.m));
        for (int64_t i = 0; i < b.numel(); ++i) {
          ASSERT_EQ(FloatBits(copy.Get(i)), FloatBits(RoundTo(ct, b.param[i]))) << i;
        }
      }
    }
  }
}

// A stochastic bf16 copy rounds each updated parameter to one of its two bf16 neighbours,
// upwards with probability p_i, the discarded fraction of an ulp: over n elements the number
// rounded up is Σ p_i within 5 standard deviations √(Σ p_i(1 − p_i)). The draws are a function
// of the seed and the element index only: the same for any thread count, other for another
// seed.
TEST(AdafactorTest, StochasticParamCopyIsUnbiasedAndDeterministic) {
  for (int64_t rows : {int64_t{300}, int64_t{0}}) {
    const int64_t cols = rows > 0 ? 517 : 100003;
    auto run = [&](int threads, uint64_t seed, std::vector<float>* param) {
      Buffers b(rows, cols, /*first_moment=*/false, 12);
      Stored copy(b.numel(), DType::kBF16);
      std::vector<float> grad = RandomVector(b.numel(), 600);
      Stored g16(grad, DType::kBF16);
      AdafactorArgs args = Hyperparameters(StepSize::kRelative, false, 1.0f);
      args.param_copy = copy.Flat();
      args.stochastic_rounding = true;
      args.seed = seed;
      EXPECT_TRUE(Step(CpuContext(threads), b, grad, args, &g16).ok());
      if (param != nullptr) *param = b.param;
      return copy;
    };
    std::vector<float> param;
    const Stored one = run(1, 21, &param), three = run(3, 21, nullptr), other = run(2, 22, nullptr);
    EXPECT_TRUE(SameWords(one, three)) << rows;
    EXPECT_FALSE(SameWords(one, other)) << rows;
    double ups = 0, want = 0, var = 0;
    for (size_t i = 0; i < param.size(); ++i) {
      const uint32_t bits = FloatBits(param[i]);
      const float toward_zero = Bf16ToFloat(static_cast<uint16_t>(bits >> 16));
      const float away = Bf16ToFloat(static_cast<uint16_t>((bits >> 16) + 1));
      const float got = one.Get(i);
      ASSERT_TRUE(got == toward_zero || got == away) << i << " " << param[i] << " " << got;
      const double p = (double{param[i]} - toward_zero) / (double{away} - toward_zero);
      ups += got == away ? 1.0 : 0.0;
      want += p;
      var += p * (1 - p);
    }
    EXPECT_NEAR(ups, want, 5 * std::sqrt(var)) << rows;
  }
}

TEST(AdafactorTest, SixteenBitModesIndependentOfThreadCount) {
  for (int64_t rows : {int64_t{300}, int64_t{0}}) {
    const int64_t cols = rows > 0 ? 517 : 100003;
    Buffers b1(rows, cols, /*first_moment=*/true, 13), b3 = b1;
    Stored c1(b1.numel(), DType::kF16), c3(b1.numel(), DType::kF16);
    AdafactorArgs args = Hyperparameters(StepSize::kRelative, /*first_moment=*/true, 1.0f);
    std::vector<float> unused;
    for (int step = 1; step <= 3; ++step) {
      Stored grad(RandomVector(b1.numel(), 700 + step), DType::kF16);
      args.step = step;
      args.param_copy = c1.Flat();
      ASSERT_TRUE(Step(CpuContext(1), b1, unused, args, &grad).ok());
      args.param_copy = c3.Flat();
      ASSERT_TRUE(Step(CpuContext(3), b3, unused, args, &grad).ok());
    }
    EXPECT_TRUE(SameBits(b1.param, b3.param)) << rows;
    EXPECT_TRUE(SameBits(b1.row, b3.row)) << rows;
    EXPECT_TRUE(SameBits(b1.col, b3.col)) << rows;
    EXPECT_TRUE(SameBits(b1.full, b3.full)) << rows;
    EXPECT_TRUE(SameWords(c1, c3)) << rows;
  }
}

// Each bad argument is rejected with InvalidArgument naming it.
TEST(AdafactorTest, RejectsBadArguments) {
  const DeviceContext ctx = CpuContext(1);
  std::vector<float> grad(6 * 4, 0.1f);
  const auto expect_error = [&](Buffers b, AdafactorArgs args, const std::string& name) {
    const absl::Status st = Step(ctx, b, grad, args);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(st.message().find(name), std::string::npos) << st;
  };
  const Buffers matrix(6, 4, /*first_moment=*/false, 1);
  const AdafactorArgs good = Hyperparameters(StepSize::kRelative, false, 1.0f);
  Buffers ok = matrix;
  ASSERT_TRUE(Step(ctx, ok, grad, good).ok());

  Buffers no_row = matrix;
  no_row.row.clear();
  expect_error(no_row, good, "row_state");
  Buffers with_full = matrix;
  with_full.full.assign(24, 0.0f);
  expect_error(with_full, good, "full_state");
  Buffers short_col = matrix;
  short_col.col.resize(3);
  expect_error(short_col, good, "col_state");

  AdafactorArgs args = good;
  args.lr = 1e-3f;
  expect_error(matrix, args, "lr");
  args = Hyperparameters(StepSize::kAbsolute, false, 1.0f);
  args.warmup_init = true;
  expect_error(matrix, args, "warmup_init");
  args = good;
  args.beta1 = 0.9f;
  expect_error(matrix, args, "beta1");
  args = good;
  args.decay_rate = 0.8f;
  expect_error(matrix, args, "decay_rate");
  args = good;
  args.clip_threshold = 0.0f;
  expect_error(matrix, args, "clip_threshold");
  args = good;
  args.step = 0;
  expect_error(matrix, args, "step");

  std::vector<float> cube(24, 0.0f);
  args = good;
  args.param = Tensor(cube.data(), DType::kF32, {2, 3, 4});
  args.grad = Tensor(grad.data(), DType::kF32, {2, 3, 4});
  const absl::Status st = AdafactorUpdate(ctx, args);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("param"), std::string::npos) << st;

  // The 16-bit options are checked as AdamWUpdate checks them.
  std::vector<int32_t> ints(24);
  std::vector<uint16_t> halves(24);
  args = good;
  args.grad = Tensor(ints.data(), DType::kI32, {6, 4});
  args.param = Tensor(ok.param.data(), DType::kF32, {6, 4});
  args.row_state = Flat(ok.row);
  args.col_state = Flat(ok.col);
  const absl::Status bad_grad = AdafactorUpdate(ctx, args);
  EXPECT_EQ(bad_grad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_grad.message().find("grad has dtype i32, expected one of f32, bf16, f16"),
            std::string::npos)
      << bad_grad;
  args = good;
  args.param_copy = Tensor(halves.data(), DType::kF16, {24});
  args.stochastic_rounding = true;
  expect_error(matrix, args, "stochastic_rounding needs a bf16 param_copy, it is f16");
  args = good;
  args.param_copy = Tensor(halves.data(), DType::kBF16, {23});
  expect_error(matrix, args, "param_copy");
  args = good;
  args.stochastic_rounding = true;
  expect_error(matrix, args, "stochastic_rounding is set but param_copy is empty");
}

}  // namespace
}  // namespace zt
