// RopeApply on the GPU against the CPU op (kernels/rope.h) on the same inputs: forward and
// inverse, f32/bf16/f16 storage, implicit and explicit positions, GQA head counts, head
// sizes 64 and 128.
#if ZT_HAVE_CUDA

#include "kernels/rope.h"

#include <cstring>
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
  int head_dim;
  bool explicit_positions;
  RopeDirection direction;
};

class RopeGpuTest : public ::testing::TestWithParam<Case> {};

TEST_P(RopeGpuTest, MatchesTheCpuOp) {
  ZT_SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  constexpr int kB = 2, kT = 37, kH = 8, kHkv = 2;
  const int64_t row = int64_t{kH + 2 * kHkv} * c.head_dim;
  const std::vector<float> x = testing::RandomVector(kB * kT * row, 7);
  testing::Stored cpu_store(x, c.dtype);
  std::vector<int32_t> positions(kB * kT);
  for (size_t i = 0; i < positions.size(); ++i) positions[i] = static_cast<int32_t>(i * 977 % 8191);

  Tensor cpu_qkv = cpu_store.View({kB, kT, row});
  Tensor cpu_pos = c.explicit_positions ? Tensor(positions.data(), DType::kI32, {kB, kT}) : Tensor();
  DeviceBuffer qkv_mem, pos_mem;
  Tensor gpu_qkv = ToDevice(cpu_qkv, qkv_mem);
  Tensor gpu_pos = ToDevice(cpu_pos, pos_mem);

  RopeArgs args{.qkv = cpu_qkv, .n_head = kH, .n_kv_head = kHkv, .theta = 500000.0f,
                .positions = cpu_pos, .direction = c.direction};
  ASSERT_TRUE(RopeApply(CpuContext(1), args).ok());
  GpuStream stream;
  args.qkv = gpu_qkv;
  args.positions = gpu_pos;
  ASSERT_TRUE(RopeApply(gpu_test::CudaContext(stream), args).ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);

  // Both evaluate the angle, its sine and cosine and the rotation in double and round once,
  // so they differ only where double sin/cos differ in the last bit and that flips a rounding:
  // f32 agrees to ~1 ulp (2^-24); a 16-bit result is off by at most one of its own ulps in
  // rare elements (bf16 2^-8, f16 2^-11), far under the bounds.
  const double bound = c.dtype == DType::kF32 ? 1e-6 : (c.dtype == DType::kBF16 ? 4e-3 : 5e-4);
  EXPECT_LT(NormalizedError(ToHostFloats(gpu_qkv), HostFloats(cpu_qkv)), bound);
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int d : {64, 128}) {
      for (bool explicit_positions : {false, true}) {
        for (RopeDirection dir : {RopeDirection::kForward, RopeDirection::kInverse}) {
          cases.push_back({dtype, d, explicit_positions, dir});
        }
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, RopeGpuTest, ::testing::ValuesIn(Cases()), [](const auto& info) {
  const Case& c = info.param;
  return std::string(DTypeName(c.dtype)) + "_D" + std::to_string(c.head_dim) +
         (c.explicit_positions ? "_positions" : "_implicit") +
         (c.direction == RopeDirection::kForward ? "_forward" : "_inverse");
});

TEST(RopeGpuTest, RefusesATensorOnAnotherDevice) {
  // Runs without a GPU: the entry point's check comes before any CUDA call.
  std::vector<float> x(2 * 3 * 4 * 8);
  DeviceContext ctx;
  ctx.device = gpu_test::Gpu0();
  const absl::Status s = RopeApply(ctx, {.qkv = Tensor(x.data(), DType::kF32, {2, 3, 32}),
                                         .n_head = 2, .n_kv_head = 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("qkv is on cpu:0"), std::string_view::npos) << s;
}

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
