// 8-bit AdamW on the GPU against the CPU op (kernels/adam8bit.h) on the same inputs, several
// steps in a row from the all-zero state: the states compared code for code (a bounded number
// of differences allowed, each one code or one flip's value gap: see kMaxFlips), their absmax
// values, the master and its copy, for gradients in f32/bf16/f16, every master storage, block sizes
// 64 and 2048 and a partial last block.
#if ZT_HAVE_CUDA

#include "kernels/adam8bit.h"

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/quantization.h"
#include "kernels/quantization.h"
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

constexpr int64_t kN = 100003;
constexpr int kSteps = 5;

// Codes: the GPU requantizes with the CPU's own map, thresholds and block maxima, so a code
// can differ only where the f32 m or v it quantizes differs (the two compilers may fuse
// β·old + (1 − β)·x differently: one or two ulps, ≤ 2^-22 relative, and usually not at all)
// and that moves it across a threshold. Neighbouring map values are at least ~1/40 of their
// magnitude apart (the signed map's top decade: 0.9/64 around 0.55), so a value lands that
// close to a threshold with probability ≲ 2 · 2^-22 · 40 ≈ 2e-5 per code and step: ≲ 20
// expected over 2 × 100 003 codes × 5 steps. Such a flip is one code. Later steps carry the
// difference as a value gap that only shrinks (×β each step): usually still one code, but an
// element whose state moves into a finer decade of the map may then sit a few codes apart for
// the same value gap. So each differing element must either be one code apart or dequantize
// (with the CPU's absmax) within kMaxGap of the CPU's value: the flip's one map step (≤ 1/64
// of the absmax) plus the two sides' rounding to the nearer code (≤ another). kMaxFlips =
// 0.1% of the codes is ~10× the expectation; a wrong map, threshold, block layout or absmax
// moves far more codes, and by more than that.
constexpr int64_t kMaxFlips = 2 * kN / 1000;
constexpr double kMaxGap = 2.0 / 64;
// A flipped code is a state off by one map step (≤ 1/64 of the block's absmax); it moves its
// parameter's update m̂/(√v̂ + ε) ≈ ±1 by ~1.5%, i.e. the parameter by lr · 1.5% = 1.5e-4.
// kMaxFlips such elements against ‖master‖ ≈ 0.58 · √100 003 ≈ 183 give
// √200 · 1.5e-4 / 183 ≈ 1.2e-5 in norm; every other element agrees to f32 ulps. 3e-5.
constexpr double kMasterBound = 3e-5;
// absmax values are maxima of the same f32 states, so equal to a few ulps (relative 1e-5
// allows them), except in a block whose maximum comes from an element with a flipped code:
// off by at most one map step, 1/64 of the absmax. At most kMaxOffBlocks such blocks per
// state (a flip at a block's maximum is rarer than the flips by ~1/block).
constexpr double kAbsmaxUlps = 1e-5;
constexpr double kAbsmaxStep = 1.0 / 64;
constexpr int kMaxOffBlocks = 1;
// 16-bit copies: gpu_test::CopyBound.

struct Case {
  DType grad;
  MasterMode master;
  int64_t block;
};

std::string Name(const Case& c) {
  return std::string("grad_") + DTypeName(c.grad) + "_" + gpu_test::MasterModeName(c.master) +
         "_block" + std::to_string(c.block);
}

// The number of codes that differ, failing on any more than one code apart whose values (the
// map's, times the CPU's absmax of the block) are more than kMaxGap · absmax apart.
int64_t CodeDifferences(const std::vector<uint8_t>& gpu, const std::vector<uint8_t>& cpu,
                        DynamicMap map, const std::vector<float>& absmax, int64_t block,
                        const char* what) {
  const float* values = cpu::MapValues(map);
  int64_t differing = 0;
  for (size_t i = 0; i < gpu.size() && i < cpu.size(); ++i) {
    if (gpu[i] == cpu[i]) continue;
    ++differing;
    const double a = absmax[i / block];
    const double gap = std::fabs(static_cast<double>(values[gpu[i]]) - values[cpu[i]]) * a;
    if (std::abs(int{gpu[i]} - int{cpu[i]}) > 1 && gap > kMaxGap * a) {
      ADD_FAILURE() << what << " element " << i << ": GPU code " << int{gpu[i]} << ", CPU code "
                    << int{cpu[i]} << ", " << gap / a << " of the block's absmax apart";
      return differing;
    }
  }
  return differing;
}

// The number of blocks whose absmax differs by more than kAbsmaxUlps (relative), failing on
// any that differs by more than one map step.
int BlocksOff(const std::vector<float>& gpu, const std::vector<float>& cpu, const char* what) {
  int off = 0;
  for (size_t b = 0; b < gpu.size() && b < cpu.size(); ++b) {
    const double d = std::fabs(static_cast<double>(gpu[b]) - cpu[b]);
    if (d <= kAbsmaxUlps * std::fabs(cpu[b])) continue;
    ++off;
    EXPECT_LE(d, kAbsmaxStep * std::fabs(cpu[b]))
        << what << " block " << b << ": GPU " << gpu[b] << ", CPU " << cpu[b];
  }
  return off;
}

class AdamW8bitGpuTest : public ::testing::TestWithParam<Case> {};

TEST_P(AdamW8bitGpuTest, StatesMatchTheCpuOpOverSteps) {
  ZT_SKIP_WITHOUT_GPU();
  const Case k = GetParam();
  const int64_t blocks = NumQuantBlocks(kN, k.block);
  MasterTwin p(k.master, RandomVector(kN, 1));
  Twin m_codes = Twin::Of(std::vector<uint8_t>(kN, 0), DType::kU8, {kN});
  Twin v_codes = Twin::Of(std::vector<uint8_t>(kN, 0), DType::kU8, {kN});
  Twin m_absmax = Twin::Floats(std::vector<float>(blocks), DType::kF32, {blocks});
  Twin v_absmax = Twin::Floats(std::vector<float>(blocks), DType::kF32, {blocks});
  GpuStream stream;
  for (int step = 1; step <= kSteps; ++step) {
    Twin grad = Twin::Floats(RandomVector(kN, 300 + step, -2.0f, 2.0f), k.grad, {kN});
    AdamW8bitArgs args{.block = k.block,
                       .lr = 1e-2f,
                       .weight_decay = 0.1f,
                       .step = step,
                       .grad_scale = 0.5f,
                       .stochastic_rounding = p.stochastic(),
                       .seed = 55u + step};
    for (bool gpu : {false, true}) {
      args.param = p.param.on(gpu);
      args.param_copy = p.copy.on(gpu);
      args.grad = grad.on(gpu);
      args.m_codes = m_codes.on(gpu);
      args.m_absmax = m_absmax.on(gpu);
      args.v_codes = v_codes.on(gpu);
      args.v_absmax = v_absmax.on(gpu);
      const absl::Status s =
          AdamW8bitUpdate(gpu ? gpu_test::CudaContext(stream) : CpuContext(1), args);
      ASSERT_TRUE(s.ok()) << s;
    }
    ASSERT_EQ(stream.Sync(), cudaSuccess);
  }
  const int64_t flips = CodeDifferences(m_codes.GpuBytes(), m_codes.CpuBytes(), DynamicMap::kSigned,
                                        m_absmax.CpuFloats(), k.block, "m") +
                        CodeDifferences(v_codes.GpuBytes(), v_codes.CpuBytes(),
                                        DynamicMap::kUnsigned, v_absmax.CpuFloats(), k.block, "v");
  EXPECT_LE(flips, kMaxFlips);
  EXPECT_LE(BlocksOff(m_absmax.GpuFloats(), m_absmax.CpuFloats(), "m_absmax"), kMaxOffBlocks);
  EXPECT_LE(BlocksOff(v_absmax.GpuFloats(), v_absmax.CpuFloats(), "v_absmax"), kMaxOffBlocks);
  gpu_test::ExpectSameMaster(p, kMasterBound);
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (DType g : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (MasterMode m : gpu_test::AllMasterModes()) cases.push_back({g, m, 2048});
  }
  cases.push_back({DType::kF32, MasterMode::kF32, 64});
  cases.push_back({DType::kBF16, MasterMode::kSplit, 64});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, AdamW8bitGpuTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return Name(info.param); });

TEST(AdamW8bitGpuTest, RefusesAbsmaxOfTheWrongLength) {
  // Runs without a GPU: the buffers are checked before any CUDA call.
  std::vector<float> x(256), amax(3);
  std::vector<uint8_t> c(256);
  DeviceContext ctx;
  ctx.device = gpu_test::Gpu0();
  const Tensor f(x.data(), DType::kF32, {256}, ctx.device);
  const Tensor codes(c.data(), DType::kU8, {256}, ctx.device);
  const Tensor a(amax.data(), DType::kF32, {3}, ctx.device);
  const absl::Status s = AdamW8bitUpdate(ctx, {.param = f,
                                               .grad = f,
                                               .m_codes = codes,
                                               .m_absmax = a,
                                               .v_codes = codes,
                                               .v_absmax = a,
                                               .block = 128});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("one per block"), std::string_view::npos) << s;
}

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
