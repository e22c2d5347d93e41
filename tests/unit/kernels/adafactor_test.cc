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
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using testing::MaxErrorOverLargest;
using testing::MaxRelativeError;
using testing::RandomVector;
using testing::SameBits;
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

absl::Status Step(const DeviceContext& ctx, Buffers& b, std::vector<float>& grad,
                  AdafactorArgs args) {
  args.param = b.Param(b.param);
  args.grad = b.Param(grad);
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
}

}  // namespace
}  // namespace zt
