// The LoRA ops on the GPU (kernels/cuda/lora.h) against the CPU ops (kernels/lora.h) on the
// same inputs: ColumnsCopy and ColumnsAdd of a column block of a fused projection, and
// LoraDropout over a whole matrix and over a tensor-parallel column share, in place and not,
// f32/bf16/f16 storage with the tensors in different dtypes. None of these ops sums, so the
// bound is zero: the GPU's bytes must be the CPU's (the same f32 loads, one f32 add or
// multiply, the same rounding on store, the same mask hash and keep rule).
#if ZT_HAVE_CUDA

#include "kernels/lora.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/kernels/twin.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using gpu_test::GpuStream;
using gpu_test::Twin;
using testing::RandomVector;

struct Case {
  DType wide, part;
};

class LoraGpuTest : public ::testing::TestWithParam<Case> {};

// 37 rows of a 700-column fused output, the part columns [300, 557): partial blocks and a
// part that starts and ends inside a row.
constexpr int64_t kM = 37, kN = 700, kC0 = 300, kn = 257;

TEST_P(LoraGpuTest, ColumnsCopyAndAddAreTheCpuOpsBitForBit) {
  ZT_SKIP_WITHOUT_GPU();
  const Case k = GetParam();
  Twin wide = Twin::Floats(RandomVector(kM * kN, 5), k.wide, {kM, kN});
  Twin part = Twin::Floats(RandomVector(kM * kn, 6), k.part, {kM, kn});
  Twin copied = Twin::Floats(std::vector<float>(kM * kn), k.part, {kM, kn});
  GpuStream stream;
  const DeviceContext gpu = gpu_test::CudaContext(stream);
  for (const bool on_gpu : {false, true}) {
    const DeviceContext ctx = on_gpu ? gpu : CpuContext(2);
    ASSERT_TRUE(
        ColumnsCopy(ctx, {.src = wide.on(on_gpu), .col_begin = kC0, .dst = copied.on(on_gpu)})
            .ok());
    ASSERT_TRUE(
        ColumnsAdd(ctx, {.src = part.on(on_gpu), .dst = wide.on(on_gpu), .col_begin = kC0}).ok());
  }
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  EXPECT_EQ(copied.GpuBytes(), copied.CpuBytes());
  EXPECT_EQ(wide.GpuBytes(), wide.CpuBytes());
}

TEST_P(LoraGpuTest, DropoutIsTheCpuMaskBitForBit) {
  ZT_SKIP_WITHOUT_GPU();
  const Case k = GetParam();
  const uint64_t seed = LoraDropoutSeed(1234, 3, 1);
  GpuStream stream;
  const DeviceContext gpu = gpu_test::CudaContext(stream);
  // Whole matrix, out of place.
  Twin inp = Twin::Floats(RandomVector(kM * kn, 7), k.wide, {kM, kn});
  Twin out = Twin::Floats(std::vector<float>(kM * kn), k.part, {kM, kn});
  // A column share [kC0, kC0 + kn) of a logical kN-column matrix, in place.
  Twin share = Twin::Floats(RandomVector(kM * kn, 8), k.part, {kM, kn});
  for (const bool on_gpu : {false, true}) {
    const DeviceContext ctx = on_gpu ? gpu : CpuContext(2);
    ASSERT_TRUE(
        LoraDropout(ctx, {.inp = inp.on(on_gpu), .out = out.on(on_gpu), .p = 0.3f, .seed = seed})
            .ok());
    ASSERT_TRUE(LoraDropout(ctx, {.inp = share.on(on_gpu),
                                  .out = share.on(on_gpu),
                                  .p = 0.1f,
                                  .seed = seed,
                                  .logical_cols = kN,
                                  .col_begin = kC0})
                    .ok());
  }
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  EXPECT_EQ(out.GpuBytes(), out.CpuBytes());
  EXPECT_EQ(share.GpuBytes(), share.CpuBytes());
  // Both masks dropped something (p = 0.3 of 9 509 elements and 0.1 of them): a GPU op that
  // copied its input would fail above, not pass as "equal to a copy".
  int zeros = 0;
  for (const float v : out.GpuFloats()) zeros += v == 0.0f;
  EXPECT_GT(zeros, kM * kn / 5);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LoraGpuTest,
                         ::testing::Values(Case{DType::kF32, DType::kF32},
                                           Case{DType::kBF16, DType::kBF16},
                                           Case{DType::kF16, DType::kF16},
                                           Case{DType::kF32, DType::kBF16},
                                           Case{DType::kBF16, DType::kF32}));

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
