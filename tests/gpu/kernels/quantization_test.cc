// BlockQuantize and BlockDequantize on the GPU against the CPU op (kernels/quantization.h):
// the same codes and absmax values byte for byte, and the same dequantized floats bit for bit,
// for both maps, block sizes 64 and 2048, a partial last block, an all-zero block, values
// spread over seven decades, every map value and every threshold with its neighbours, and
// NaN and infinity.
#if ZT_HAVE_CUDA

#include "kernels/quantization.h"

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/quantization.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/kernels/twin.h"

namespace zt {
namespace {

using gpu_test::GpuStream;
using gpu_test::Twin;

struct Case {
  DynamicMap map;
  int64_t block;
};

// Values over seven decades with random signs (non-negative for the unsigned map), an
// all-zero block, then, in blocks that each start with 1.0 (so their absmax is 1 and the
// ratios are the values themselves), every map value, every threshold with its two f32
// neighbours, signed zero, the least subnormal and NaNs of both signs; then a partial last
// block holding an infinity (ratios 0, and NaN for inf / inf).
std::vector<float> Inputs(const Case& k) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> exponent(-7.0, 0.0);
  std::bernoulli_distribution negative(k.map == DynamicMap::kSigned ? 0.5 : 0.0);
  std::vector<float> v;
  for (int64_t i = 0; i < 3 * k.block; ++i) {
    v.push_back(static_cast<float>((negative(rng) ? -3.0 : 3.0) * std::pow(10.0, exponent(rng))));
  }
  v.resize(v.size() + k.block, 0.0f);
  const float* values = cpu::MapValues(k.map);
  const cpu::CodeSearch& search = cpu::CodeSearchFor(k.map);
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> targeted(values, values + 256);
  for (int t = 0; t < 255; ++t) {
    const float x = search.thresholds[t];
    targeted.push_back(std::nextafter(x, -inf));
    targeted.push_back(x);
    targeted.push_back(std::nextafter(x, inf));
  }
  for (float x :
       {-0.0f, std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::quiet_NaN(),
        -std::numeric_limits<float>::quiet_NaN()}) {
    targeted.push_back(x);
  }
  for (size_t i = 0; i < targeted.size();) {
    v.push_back(1.0f);
    while (static_cast<int64_t>(v.size()) % k.block != 0 && i < targeted.size()) {
      v.push_back(targeted[i++]);
    }
    v.resize((v.size() + k.block - 1) / k.block * k.block, 0.5f);
  }
  for (float x : {37.0f, -inf, inf, 2.0f}) v.push_back(x);
  return v;
}

class QuantizationGpuTest : public ::testing::TestWithParam<Case> {};

TEST_P(QuantizationGpuTest, SameBytesAsTheCpuOp) {
  ZT_SKIP_WITHOUT_GPU();
  const Case k = GetParam();
  const std::vector<float> src = Inputs(k);
  const int64_t n = static_cast<int64_t>(src.size()), blocks = NumQuantBlocks(n, k.block);
  Twin x = Twin::Floats(src, DType::kF32, {n});
  Twin codes = Twin::Of(std::vector<uint8_t>(n, 0xAB), DType::kU8, {n});
  Twin absmax = Twin::Floats(std::vector<float>(blocks, -1.0f), DType::kF32, {blocks});
  Twin back = Twin::Floats(std::vector<float>(n), DType::kF32, {n});
  GpuStream stream;
  const DeviceContext gpu = gpu_test::CudaContext(stream);
  for (bool on_gpu : {false, true}) {
    const DeviceContext ctx = on_gpu ? gpu : CpuContext(1);
    ASSERT_TRUE(BlockQuantize(ctx, {.src = x.on(on_gpu),
                                    .codes = codes.on(on_gpu),
                                    .absmax = absmax.on(on_gpu),
                                    .block = k.block,
                                    .map = k.map})
                    .ok());
    ASSERT_TRUE(BlockDequantize(ctx, {.codes = codes.on(on_gpu),
                                      .absmax = absmax.on(on_gpu),
                                      .dst = back.on(on_gpu),
                                      .block = k.block,
                                      .map = k.map})
                    .ok());
  }
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  // Exact: the same f32 quotient against the CPU's own thresholds, and one f32 product back.
  const std::vector<uint8_t> gpu_codes = codes.GpuBytes();
  int differing = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (gpu_codes[i] != codes.CpuBytes()[i] && ++differing <= 10) {
      ADD_FAILURE() << "element " << i << " = " << src[i] << ": GPU code " << int{gpu_codes[i]}
                    << ", CPU code " << int{codes.CpuBytes()[i]};
    }
  }
  EXPECT_EQ(differing, 0);
  EXPECT_EQ(absmax.GpuBytes(), absmax.CpuBytes());
  EXPECT_EQ(back.GpuBytes(), back.CpuBytes());
}

INSTANTIATE_TEST_SUITE_P(
    All, QuantizationGpuTest,
    ::testing::Values(Case{DynamicMap::kSigned, 64}, Case{DynamicMap::kSigned, 2048},
                      Case{DynamicMap::kUnsigned, 64}, Case{DynamicMap::kUnsigned, 2048}),
    [](const auto& info) {
      return std::string(info.param.map == DynamicMap::kSigned ? "signed" : "unsigned") + "_block" +
             std::to_string(info.param.block);
    });

TEST(QuantizationGpuTest, RefusesABlockThatIsNotAPowerOfTwo) {
  // Runs without a GPU: the block size is checked before any CUDA call.
  std::vector<float> x(100), amax(2);
  std::vector<uint8_t> c(100);
  DeviceContext ctx;
  ctx.device = gpu_test::Gpu0();
  const absl::Status s =
      BlockQuantize(ctx, {.src = Tensor(x.data(), DType::kF32, {100}, ctx.device),
                          .codes = Tensor(c.data(), DType::kU8, {100}, ctx.device),
                          .absmax = Tensor(amax.data(), DType::kF32, {2}, ctx.device),
                          .block = 96});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("power of two"), std::string_view::npos) << s;
}

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
