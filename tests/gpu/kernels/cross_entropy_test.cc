// SoftmaxCrossEntropy on the GPU against the CPU op (kernels/cross_entropy.h) on the same
// inputs: GPT-2's padded vocabulary (50304, far more than one block's threads), a small and a
// one-entry vocabulary, ignored targets, targets at both ends of the row, losses only and
// losses with the in-place gradient, f32/bf16/f16 logits; and the GPU's NaN for a target ≥ V.
#if ZT_HAVE_CUDA

#include "kernels/cross_entropy.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/kernels/mixed_check.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::GpuStream;
using gpu_test::HostFloats;
using gpu_test::NormalizedError;
using gpu_test::ToDevice;
using gpu_test::ToHostFloats;

struct Case {
  DType dtype;
  int64_t vocab;
  bool write_grad;
};

// Targets of every kind: ignored, the first and the last entry, and random ones.
std::vector<int32_t> Targets(int64_t n, int64_t v) {
  std::mt19937 rng(5);
  std::vector<int32_t> t(n);
  for (int64_t r = 0; r < n; ++r) t[r] = static_cast<int32_t>(rng() % v);
  t[1] = kIgnoreTarget;
  t[2] = 0;
  t[3] = static_cast<int32_t>(v - 1);
  t[n - 1] = -7;  // any negative target is ignored
  return t;
}

class CrossEntropyGpuTest : public ::testing::TestWithParam<Case> {};

TEST_P(CrossEntropyGpuTest, MatchesTheCpuOp) {
  ZT_SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  constexpr int64_t kN = 9;
  const int64_t v = c.vocab;
  // Logits over ±4: probabilities spread over several orders of magnitude.
  const std::vector<float> x = testing::RandomVector(kN * v, 3, -4.0f, 4.0f);
  testing::Stored cpu_logits(x, c.dtype);
  testing::Stored gpu_logits_host(x, c.dtype);
  std::vector<int32_t> targets = Targets(kN, v);
  std::vector<float> cpu_losses(kN, -1.0f);
  CrossEntropyArgs args{.logits = cpu_logits.View({kN, v}),
                        .targets = Tensor(targets.data(), DType::kI32, {kN}),
                        .losses = Tensor(cpu_losses.data(), DType::kF32, {kN}),
                        .grad_scale = 1.0f / 7.0f,
                        .write_grad = c.write_grad};
  ASSERT_TRUE(SoftmaxCrossEntropy(CpuContext(2), args).ok());

  std::vector<float> losses_init(kN, -1.0f);
  DeviceBuffer logits_mem, targets_mem, losses_mem;
  const Tensor d_logits = ToDevice(gpu_logits_host.View({kN, v}), logits_mem);
  args.logits = d_logits;
  args.targets = ToDevice(args.targets, targets_mem);
  args.losses = ToDevice(Tensor(losses_init.data(), DType::kF32, {kN}), losses_mem);
  // cudaMemcpy from pageable memory may return before its DMA has landed, and the op's
  // non-blocking stream does not wait for it: let the uploads finish first.
  ZT_ASSERT_CUDA(cudaDeviceSynchronize());
  GpuStream stream;
  ASSERT_TRUE(SoftmaxCrossEntropy(gpu_test::CudaContext(stream), args).ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);

  // Both sides take the same max, sum exp(x − m) in double and take the log in double; they
  // differ by exp (Cephes' ~2 ulp on the CPU, CUDA's expf ≤ 2 ulp) and by the order of the
  // double sum, a few 1e-7 of a loss of ~log V + 4: 1e-5. The losses are f32 for every dtype.
  EXPECT_LT(NormalizedError(ToHostFloats(args.losses), cpu_losses), 1e-5);
  const std::vector<float> gpu_grad = ToHostFloats(d_logits);
  const std::vector<float> cpu_grad = HostFloats(cpu_logits.View({kN, v}));
  if (!c.write_grad) {
    // Logits are only read.
    EXPECT_EQ(gpu_grad, cpu_grad);
    return;
  }
  // Each gradient is exp(x − m)·(scale / S) in f32 on both sides, so they differ by exp's last
  // bits (a few ulp of f32): 1e-5. A 16-bit gradient is each side's f32 value rounded once;
  // where the two straddle a rounding boundary they differ by one 16-bit ulp, and even every
  // element doing so would keep the normalized error under one ulp relative (2^-7 for bf16,
  // 2^-10 for f16).
  const double ulp = c.dtype == DType::kBF16 ? 0x1p-7 : c.dtype == DType::kF16 ? 0x1p-10 : 0.0;
  EXPECT_LT(NormalizedError(gpu_grad, cpu_grad), 1e-5 + ulp);
  // Ignored rows are exactly zero on both.
  for (int64_t i = 0; i < v; ++i) ASSERT_EQ(gpu_grad[1 * v + i], 0.0f);
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t v : {50304, 1000, 1}) {
      for (bool write_grad : {false, true}) cases.push_back({dtype, v, write_grad});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, CrossEntropyGpuTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) {
                           const Case& c = info.param;
                           return std::string(DTypeName(c.dtype)) + "_V" + std::to_string(c.vocab) +
                                  (c.write_grad ? "_grad" : "_loss_only");
                         });

TEST(CrossEntropyGpuOnlyTest, ATargetPastTheVocabularyGivesNaN) {
  // The CPU op returns InvalidArgument; the GPU cannot without waiting for the stream, so the
  // row is poisoned instead (kernels/cuda/cross_entropy.h). The other rows are unaffected.
  ZT_SKIP_WITHOUT_GPU();
  constexpr int64_t kN = 2, kV = 10;
  std::vector<float> logits(kN * kV, 0.0f), losses(kN, -1.0f);
  std::vector<int32_t> targets = {3, kV};
  DeviceBuffer logits_mem, targets_mem, losses_mem;
  const CrossEntropyArgs args{
      .logits = ToDevice(Tensor(logits.data(), DType::kF32, {kN, kV}), logits_mem),
      .targets = ToDevice(Tensor(targets.data(), DType::kI32, {kN}), targets_mem),
      .losses = ToDevice(Tensor(losses.data(), DType::kF32, {kN}), losses_mem),
      .write_grad = true};
  // cudaMemcpy from pageable memory may return before its DMA has landed, and the op's
  // non-blocking stream does not wait for it: let the uploads finish first.
  ZT_ASSERT_CUDA(cudaDeviceSynchronize());
  GpuStream stream;
  ASSERT_TRUE(SoftmaxCrossEntropy(gpu_test::CudaContext(stream), args).ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  const std::vector<float> got = ToHostFloats(args.losses);
  EXPECT_FLOAT_EQ(got[0], std::log(10.0f));  // uniform logits: log V
  EXPECT_TRUE(std::isnan(got[1]));
  const std::vector<float> grad = ToHostFloats(args.logits);
  EXPECT_TRUE(std::isnan(grad[kV]));
}

TEST(CrossEntropyGpuArgsTest, RefusesATensorOnAnotherDevice) {
  // Runs without a GPU: the entry point's check comes before any CUDA call.
  std::vector<float> logits(2 * 5), losses(2);
  std::vector<int32_t> targets(2);
  DeviceContext ctx;
  ctx.device = gpu_test::Gpu0();
  const absl::Status s = SoftmaxCrossEntropy(
      ctx, {.logits = Tensor(logits.data(), DType::kF32, {2, 5}),
            .targets = Tensor(targets.data(), DType::kI32, {2}, gpu_test::Gpu0()),
            .losses = Tensor(losses.data(), DType::kF32, {2}, gpu_test::Gpu0())});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("logits is on cpu:0"), std::string_view::npos) << s;
}

TEST(MeanLossGpuTest, MatchesTheCpuOpAndRepeatsBitwise) {
  ZT_SKIP_WITHOUT_GPU();
  const int64_t n = 8 * 1024 + 3;  // past one pass of the block
  std::vector<float> losses = testing::RandomVector(static_cast<size_t>(n), 31, 0.0f, 6.0f);
  std::vector<int32_t> targets(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) targets[i] = i % 7 == 3 ? kIgnoreTarget : 1;
  const Tensor hl(losses.data(), DType::kF32, {n});
  const Tensor ht(targets.data(), DType::kI32, {n});
  gpu_test::DeviceBuffer lm, tm, am;
  const Tensor dl = gpu_test::ToDevice(hl, lm), dt = gpu_test::ToDevice(ht, tm);
  alignas(8) double zero = 0;
  const Tensor acc = gpu_test::ToDevice(Tensor(&zero, DType::kF32, {2}), am);
  gpu_test::GpuStream stream;
  const DeviceContext ctx = gpu_test::CudaContext(stream);
  alignas(8) double cpu = 0;
  ASSERT_TRUE(
      AccumulateMeanLoss(
          CpuContext(1),
          {.losses = hl, .targets = ht, .divisor = 3.0, .sum = Tensor(&cpu, DType::kF32, {2})})
          .ok());
  const MeanLossArgs args{.losses = dl, .targets = dt, .divisor = 3.0, .sum = acc};
  ASSERT_TRUE(AccumulateMeanLoss(ctx, args).ok());
  double gpu;
  std::memcpy(&gpu, gpu_test::ToHostBytes(acc).data(), 8);
  // n positive f32 terms summed in f64 in two orders: within 2·n·2⁻⁵³ relative of each other.
  EXPECT_NEAR(gpu, cpu, 2.0 * n * 0x1p-53 * cpu);
  ASSERT_TRUE(AccumulateMeanLoss(ctx, args).ok());
  double twice;
  std::memcpy(&twice, gpu_test::ToHostBytes(acc).data(), 8);
  EXPECT_EQ(twice, gpu + gpu) << "a fixed tree: the same value added again";
}

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
