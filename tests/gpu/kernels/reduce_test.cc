// SumOfSquares and AllFinite on the GPU against the CPU ops (kernels/reduce.h) on the same
// inputs, f32/bf16/f16, sizes from one element to past the 1024-block cap; the GPU's result
// is bitwise the same run to run; the workspace sizing and its check run without a GPU.
#if ZT_HAVE_CUDA

#include "kernels/reduce.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
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
using gpu_test::ToDevice;
using testing::RandomVector;
using testing::Stored;

struct Case {
  DType dtype;
  int64_t n;
};

class ReduceGpuTest : public ::testing::TestWithParam<Case> {};

TEST_P(ReduceGpuTest, SumOfSquaresMatchesTheCpuOpAndRepeatsBitwise) {
  ZT_SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  Stored host(RandomVector(static_cast<size_t>(c.n), 21, -3.0f, 3.0f), c.dtype);
  const Tensor t = host.View({c.n});
  DeviceBuffer mem;
  const Tensor gt = ToDevice(t, mem);
  GpuStream stream;
  DeviceContext probe = gpu_test::CudaContext(stream);
  DeviceBuffer workspace(ReduceWorkspaceBytes(probe, c.n));
  const DeviceContext ctx = gpu_test::CudaContext(stream, workspace.AsWorkspace());

  const double cpu = SumOfSquares(CpuContext(2), t).value();
  const absl::StatusOr<double> gpu = SumOfSquares(ctx, gt);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  // Every term x² is exact in f64 on both sides, so they differ only by the order of n − 1
  // f64 additions of non-negative terms: each order is within (n − 1)·2⁻⁵³ (relative) of
  // the exact sum, so the two within 2·n·2⁻⁵³ of each other.
  EXPECT_LE(std::abs(*gpu - cpu), 2.0 * static_cast<double>(c.n) * 0x1p-53 * cpu)
      << *gpu << " vs " << cpu;
  // Fixed block count and fixed trees: the same bits every time.
  EXPECT_EQ(SumOfSquares(ctx, gt).value(), *gpu);
}

TEST_P(ReduceGpuTest, AllFiniteFindsAnInfOrNaNAnywhere) {
  ZT_SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  GpuStream stream;
  DeviceBuffer workspace(ReduceWorkspaceBytes(gpu_test::CudaContext(stream), c.n));
  const DeviceContext ctx = gpu_test::CudaContext(stream, workspace.AsWorkspace());
  std::vector<float> values = RandomVector(static_cast<size_t>(c.n), 22);
  {
    Stored host(values, c.dtype);
    DeviceBuffer mem;
    EXPECT_TRUE(AllFinite(ctx, ToDevice(host.View({c.n}), mem)).value());
  }
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t where : {int64_t{0}, c.n / 2, c.n - 1}) {
    for (float bad : {inf, -inf, nan}) {
      std::vector<float> v = values;
      v[static_cast<size_t>(where)] = bad;
      Stored host(v, c.dtype);
      DeviceBuffer mem;
      const Tensor gt = ToDevice(host.View({c.n}), mem);
      EXPECT_EQ(AllFinite(ctx, gt).value(), AllFinite(CpuContext(2), host.View({c.n})).value());
      EXPECT_FALSE(AllFinite(ctx, gt).value()) << bad << " at " << where;
    }
  }
  if (c.dtype == DType::kF16) {
    // 70000 overflows f16 to inf when stored: what the loss scaler must catch.
    std::vector<float> v = values;
    v[0] = 70000.0f;
    Stored host(v, c.dtype);
    DeviceBuffer mem;
    EXPECT_FALSE(AllFinite(ctx, ToDevice(host.View({c.n}), mem)).value());
  }
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    // 1; a partial first block; past one block; past the 1024-block cap (4096 per block).
    for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{4099}, int64_t{(1 << 22) + 37}}) {
      cases.push_back({d, n});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, ReduceGpuTest, ::testing::ValuesIn(Cases()), [](const auto& info) {
  return std::string(DTypeName(info.param.dtype)) + "_n" + std::to_string(info.param.n);
});

TEST(ReduceGpuCheckTest, WorkspaceIsOnePartialPerBlockAndTheResult) {
  DeviceContext ctx;
  ctx.device = gpu_test::Gpu0();
  EXPECT_EQ(ReduceWorkspaceBytes(CpuContext(1), 1 << 20), 0);
  EXPECT_EQ(ReduceWorkspaceBytes(ctx, 0), 0);
  EXPECT_EQ(ReduceWorkspaceBytes(ctx, 1), 2 * 8);
  EXPECT_EQ(ReduceWorkspaceBytes(ctx, 4097), 3 * 8);
  EXPECT_EQ(ReduceWorkspaceBytes(ctx, int64_t{124} << 20), 1025 * 8);
}

TEST(ReduceGpuCheckTest, TooSmallWorkspaceIsFailedPreconditionNamingBothSizes) {
  // Runs without a GPU: the check comes before any CUDA call.
  std::vector<float> x(16);
  DeviceContext ctx;
  ctx.device = gpu_test::Gpu0();
  const Tensor t(x.data(), DType::kF32, {16}, gpu_test::Gpu0());
  for (const absl::Status& s : {SumOfSquares(ctx, t).status(), AllFinite(ctx, t).status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("needs 16 workspace bytes"), std::string_view::npos) << s;
    EXPECT_NE(s.message().find("context has 0"), std::string_view::npos) << s;
  }
}

// The step loop's device-side accumulators: the same sums added on the device, nothing read
// back until the caller copies the accumulator.
TEST_P(ReduceGpuTest, AccumulatorsMatchTheHostValueOps) {
  ZT_SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  Stored host(RandomVector(static_cast<size_t>(c.n), 23, -3.0f, 3.0f), c.dtype);
  const Tensor t = host.View({c.n});
  DeviceBuffer mem;
  const Tensor gt = ToDevice(t, mem);
  GpuStream stream;
  DeviceBuffer workspace(ReduceWorkspaceBytes(gpu_test::CudaContext(stream), c.n));
  const DeviceContext ctx = gpu_test::CudaContext(stream, workspace.AsWorkspace());
  // Slots: the f64 sum (2 f32), the flag; start from 0.5 so "adds" is what is checked.
  std::vector<float> init(4, 0.0f);
  const double start = 0.5;
  std::memcpy(init.data(), &start, sizeof start);
  DeviceBuffer slots_mem;
  const Tensor slots = ToDevice(Tensor(init.data(), DType::kF32, {4}), slots_mem);
  ASSERT_TRUE(AccumulateSumOfSquares(ctx, gt, slots.Slice(0, 2)).ok());
  ASSERT_TRUE(AccumulateNonFinite(ctx, gt, slots.Slice(2, 3)).ok());
  const std::vector<uint8_t> back = gpu_test::ToHostBytes(slots);
  double sum;
  float flag;
  std::memcpy(&sum, back.data(), 8);
  std::memcpy(&flag, back.data() + 8, 4);
  // The same kernels' partials as SumOfSquares, added to 0.5 in f64: the GPU op's value
  // plus 0.5, rounded once.
  const double gpu = SumOfSquares(ctx, gt).value();
  EXPECT_EQ(sum, start + gpu);
  EXPECT_EQ(flag, 0.0f);
  if (c.n > 0) {
    // One inf in the middle sets the flag.
    Stored bad(RandomVector(static_cast<size_t>(c.n), 23, -3.0f, 3.0f), c.dtype);
    std::vector<float> values = gpu_test::HostFloats(bad.View({c.n}));
    values[static_cast<size_t>(c.n / 2)] = std::numeric_limits<float>::infinity();
    Stored with_inf(values, c.dtype);
    DeviceBuffer bad_mem;
    const Tensor gbad = ToDevice(with_inf.View({c.n}), bad_mem);
    ASSERT_TRUE(AccumulateNonFinite(ctx, gbad, slots.Slice(2, 3)).ok());
    const std::vector<uint8_t> after = gpu_test::ToHostBytes(slots);
    std::memcpy(&flag, after.data() + 8, 4);
    EXPECT_EQ(flag, 1.0f);
  }
}

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
