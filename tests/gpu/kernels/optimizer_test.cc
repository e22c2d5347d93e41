// AdamW and SGD on the GPU against the CPU op (kernels/optimizer.h) on the same inputs:
// several steps in a row (bias correction moving), weight decay, a gradient scale, gradients
// in f32/bf16/f16, and every master storage: f32 alone, with a bf16 / f16 / stochastically
// rounded bf16 copy, and a split master.
#if ZT_HAVE_CUDA

#include "kernels/optimizer.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/kernels/master_twin.h"
#include "tests/gpu/kernels/twin.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using gpu_test::GpuStream;
using gpu_test::MasterMode;
using gpu_test::MasterTwin;
using gpu_test::NormalizedError;
using gpu_test::Twin;
using testing::RandomVector;

// Each element runs the CPU's f32 expression; the two compilers may fuse a multiply-add
// differently (and bias corrections are the same f32 values), so an element differs by a few
// f32 ulps per step, compounding over kSteps steps to ~1e-7 relative: 1e-6 for the f32
// master, m, v and momentum. 16-bit copies: gpu_test::CopyBound.
constexpr double kF32Bound = 1e-6;

constexpr int64_t kN = 100003;  // a partial last block
constexpr int kSteps = 5;

struct Case {
  DType grad;
  MasterMode master;
};

std::string Name(const Case& c) {
  return std::string("grad_") + DTypeName(c.grad) + "_" + gpu_test::MasterModeName(c.master);
}

class OptimizerGpuTest : public ::testing::TestWithParam<Case> {};

TEST_P(OptimizerGpuTest, AdamWMatchesTheCpuOpOverSteps) {
  ZT_SKIP_WITHOUT_GPU();
  const Case k = GetParam();
  MasterTwin p(k.master, RandomVector(kN, 1));
  Twin m = Twin::Floats(std::vector<float>(kN), DType::kF32, {kN});
  Twin v = Twin::Floats(std::vector<float>(kN), DType::kF32, {kN});
  GpuStream stream;
  for (int step = 1; step <= kSteps; ++step) {
    Twin grad = Twin::Floats(RandomVector(kN, 100 + step, -2.0f, 2.0f), k.grad, {kN});
    AdamWArgs args{.lr = 1e-2f,
                   .weight_decay = 0.1f,
                   .step = step,
                   .grad_scale = 0.5f,
                   .stochastic_rounding = p.stochastic(),
                   .seed = 77u + step};
    for (bool gpu : {false, true}) {
      args.param = p.param.on(gpu);
      args.param_copy = p.copy.on(gpu);
      args.grad = grad.on(gpu);
      args.m = m.on(gpu);
      args.v = v.on(gpu);
      const absl::Status s = AdamWUpdate(gpu ? gpu_test::CudaContext(stream) : CpuContext(1), args);
      ASSERT_TRUE(s.ok()) << s;
    }
    ASSERT_EQ(stream.Sync(), cudaSuccess);
  }
  gpu_test::ExpectSameMaster(p, kF32Bound);
  EXPECT_LT(NormalizedError(m.GpuFloats(), m.CpuFloats()), kF32Bound);
  EXPECT_LT(NormalizedError(v.GpuFloats(), v.CpuFloats()), kF32Bound);
}

TEST_P(OptimizerGpuTest, SgdMatchesTheCpuOpOverSteps) {
  ZT_SKIP_WITHOUT_GPU();
  const Case k = GetParam();
  for (float mu : {0.0f, 0.9f}) {
    MasterTwin p(k.master, RandomVector(kN, 2));
    Twin buf = mu == 0.0f ? Twin() : Twin::Floats(std::vector<float>(kN), DType::kF32, {kN});
    GpuStream stream;
    for (int step = 1; step <= kSteps; ++step) {
      Twin grad = Twin::Floats(RandomVector(kN, 200 + step, -2.0f, 2.0f), k.grad, {kN});
      SgdArgs args{.lr = 1e-2f,
                   .momentum_factor = mu,
                   .weight_decay = 0.1f,
                   .grad_scale = 0.5f,
                   .stochastic_rounding = p.stochastic(),
                   .seed = 99u + step};
      for (bool gpu : {false, true}) {
        args.param = p.param.on(gpu);
        args.param_copy = p.copy.on(gpu);
        args.grad = grad.on(gpu);
        args.momentum = buf.on(gpu);
        const absl::Status s = SgdUpdate(gpu ? gpu_test::CudaContext(stream) : CpuContext(1), args);
        ASSERT_TRUE(s.ok()) << s;
      }
      ASSERT_EQ(stream.Sync(), cudaSuccess);
    }
    SCOPED_TRACE(mu);
    gpu_test::ExpectSameMaster(p, kF32Bound);
    if (mu != 0.0f) EXPECT_LT(NormalizedError(buf.GpuFloats(), buf.CpuFloats()), kF32Bound);
  }
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (DType g : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (MasterMode m : gpu_test::AllMasterModes()) cases.push_back({g, m});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, OptimizerGpuTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return Name(info.param); });

TEST(OptimizerGpuTest, AdamWRefusesAStep0) {
  // Runs without a GPU: the hyperparameters are checked before any CUDA call.
  std::vector<float> x(16);
  DeviceContext ctx;
  ctx.device = gpu_test::Gpu0();
  const Tensor t(x.data(), DType::kF32, {16}, ctx.device);
  const absl::Status s = AdamWUpdate(ctx, {.param = t, .grad = t, .m = t, .v = t, .step = 0});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
