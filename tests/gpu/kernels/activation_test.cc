// GELU and SwiGLU on the GPU against the CPU op (kernels/activation.h) on the same inputs:
// forward and backward, f32/bf16/f16 storage (inputs and outputs in different dtypes too),
// sizes that leave partial blocks, GELU's dinp in place over dout.
#if ZT_HAVE_CUDA

#include "kernels/activation.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/kernels/twin.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using gpu_test::GpuStream;
using gpu_test::NormalizedError;
using gpu_test::Twin;
using testing::RandomVector;

// Elementwise: no sums, so the f32 results differ only where the GPU's expf (≤ 2 ulp) and
// the CPU's FastExp polynomial round differently, a few f32 ulps in the sigmoid and so in the
// result (~1e-7 relative); 1e-6 bounds it with room. A 16-bit result is the f32 value rounded
// once, off by one of its ulps (bf16 2^-8, f16 2^-11 relative) only where the f32 difference
// crosses a rounding boundary: the bounds are about one ulp over the whole buffer.
double Bound(DType out) { return out == DType::kF32 ? 1e-6 : (out == DType::kBF16 ? 4e-3 : 5e-4); }

struct Case {
  DType in, out;
};

class ActivationGpuTest : public ::testing::TestWithParam<Case> {};

// Inputs over [−6, 6]: both tails of the sigmoid and the region between.
constexpr float kLo = -6.0f, kHi = 6.0f;
constexpr int64_t kRows = 33, kF = 1000;  // 33 000 elements: a partial last block

TEST_P(ActivationGpuTest, GeluMatchesTheCpuOp) {
  ZT_SKIP_WITHOUT_GPU();
  const Case k = GetParam();
  Twin inp = Twin::Floats(RandomVector(kRows * kF, 3, kLo, kHi), k.in, {kRows, kF});
  Twin out = Twin::Floats(std::vector<float>(kRows * kF), k.out, {kRows, kF});
  Twin dout = Twin::Floats(RandomVector(kRows * kF, 4), k.in, {kRows, kF});
  Twin dinp = Twin::Floats(std::vector<float>(kRows * kF), k.out, {kRows, kF});
  GpuStream stream;
  const DeviceContext gpu = gpu_test::CudaContext(stream);
  ASSERT_TRUE(GeluForward(CpuContext(1), inp.cpu(), out.cpu()).ok());
  ASSERT_TRUE(GeluBackward(CpuContext(1), inp.cpu(), dout.cpu(), dinp.cpu()).ok());
  ASSERT_TRUE(GeluForward(gpu, inp.gpu(), out.gpu()).ok());
  ASSERT_TRUE(GeluBackward(gpu, inp.gpu(), dout.gpu(), dinp.gpu()).ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  EXPECT_LT(NormalizedError(out.GpuFloats(), out.CpuFloats()), Bound(k.out));
  EXPECT_LT(NormalizedError(dinp.GpuFloats(), dinp.CpuFloats()), Bound(k.out));
}

TEST_P(ActivationGpuTest, SwigluMatchesTheCpuOp) {
  ZT_SKIP_WITHOUT_GPU();
  const Case k = GetParam();
  Twin inp = Twin::Floats(RandomVector(kRows * 2 * kF, 5, kLo, kHi), k.in, {kRows, 2 * kF});
  Twin out = Twin::Floats(std::vector<float>(kRows * kF), k.out, {kRows, kF});
  Twin dout = Twin::Floats(RandomVector(kRows * kF, 6), k.in, {kRows, kF});
  Twin dinp = Twin::Floats(std::vector<float>(kRows * 2 * kF), k.out, {kRows, 2 * kF});
  GpuStream stream;
  const DeviceContext gpu = gpu_test::CudaContext(stream);
  ASSERT_TRUE(SwigluForward(CpuContext(1), inp.cpu(), out.cpu()).ok());
  ASSERT_TRUE(SwigluBackward(CpuContext(1), inp.cpu(), dout.cpu(), dinp.cpu()).ok());
  ASSERT_TRUE(SwigluForward(gpu, inp.gpu(), out.gpu()).ok());
  ASSERT_TRUE(SwigluBackward(gpu, inp.gpu(), dout.gpu(), dinp.gpu()).ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  EXPECT_LT(NormalizedError(out.GpuFloats(), out.CpuFloats()), Bound(k.out));
  EXPECT_LT(NormalizedError(dinp.GpuFloats(), dinp.CpuFloats()), Bound(k.out));
}

INSTANTIATE_TEST_SUITE_P(
    All, ActivationGpuTest,
    ::testing::Values(Case{DType::kF32, DType::kF32}, Case{DType::kBF16, DType::kBF16},
                      Case{DType::kF16, DType::kF16}, Case{DType::kBF16, DType::kF32},
                      Case{DType::kF32, DType::kF16}),
    [](const auto& info) {
      return std::string(DTypeName(info.param.in)) + "_to_" + DTypeName(info.param.out);
    });

TEST(ActivationGpuTest, GeluBackwardInPlaceOverDout) {
  ZT_SKIP_WITHOUT_GPU();
  constexpr int64_t kN = 5000;
  Twin inp = Twin::Floats(RandomVector(kN, 7, kLo, kHi), DType::kBF16, {kN});
  Twin grad = Twin::Floats(RandomVector(kN, 8), DType::kBF16, {kN});
  GpuStream stream;
  ASSERT_TRUE(GeluBackward(CpuContext(1), inp.cpu(), grad.cpu(), grad.cpu()).ok());
  ASSERT_TRUE(GeluBackward(gpu_test::CudaContext(stream), inp.gpu(), grad.gpu(), grad.gpu()).ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  EXPECT_LT(NormalizedError(grad.GpuFloats(), grad.CpuFloats()), Bound(DType::kBF16));
}

TEST(ActivationGpuTest, SwigluRefusesAnOddWidth) {
  // Runs without a GPU: the shape is checked before any CUDA call.
  std::vector<float> x(2 * 5), y(2 * 2);
  DeviceContext ctx;
  ctx.device = gpu_test::Gpu0();
  const absl::Status s = SwigluForward(ctx, Tensor(x.data(), DType::kF32, {2, 5}, ctx.device),
                                       Tensor(y.data(), DType::kF32, {2, 2}, ctx.device));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("must be even"), std::string_view::npos) << s;
}

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
