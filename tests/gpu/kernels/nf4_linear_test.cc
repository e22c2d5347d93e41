// Nf4LinearForward and Nf4LinearBackward on the GPU against the CPU op (kernels/nf4_linear.h):
// the same NF4 buffers (double-quantized, f32 absmax, and a tensor-parallel share indexing its
// whole weight's group scales) on both sides, f32 and bf16
// activations, partial tiles on both axes, bias, and dinp accumulated. The dequantized tiles
// agree bit for bit; what differs is the GEMM's summation order (cuBLASLt against oneDNN), so
// results compare by normalized error: 1e-5 for f32 outputs (sums of K ≤ 600 products, ~1e-7
// each way), and a bf16 output's half ulp (2^-9 relative, 4e-3) where rounding may fall on
// either side of a tie.
#if ZT_HAVE_CUDA

#include "kernels/nf4_linear.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/nf4.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/kernels/mixed_check.h"
#include "tests/unit/kernels/nf4_buffers.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::GpuStream;
using gpu_test::HostFloats;
using gpu_test::NormalizedError;
using gpu_test::ToDevice;
using gpu_test::ToHostFloats;
using testing::Nf4Buffers;
using testing::RandomVector;
using testing::Stored;

struct Case {
  int64_t m, k, n;
  Nf4Absmax format;
  DType act;  // inp, out, dout, dinp
};

std::string Name(const Case& c) {
  return std::to_string(c.m) + "x" + std::to_string(c.k) + "x" + std::to_string(c.n) + "_" +
         (c.format == Nf4Absmax::kF32            ? "f32absmax"
          : c.format == Nf4Absmax::kGroupIndexed ? "groupindexed"
                                                 : "doublequant") +
         "_" + DTypeName(c.act);
}

double Bound(DType out) { return out == DType::kF32 ? 1e-5 : 4e-3; }

// The NF4 weight on the device: each buffer copied.
struct DeviceNf4 {
  explicit DeviceNf4(Nf4Buffers& host) {
    const Nf4Tensor h = host.View();
    t = {.numel = h.numel, .format = h.format, .share = h.share};
    t.codes = ToDevice(h.codes, codes);
    t.absmax = ToDevice(h.absmax, absmax);
    t.absmax_scale = ToDevice(h.absmax_scale, scale);
    t.absmax_offset = ToDevice(h.absmax_offset, offset);
    t.block_base = ToDevice(h.block_base, block_base);
  }
  Nf4Tensor t;
  DeviceBuffer codes, absmax, scale, offset, block_base;
};

class Nf4LinearGpuTest : public ::testing::TestWithParam<Case> {};

TEST_P(Nf4LinearGpuTest, ForwardAndBackwardMatchTheCpuOp) {
  ZT_SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  // kGroupIndexed: W is the right half of the columns of a (n, 2k) weight quantized whole, its
  // consecutive blocks in different groups of the whole weight.
  const bool share = c.format == Nf4Absmax::kGroupIndexed;
  const int64_t whole_cols = share ? 2 * c.k : c.k;
  std::vector<float> w = RandomVector(c.n * whole_cols, 1, -0.1f, 0.1f);
  Nf4Buffers whole(c.n * whole_cols, share ? Nf4Absmax::kDoubleQuantized : c.format);
  ASSERT_TRUE(Nf4Quantize(CpuContext(2), {.src = Tensor(w.data(), DType::kF32, {c.n * whole_cols}),
                                          .dst = whole.View()})
                  .ok());
  Nf4Buffers q = share ? testing::Nf4ShareOf(whole, whole_cols, 0, c.n, c.k, c.k) : whole;
  Stored inp(RandomVector(c.m * c.k, 2), c.act), bias(RandomVector(c.n, 3), DType::kF32);
  Stored dout(RandomVector(c.m * c.n, 4), c.act), dinp(RandomVector(c.m * c.k, 5), c.act);
  Stored out(std::vector<float>(c.m * c.n), c.act);
  const LinearDTypes dtypes{.inp = c.act, .out = c.act, .dout = c.act, .dinp = c.act};

  std::vector<uint8_t> cpu_ws(
      Nf4LinearWorkspaceBytes(CpuContext(2), c.m, c.k, c.n, dtypes).value());
  DeviceContext cpu = CpuContext(2);
  cpu.workspace = {.data = cpu_ws.data(), .bytes = static_cast<int64_t>(cpu_ws.size())};
  GpuStream stream;
  DeviceBuffer gpu_ws(
      Nf4LinearWorkspaceBytes(gpu_test::CudaContext(stream), c.m, c.k, c.n, dtypes).value());
  const DeviceContext gpu = gpu_test::CudaContext(stream, gpu_ws.AsWorkspace());
  DeviceNf4 weight(q);
  DeviceBuffer inp_d, bias_d, out_d, dout_d, dinp_d;
  const Tensor inp_g = ToDevice(inp.View({c.m, c.k}), inp_d);
  const Tensor bias_g = ToDevice(bias.View({c.n}), bias_d);
  const Tensor out_g = ToDevice(out.View({c.m, c.n}), out_d);
  const Tensor dout_g = ToDevice(dout.View({c.m, c.n}), dout_d);
  const Tensor dinp_g = ToDevice(dinp.View({c.m, c.k}), dinp_d);

  ASSERT_TRUE(Nf4LinearForward(cpu, {.inp = inp.View({c.m, c.k}),
                                     .weight = q.View(),
                                     .bias = bias.View({c.n}),
                                     .out = out.View({c.m, c.n})})
                  .ok());
  ASSERT_TRUE(
      Nf4LinearForward(gpu, {.inp = inp_g, .weight = weight.t, .bias = bias_g, .out = out_g}).ok());
  EXPECT_LT(NormalizedError(ToHostFloats(out_g), HostFloats(out.View({c.m, c.n}))), Bound(c.act));

  // dinp += dout · W (accumulating onto the same random start on both sides).
  ASSERT_TRUE(Nf4LinearBackward(cpu, {.dout = dout.View({c.m, c.n}),
                                      .weight = q.View(),
                                      .dinp = dinp.View({c.m, c.k}),
                                      .dinp_mode = Accumulate::kAdd})
                  .ok());
  ASSERT_TRUE(
      Nf4LinearBackward(
          gpu, {.dout = dout_g, .weight = weight.t, .dinp = dinp_g, .dinp_mode = Accumulate::kAdd})
          .ok());
  EXPECT_LT(NormalizedError(ToHostFloats(dinp_g), HostFloats(dinp.View({c.m, c.k}))), Bound(c.act));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Nf4LinearGpuTest,
    ::testing::Values(Case{7, 600, 1100, Nf4Absmax::kDoubleQuantized, DType::kF32},
                      Case{7, 200, 300, Nf4Absmax::kF32, DType::kF32},
                      Case{7, 512, 300, Nf4Absmax::kGroupIndexed, DType::kF32},
                      Case{64, 256, 384, Nf4Absmax::kGroupIndexed, DType::kBF16},
                      Case{64, 256, 384, Nf4Absmax::kDoubleQuantized, DType::kBF16},
                      Case{1, 70, 129, Nf4Absmax::kDoubleQuantized, DType::kF32}),
    [](const ::testing::TestParamInfo<Case>& info) { return Name(info.param); });

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
