// kernels/cross_entropy: losses against a float64 log-softmax, the in-place gradient against
// finite differences of the mean loss, ignored targets, large logits, determinism, errors.
#include "kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <tuple>
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

// −log softmax(row)[target] in float64; 0 for an ignored target.
std::vector<double> ReferenceLosses(int64_t n, int64_t v, const std::vector<double>& logits,
                                    const std::vector<int32_t>& targets) {
  std::vector<double> losses(n, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    if (targets[r] < 0) continue;
    const double* x = &logits[r * v];
    const double m = *std::max_element(x, x + v);
    double sum = 0;
    for (int64_t i = 0; i < v; ++i) sum += std::exp(x[i] - m);
    losses[r] = m + std::log(sum) - x[targets[r]];
  }
  return losses;
}

std::vector<int32_t> RandomTargets(int64_t n, int64_t v, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % v);
  return t;
}

struct CeResult {
  std::vector<float> logits, losses;
};
CeResult RunCrossEntropy(int threads, std::vector<float> logits, std::vector<int32_t>& targets,
                         int64_t v, bool write_grad, float grad_scale) {
  const int64_t n = static_cast<int64_t>(targets.size());
  CeResult run{std::move(logits), std::vector<float>(n, -1.0f)};
  const absl::Status st = SoftmaxCrossEntropy(
      CpuContext(threads), {.logits = Tensor(run.logits.data(), DType::kF32, {n, v}),
                            .targets = Tensor(targets.data(), DType::kI32, {n}),
                            .losses = Tensor(run.losses.data(), DType::kF32, {n}),
                            .grad_scale = grad_scale,
                            .write_grad = write_grad});
  EXPECT_TRUE(st.ok()) << st;
  return run;
}

TEST(CrossEntropyTest, LossesMatchFloat64AndIgnoredTargetsAreZero) {
  const int64_t n = 7, v = 300;
  const std::vector<float> logits = RandomVector(n * v, 1, -5.0f, 5.0f);
  std::vector<int32_t> targets = RandomTargets(n, v, 2);
  targets[2] = kIgnoreTarget;
  targets[5] = -7;  // any negative target is ignored
  const CeResult run = RunCrossEntropy(2, logits, targets, v, /*write_grad=*/false, 1.0f);
  // Sum of V exps accumulated in double, one log: the error is the f32 rounding of the
  // inputs' exps (2 ulp each, averaging out) and of the final loss, ~1e-7 relative.
  EXPECT_LE(MaxRelativeError(run.losses, ReferenceLosses(n, v, ToDouble(logits), targets)), 1e-6);
  EXPECT_EQ(run.losses[2], 0.0f);
  EXPECT_EQ(run.losses[5], 0.0f);
  EXPECT_TRUE(SameBits(run.logits, logits));  // no gradient asked: logits untouched
}

TEST(CrossEntropyTest, GradientMatchesFiniteDifferencesOfMeanLoss) {
  const int64_t n = 5, v = 60;
  const std::vector<float> logits = RandomVector(n * v, 3, -3.0f, 3.0f);
  std::vector<int32_t> targets = RandomTargets(n, v, 4);
  targets[1] = kIgnoreTarget;
  const double valid = n - 1;
  const CeResult run =
      RunCrossEntropy(2, logits, targets, v, /*write_grad=*/true, static_cast<float>(1 / valid));
  auto mean_loss = [&](const std::vector<double>& x) {
    double l = 0;
    for (double loss : ReferenceLosses(n, v, x, targets)) l += loss;
    return l / valid;
  };
  const std::vector<double> want = FiniteDifferenceGradient(ToDouble(logits), mean_loss);
  // Probabilities ~1/V scaled by 1/4 are ~4e-3: measured against a floor of 1e-4 the f32
  // result (a few roundings, ~1e-7 relative) and the central differences (~1e-8 absolute
  // here) sit well below 1e-4.
  EXPECT_LE(MaxRelativeError(run.logits, want, 1e-4), 1e-4);
  for (int64_t i = 0; i < v; ++i) EXPECT_EQ(run.logits[1 * v + i], 0.0f);  // ignored row
  // The losses are the same whether or not the gradient is written.
  const CeResult no_grad = RunCrossEntropy(2, logits, targets, v, false, 1.0f);
  EXPECT_TRUE(SameBits(run.losses, no_grad.losses));
}

TEST(CrossEntropyTest, LargeLogitsAreStable) {
  const int64_t n = 3, v = 1000;
  std::vector<float> logits = RandomVector(n * v, 5, 500.0f, 600.0f);  // exp would overflow
  logits[0 * v + 17] = 700.0f;  // a confident row: the target's probability is ~1
  std::vector<int32_t> targets = {17, 3, 999};
  const CeResult run = RunCrossEntropy(1, logits, targets, v, /*write_grad=*/true, 1.0f);
  const std::vector<double> want = ReferenceLosses(n, v, ToDouble(logits), targets);
  for (int64_t r = 0; r < n; ++r) {
    // Losses are differences of logits ~600 whose f32 spacing is 6e-5.
    EXPECT_NEAR(run.losses[r], want[r], 1e-3) << "row " << r;
  }
  for (float g : run.logits) EXPECT_TRUE(std::isfinite(g));
  // p_target − 1 with p_target = 1 − e^−100 or so: tiny and not positive.
  EXPECT_LE(run.logits[17], 0.0f);
  EXPECT_GE(run.logits[17], -1e-30f);
  // Each gradient row sums to 0 (probabilities sum to 1).
  for (int64_t r = 0; r < n; ++r) {
    double sum = 0;
    for (int64_t i = 0; i < v; ++i) sum += run.logits[r * v + i];
    EXPECT_NEAR(sum, 0.0, 1e-5) << "row " << r;  // V roundings of values ≤ 1
  }
}

TEST(CrossEntropyTest, BitwiseIndependentOfThreadCount) {
  const int64_t n = 37, v = 5003;
  const std::vector<float> logits = RandomVector(n * v, 6, -10.0f, 10.0f);
  std::vector<int32_t> targets = RandomTargets(n, v, 7);
  targets[9] = kIgnoreTarget;
  const CeResult one = RunCrossEntropy(1, logits, targets, v, true, 0.5f);
  const CeResult three = RunCrossEntropy(3, logits, targets, v, true, 0.5f);
  EXPECT_TRUE(SameBits(one.losses, three.losses));
  EXPECT_TRUE(SameBits(one.logits, three.logits));
}

void ExpectInvalid(const absl::Status& st, const std::string& needle) {
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find(needle), std::string::npos) << st;
}

// 16-bit logits: the losses and the in-place gradient against float64 on the stored logits.
// The loss keeps the f32 path's 1e-6 (it is f32 output); each gradient element may add one
// rounding to the logits' dtype (one ulp allowed for the reference's double rounding) to the
// f32 path's 1e-4 with floor 1e-4 (GradientMatchesFiniteDifferencesOfMeanLoss).
TEST(CrossEntropyTest, SixteenBitLogitsMatchFloat64) {
  const int64_t n = 5, v = 60;
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    Stored logits(RandomVector(n * v, 31, -3.0f, 3.0f), dtype);
    const std::vector<double> x0 = logits.Doubles();
    std::vector<int32_t> targets = RandomTargets(n, v, 32);
    targets[3] = kIgnoreTarget;
    std::vector<float> losses(n);
    const double valid = n - 1;
    ASSERT_TRUE(
        SoftmaxCrossEntropy(CpuContext(2), {.logits = logits.View({n, v}),
                                            .targets = Tensor(targets.data(), DType::kI32, {n}),
                                            .losses = Tensor(losses.data(), DType::kF32, {n}),
                                            .grad_scale = static_cast<float>(1 / valid),
                                            .write_grad = true})
            .ok());
    EXPECT_LE(MaxRelativeError(losses, ReferenceLosses(n, v, x0, targets)), 1e-6);
    auto mean_loss = [&](const std::vector<double>& x) {
      double l = 0;
      for (double loss : ReferenceLosses(n, v, x, targets)) l += loss;
      return l / valid;
    };
    EXPECT_EQ(CountOutsideUlp(logits, FiniteDifferenceGradient(x0, mean_loss), 1e-4, 1e-4), 0)
        << DTypeName(dtype);
    for (int64_t i = 0; i < v; ++i) EXPECT_EQ(logits.Get(3 * v + i), 0.0f);  // ignored row
  }
}

TEST(CrossEntropyTest, SixteenBitBitwiseIndependentOfThreadCount) {
  const int64_t n = 37, v = 1000;
  std::vector<int32_t> targets = RandomTargets(n, v, 33);
  Stored one(RandomVector(n * v, 34, -8.0f, 8.0f), DType::kBF16), three = one;
  std::vector<float> l1(n), l3(n);
  for (auto [buf, loss, threads] : {std::tuple{&one, &l1, 1}, std::tuple{&three, &l3, 3}}) {
    ASSERT_TRUE(SoftmaxCrossEntropy(CpuContext(threads),
                                    {.logits = buf->View({n, v}),
                                     .targets = Tensor(targets.data(), DType::kI32, {n}),
                                     .losses = Tensor(loss->data(), DType::kF32, {n}),
                                     .write_grad = true})
                    .ok());
  }
  EXPECT_TRUE(SameBits(l1, l3));
  EXPECT_TRUE(SameWords(one, three));
}

TEST(CrossEntropyTest, BadArgumentsAreNamed) {
  const int64_t n = 6, v = 50;
  std::vector<float> logits = RandomVector(n * v, 8), losses(n);
  std::vector<int32_t> targets = RandomTargets(n, v, 9);
  targets[2] = static_cast<int32_t>(v);
  targets[4] = 1000;
  CrossEntropyArgs args{.logits = Tensor(logits.data(), DType::kF32, {n, v}),
                        .targets = Tensor(targets.data(), DType::kI32, {n}),
                        .losses = Tensor(losses.data(), DType::kF32, {n}),
                        .write_grad = true};
  const std::vector<float> before = logits;
  ExpectInvalid(SoftmaxCrossEntropy(CpuContext(1), args),
                "SoftmaxCrossEntropy: targets[2] = 50 is not below V = 50");
  EXPECT_TRUE(SameBits(logits, before));  // rejected before anything is written
  CrossEntropyArgs bad = args;
  bad.losses = Tensor(losses.data(), DType::kF32, {n - 1});
  ExpectInvalid(SoftmaxCrossEntropy(CpuContext(1), bad), "losses has shape f32[5], expected [6]");
  bad = args;
  bad.targets = Tensor(targets.data(), DType::kF32, {n});
  ExpectInvalid(SoftmaxCrossEntropy(CpuContext(1), bad), "targets has dtype f32, expected i32");
  bad = args;
  bad.logits = Tensor(logits.data(), DType::kF32, {n * v});
  ExpectInvalid(SoftmaxCrossEntropy(CpuContext(1), bad), "logits has shape f32[300]");
}

TEST(MeanLossTest, AddsTheMeanOfTheValidRowsOverTheDivisor) {
  const int64_t n = 37;
  std::vector<float> losses = RandomVector(n, 11, 0.0f, 5.0f);
  std::vector<int32_t> targets(n);
  for (int64_t i = 0; i < n; ++i) targets[i] = i % 5 == 0 ? kIgnoreTarget : static_cast<int32_t>(i);
  long double sum = 0;
  int valid = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (targets[i] >= 0) {
      sum += losses[i];
      ++valid;
    }
  }
  alignas(8) double acc = 0.25;
  const MeanLossArgs args{.losses = Tensor(losses.data(), DType::kF32, {n}),
                          .targets = Tensor(targets.data(), DType::kI32, {n}),
                          .divisor = 4.0,
                          .sum = Tensor(&acc, DType::kF32, {2})};
  ASSERT_TRUE(AccumulateMeanLoss(CpuContext(1), args).ok());
  // The mean of 29 f32 values summed in double: exact to ~30·2^-53 relative.
  EXPECT_NEAR(acc, 0.25 + static_cast<double>(sum / valid) / 4.0, 1e-14);
  // No valid target adds nothing.
  std::vector<int32_t> none(n, kIgnoreTarget);
  MeanLossArgs empty = args;
  empty.targets = Tensor(none.data(), DType::kI32, {n});
  const double before = acc;
  ASSERT_TRUE(AccumulateMeanLoss(CpuContext(1), empty).ok());
  EXPECT_EQ(acc, before);
  MeanLossArgs zero = args;
  zero.divisor = 0;
  EXPECT_EQ(AccumulateMeanLoss(CpuContext(1), zero).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zt
