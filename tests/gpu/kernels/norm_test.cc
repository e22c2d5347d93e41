// LayerNorm and RMSNorm on the GPU against the CPU op (kernels/norm.h) on the same inputs:
// forward (out, saved mean and rstd) and backward (dinp overwritten or added, dweight and
// dbias +=), C = 768, 4096 and 37, one row and many, f32/bf16/f16 storage; dinp in place over
// dout; the bits of dweight repeat; the workspace check.
#if ZT_HAVE_CUDA

#include "kernels/norm.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/kernels/twin.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::GpuStream;
using gpu_test::NormalizedError;
using gpu_test::Twin;
using testing::RandomVector;

// f32 results differ from the CPU's only by the order of f32 sums over C ≤ 4096 channels (or
// 300 rows): a relative error of a few 2^-24 per element, ~1e-6 in norm; 1e-5 leaves room
// for the worst rows. A 16-bit result is that f32 value rounded once, so it differs only
// where the small f32 difference crosses a rounding boundary, by one of its own ulps (bf16
// 2^-8, f16 2^-11 relative); the bounds are about one such ulp over the whole buffer, which
// only a wrong formula or index (an O(1) error) can reach. mean and rstd are always f32.
double Bound(DType dtype) {
  return dtype == DType::kF32 ? 1e-5 : (dtype == DType::kBF16 ? 4e-3 : 5e-4);
}
constexpr double kF32Bound = 1e-5;

struct Case {
  bool layer_norm;
  int64_t rows, c;
  DType dtype;
  Accumulate mode;
};

std::string Name(const Case& c) {
  return std::string(c.layer_norm ? "LayerNorm" : "RmsNorm") + "_N" + std::to_string(c.rows) +
         "_C" + std::to_string(c.c) + "_" + DTypeName(c.dtype) +
         (c.mode == Accumulate::kAdd ? "_add" : "_overwrite");
}

// Every buffer of one forward and one backward call.
struct Buffers {
  Twin inp, weight, bias, out, mean, rstd, dout, dinp, dweight, dbias;
  Buffers(const Case& k, uint32_t seed)
      : inp(Twin::Floats(RandomVector(k.rows * k.c, seed, -1.0f, 2.0f), k.dtype, {k.rows, k.c})),
        weight(Twin::Floats(RandomVector(k.c, seed + 1, 0.5f, 1.5f), k.dtype, {k.c})),
        bias(Twin::Floats(RandomVector(k.c, seed + 2), k.dtype, {k.c})),
        out(Twin::Floats(std::vector<float>(k.rows * k.c), k.dtype, {k.rows, k.c})),
        mean(Twin::Floats(std::vector<float>(k.rows), DType::kF32, {k.rows})),
        rstd(Twin::Floats(std::vector<float>(k.rows), DType::kF32, {k.rows})),
        dout(Twin::Floats(RandomVector(k.rows * k.c, seed + 3), k.dtype, {k.rows, k.c})),
        dinp(Twin::Floats(RandomVector(k.rows * k.c, seed + 4), k.dtype, {k.rows, k.c})),
        dweight(Twin::Floats(RandomVector(k.c, seed + 5), k.dtype, {k.c})),
        dbias(Twin::Floats(RandomVector(k.c, seed + 6), k.dtype, {k.c})) {}
};

absl::Status Forward(bool layer_norm, const DeviceContext& ctx, Buffers& b, bool gpu) {
  if (layer_norm) {
    return LayerNormForward(ctx, {.inp = b.inp.on(gpu),
                                  .weight = b.weight.on(gpu),
                                  .bias = b.bias.on(gpu),
                                  .out = b.out.on(gpu),
                                  .mean = b.mean.on(gpu),
                                  .rstd = b.rstd.on(gpu)});
  }
  return RmsNormForward(ctx, {.inp = b.inp.on(gpu),
                              .weight = b.weight.on(gpu),
                              .out = b.out.on(gpu),
                              .rstd = b.rstd.on(gpu)});
}

// dinp_twin is b.dinp, or b.dout for the in-place case.
absl::Status Backward(const Case& k, const DeviceContext& ctx, Buffers& b, Twin& dinp, bool gpu) {
  if (k.layer_norm) {
    return LayerNormBackward(ctx, {.dout = b.dout.on(gpu),
                                   .inp = b.inp.on(gpu),
                                   .weight = b.weight.on(gpu),
                                   .mean = b.mean.on(gpu),
                                   .rstd = b.rstd.on(gpu),
                                   .dinp = dinp.on(gpu),
                                   .dweight = b.dweight.on(gpu),
                                   .dbias = b.dbias.on(gpu),
                                   .dinp_mode = k.mode});
  }
  return RmsNormBackward(ctx, {.dout = b.dout.on(gpu),
                               .inp = b.inp.on(gpu),
                               .weight = b.weight.on(gpu),
                               .rstd = b.rstd.on(gpu),
                               .dinp = dinp.on(gpu),
                               .dweight = b.dweight.on(gpu),
                               .dinp_mode = k.mode});
}

int64_t WorkspaceBytes(const Case& k) {
  return k.layer_norm ? LayerNormBackwardWorkspaceBytes(DeviceKind::kCuda, k.rows, k.c)
                      : RmsNormBackwardWorkspaceBytes(DeviceKind::kCuda, k.rows, k.c);
}

class NormGpuTest : public ::testing::TestWithParam<Case> {};

TEST_P(NormGpuTest, ForwardMatchesTheCpuOp) {
  ZT_SKIP_WITHOUT_GPU();
  const Case k = GetParam();
  Buffers b(k, 11);
  GpuStream stream;
  ASSERT_TRUE(Forward(k.layer_norm, CpuContext(1), b, /*gpu=*/false).ok());
  const absl::Status s = Forward(k.layer_norm, gpu_test::CudaContext(stream), b, /*gpu=*/true);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  EXPECT_LT(NormalizedError(b.out.GpuFloats(), b.out.CpuFloats()), Bound(k.dtype));
  EXPECT_LT(NormalizedError(b.rstd.GpuFloats(), b.rstd.CpuFloats()), kF32Bound);
  if (k.layer_norm) {
    EXPECT_LT(NormalizedError(b.mean.GpuFloats(), b.mean.CpuFloats()), kF32Bound);
  }
}

TEST_P(NormGpuTest, BackwardMatchesTheCpuOp) {
  ZT_SKIP_WITHOUT_GPU();
  const Case k = GetParam();
  Buffers b(k, 23);
  GpuStream stream;
  // The saved statistics both backward passes read: the CPU's, copied to the device.
  ASSERT_TRUE(Forward(k.layer_norm, CpuContext(1), b, /*gpu=*/false).ok());
  b.mean = Twin::Floats(b.mean.CpuFloats(), DType::kF32, {k.rows});
  b.rstd = Twin::Floats(b.rstd.CpuFloats(), DType::kF32, {k.rows});
  DeviceBuffer workspace(WorkspaceBytes(k));
  ASSERT_TRUE(Backward(k, CpuContext(1), b, b.dinp, /*gpu=*/false).ok());
  const absl::Status s =
      Backward(k, gpu_test::CudaContext(stream, workspace.AsWorkspace()), b, b.dinp, true);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  EXPECT_LT(NormalizedError(b.dinp.GpuFloats(), b.dinp.CpuFloats()), Bound(k.dtype));
  EXPECT_LT(NormalizedError(b.dweight.GpuFloats(), b.dweight.CpuFloats()), Bound(k.dtype));
  if (k.layer_norm) {
    EXPECT_LT(NormalizedError(b.dbias.GpuFloats(), b.dbias.CpuFloats()), Bound(k.dtype));
  }
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (bool ln : {true, false}) {
    for (int64_t c : {768, 4096, 37}) {
      // 300 rows: more rows than backward blocks (256), so blocks take two rows or one.
      for (int64_t rows : {1, 300}) {
        for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
          for (Accumulate mode : {Accumulate::kOverwrite, Accumulate::kAdd}) {
            cases.push_back({ln, rows, c, dtype, mode});
          }
        }
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, NormGpuTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return Name(info.param); });

TEST(NormGpuTest, BackwardInPlaceOverDoutMatchesTheCpuOp) {
  ZT_SKIP_WITHOUT_GPU();
  for (bool ln : {true, false}) {
    const Case k{ln, 70, 768, DType::kBF16, Accumulate::kOverwrite};
    Buffers b(k, 31);
    GpuStream stream;
    ASSERT_TRUE(Forward(k.layer_norm, CpuContext(1), b, /*gpu=*/false).ok());
    b.mean = Twin::Floats(b.mean.CpuFloats(), DType::kF32, {k.rows});
    b.rstd = Twin::Floats(b.rstd.CpuFloats(), DType::kF32, {k.rows});
    DeviceBuffer workspace(WorkspaceBytes(k));
    ASSERT_TRUE(Backward(k, CpuContext(1), b, b.dout, /*gpu=*/false).ok());
    ASSERT_TRUE(
        Backward(k, gpu_test::CudaContext(stream, workspace.AsWorkspace()), b, b.dout, true).ok());
    ASSERT_EQ(stream.Sync(), cudaSuccess);
    // As in BackwardMatchesTheCpuOp (bf16).
    EXPECT_LT(NormalizedError(b.dout.GpuFloats(), b.dout.CpuFloats()), 4e-3) << Name(k);
    EXPECT_LT(NormalizedError(b.dweight.GpuFloats(), b.dweight.CpuFloats()), 4e-3) << Name(k);
  }
}

TEST(NormGpuTest, ParameterGradientsAreTheSameBitsEveryRun) {
  ZT_SKIP_WITHOUT_GPU();
  const Case k{true, 1000, 768, DType::kF32, Accumulate::kOverwrite};
  std::vector<std::vector<uint8_t>> runs;
  for (int run = 0; run < 2; ++run) {
    Buffers b(k, 41);
    GpuStream stream;
    DeviceBuffer workspace(WorkspaceBytes(k));
    ASSERT_TRUE(Forward(true, gpu_test::CudaContext(stream), b, /*gpu=*/true).ok());
    ASSERT_TRUE(
        Backward(k, gpu_test::CudaContext(stream, workspace.AsWorkspace()), b, b.dinp, true).ok());
    ASSERT_EQ(stream.Sync(), cudaSuccess);
    std::vector<uint8_t> bits = b.dweight.GpuBytes();
    const std::vector<uint8_t> db = b.dbias.GpuBytes();
    bits.insert(bits.end(), db.begin(), db.end());
    runs.push_back(std::move(bits));
  }
  EXPECT_EQ(runs[0], runs[1]);
}

TEST(NormGpuTest, BackwardRefusesASmallWorkspace) {
  // Runs without a GPU: the workspace is checked before any CUDA call.
  constexpr int64_t kN = 4, kC = 8;
  std::vector<float> x(kN * kC), w(kC), stat(kN);
  const Device gpu = gpu_test::Gpu0();
  const Tensor rows(x.data(), DType::kF32, {kN, kC}, gpu);
  const Tensor channels(w.data(), DType::kF32, {kC}, gpu);
  const Tensor per_row(stat.data(), DType::kF32, {kN}, gpu);
  DeviceContext ctx;
  ctx.device = gpu;
  ctx.workspace = Workspace{.data = x.data(), .bytes = 16};
  const absl::Status s = RmsNormBackward(ctx, {.dout = rows,
                                               .inp = rows,
                                               .weight = channels,
                                               .rstd = per_row,
                                               .dinp = rows,
                                               .dweight = channels});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("RmsNormBackwardWorkspaceBytes"), std::string_view::npos) << s;
  EXPECT_EQ(RmsNormBackwardWorkspaceBytes(DeviceKind::kCuda, kN, kC), kN * kC * 4);
  EXPECT_EQ(LayerNormBackwardWorkspaceBytes(DeviceKind::kCuda, 1000, kC), 256 * kC * 2 * 4);
  EXPECT_EQ(LayerNormBackwardWorkspaceBytes(DeviceKind::kCpu, 1000, kC), 0);
}

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
