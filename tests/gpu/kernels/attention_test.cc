// AttentionForward and AttentionBackward on the GPU against the CPU op (kernels/attention.h)
// on the same inputs: sequence lengths that are not a multiple of the 64-row tile (1, 37, 129)
// and one that is (256), causal masking across tiles, GQA and MQA (H = 8 with Hkv = 8, 2, 1),
// head sizes 64 and 128, f32/bf16/f16 storage. The forward's output and log-sum-exp and the
// backward's dq, dk, dv are each compared; the backward is also run twice and must agree bit
// for bit (the CUDA kernels use no atomics).
#if ZT_HAVE_CUDA

#include "kernels/attention.h"

#include <cmath>
#include <cstring>
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
using gpu_test::ToHostBytes;
using gpu_test::ToHostFloats;

struct Case {
  DType dtype;
  int head_dim;
  int seq;
  int n_kv_head;
};

constexpr int kB = 2, kH = 8;

// One ulp at the bottom of a binade, relative: the most one rounding flip can move an
// element, relative to the element (bf16 has 8 significant bits, f16 11).
double UlpRelative(DType dtype) {
  return dtype == DType::kBF16 ? 0x1p-7 : dtype == DType::kF16 ? 0x1p-10 : 0.0;
}

// ‖gpu − cpu‖₂ over the elements of one part (q, k or v columns) of a packed dqkv, divided by
// ‖cpu‖₂ of the whole dqkv. Normalizing by the whole buffer keeps parts that are pure noise
// meaningful: at T = 1 the softmax has one entry, dS is 0 up to rounding and so are dq and dk,
// whose own norm would turn two noise vectors into an O(1) "error". A wrong index or a missing
// term in one part still shows as a large fraction of the whole.
double PartError(const std::vector<float>& gpu, const std::vector<float>& cpu, int64_t row,
                 int64_t col0, int64_t cols) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    ref += static_cast<double>(cpu[i]) * cpu[i];
    const int64_t col = static_cast<int64_t>(i) % row;
    if (col < col0 || col >= col0 + cols) continue;
    const double d = static_cast<double>(gpu[i]) - cpu[i];
    diff += d * d;
  }
  if (!std::isfinite(diff)) return INFINITY;
  return ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

class AttentionGpuTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionGpuTest, MatchesTheCpuOp) {
  ZT_SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  const int T = c.seq, D = c.head_dim, Hkv = c.n_kv_head;
  const int64_t row = int64_t{kH + 2 * Hkv} * D;  // C3
  const int64_t out_row = int64_t{kH} * D;        // CO
  // Entries up to ±1.5 spread the scores over a few units, so the softmax is far from uniform
  // and the online rescaling across key tiles matters (as in the CPU op's own test).
  testing::Stored qkv(testing::RandomVector(kB * T * row, 11, -1.5f, 1.5f), c.dtype);
  testing::Stored dout(testing::RandomVector(kB * T * out_row, 12), c.dtype);
  testing::Stored cpu_out(kB * T * out_row, c.dtype);
  testing::Stored cpu_dqkv(kB * T * row, c.dtype);
  std::vector<float> cpu_lse(kB * kH * T);

  const Tensor h_qkv = qkv.View({kB, T, row});
  const Tensor h_out = cpu_out.View({kB, T, out_row});
  const Tensor h_lse(cpu_lse.data(), DType::kF32, {kB, kH, T});
  const Tensor h_dout = dout.View({kB, T, out_row});
  const Tensor h_dqkv = cpu_dqkv.View({kB, T, row});
  ASSERT_TRUE(
      AttentionForward(CpuContext(2),
                       {.qkv = h_qkv, .out = h_out, .lse = h_lse, .n_head = kH, .n_kv_head = Hkv})
          .ok());
  ASSERT_TRUE(AttentionBackward(CpuContext(2), {.qkv = h_qkv,
                                                .out = h_out,
                                                .lse = h_lse,
                                                .dout = h_dout,
                                                .dqkv = h_dqkv,
                                                .n_head = kH,
                                                .n_kv_head = Hkv})
                  .ok());

  // The GPU forward writes its own out and lse; its backward reads the CPU's (identical inputs
  // for the backward, so its comparison does not inherit the forward's differences).
  DeviceBuffer qkv_mem, out_mem, lse_mem, cpu_out_mem, cpu_lse_mem, dout_mem, dqkv_mem;
  const Tensor d_qkv = ToDevice(h_qkv, qkv_mem);
  const Tensor d_out = ToDevice(h_out, out_mem);  // overwritten by the GPU forward
  const Tensor d_lse = ToDevice(h_lse, lse_mem);  // overwritten by the GPU forward
  const Tensor d_cpu_out = ToDevice(h_out, cpu_out_mem);
  const Tensor d_cpu_lse = ToDevice(h_lse, cpu_lse_mem);
  const Tensor d_dout = ToDevice(h_dout, dout_mem);
  const Tensor d_dqkv = ToDevice(h_dqkv, dqkv_mem);  // overwritten (=) by the GPU backward
  // cudaMemcpy from pageable memory may return before its DMA has landed, and the op's
  // non-blocking stream does not wait for it: let the uploads finish first.
  ZT_ASSERT_CUDA(cudaDeviceSynchronize());
  GpuStream stream;
  DeviceBuffer workspace(AttentionWorkspaceBytes(DeviceKind::kCuda, kB, T, kH));
  const DeviceContext ctx = gpu_test::CudaContext(stream, workspace.AsWorkspace());
  ASSERT_TRUE(AttentionForward(
                  ctx, {.qkv = d_qkv, .out = d_out, .lse = d_lse, .n_head = kH, .n_kv_head = Hkv})
                  .ok());
  const AttentionBackwardArgs backward{.qkv = d_qkv,
                                       .out = d_cpu_out,
                                       .lse = d_cpu_lse,
                                       .dout = d_dout,
                                       .dqkv = d_dqkv,
                                       .n_head = kH,
                                       .n_kv_head = Hkv};
  ASSERT_TRUE(AttentionBackward(ctx, backward).ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  const std::vector<uint8_t> first_dqkv = ToHostBytes(d_dqkv);
  const std::vector<float> gpu_dqkv = ToHostFloats(d_dqkv);

  // Forward. Both compute in f32 from the same stored inputs and differ by the order of the
  // dot products' and P·V's sums and by exp (Cephes' ~2 ulp on the CPU, CUDA's expf ≤ 2 ulp):
  // relative differences of a few 1e-7 per element, so 1e-5 for f32. A 16-bit output is each
  // side's f32 value rounded once; where the f32 values straddle a rounding boundary the two
  // differ by one 16-bit ulp, and even if every element did, the normalized error would stay
  // under UlpRelative. lse is f32 for every dtype, with the f32 bound.
  const double out_bound = 1e-5 + UlpRelative(c.dtype);
  EXPECT_LT(NormalizedError(ToHostFloats(d_out), HostFloats(h_out)), out_bound);
  EXPECT_LT(NormalizedError(ToHostFloats(d_lse), cpu_lse), 1e-5);

  // Backward. dS = P ∘ (dP − Di) subtracts two sums of similar size, so the f32 summation
  // differences (a few 1e-7 of dP's magnitude) become a few 1e-6 of dS's, and dq, dk sum 64 to
  // 256 such terms: 1e-4 for f32; a 16-bit gradient adds one rounding flip as above.
  const double grad_bound = 1e-4 + UlpRelative(c.dtype);
  const std::vector<float> want = HostFloats(h_dqkv);
  EXPECT_LT(PartError(gpu_dqkv, want, row, 0, int64_t{kH} * D), grad_bound) << "dq";
  EXPECT_LT(PartError(gpu_dqkv, want, row, int64_t{kH} * D, int64_t{Hkv} * D), grad_bound) << "dk";
  EXPECT_LT(PartError(gpu_dqkv, want, row, int64_t{kH + Hkv} * D, int64_t{Hkv} * D), grad_bound)
      << "dv";

  // Deterministic: a second run gives the same bits.
  ASSERT_EQ(
      cudaMemsetAsync(d_dqkv.raw(), 0xff, static_cast<size_t>(d_dqkv.size_bytes()), stream.get()),
      cudaSuccess);
  ASSERT_TRUE(AttentionBackward(ctx, backward).ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  EXPECT_TRUE(ToHostBytes(d_dqkv) == first_dqkv);
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int d : {64, 128}) {
      for (int t : {1, 37, 129, 256}) {
        for (int hkv : {8, 2, 1}) cases.push_back({dtype, d, t, hkv});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, AttentionGpuTest, ::testing::ValuesIn(Cases()), [](const auto& info) {
  const Case& c = info.param;
  return std::string(DTypeName(c.dtype)) + "_D" + std::to_string(c.head_dim) + "_T" +
         std::to_string(c.seq) + "_Hkv" + std::to_string(c.n_kv_head);
});

// The checks below run without a GPU: each is refused before any CUDA call.

TEST(AttentionGpuArgsTest, RefusesATensorOnAnotherDevice) {
  std::vector<float> x(2 * 3 * 4 * 64), out(2 * 3 * 2 * 64), lse(2 * 2 * 3);
  DeviceContext ctx;
  ctx.device = gpu_test::Gpu0();
  const absl::Status s = AttentionForward(
      ctx, {.qkv = Tensor(x.data(), DType::kF32, {2, 3, 4 * 64}),
            .out = Tensor(out.data(), DType::kF32, {2, 3, 2 * 64}, gpu_test::Gpu0()),
            .lse = Tensor(lse.data(), DType::kF32, {2, 2, 3}, gpu_test::Gpu0()),
            .n_head = 2,
            .n_kv_head = 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("qkv is on cpu:0"), std::string_view::npos) << s;
}

// Host memory labelled as device 0: the op refuses before it would touch it.
struct GpuLabelled {
  int64_t T, D, heads, H;
  std::vector<float> qkv, out, lse, dout, dqkv;
  GpuLabelled(int64_t t, int64_t d, int h, int hkv)
      : T(t),
        D(d),
        heads(h + 2 * hkv),
        H(h),
        qkv(2 * t * (h + 2 * hkv) * d),
        out(2 * t * h * d),
        lse(2 * h * t),
        dout(out.size()),
        dqkv(qkv.size()) {}
  Tensor Qkv() { return Tensor(qkv.data(), DType::kF32, {2, T, heads * D}, gpu_test::Gpu0()); }
  Tensor Out() { return Tensor(out.data(), DType::kF32, {2, T, H * D}, gpu_test::Gpu0()); }
  Tensor Lse() { return Tensor(lse.data(), DType::kF32, {2, H, T}, gpu_test::Gpu0()); }
  Tensor Dout() { return Tensor(dout.data(), DType::kF32, {2, T, H * D}, gpu_test::Gpu0()); }
  Tensor Dqkv() { return Tensor(dqkv.data(), DType::kF32, {2, T, heads * D}, gpu_test::Gpu0()); }
};

TEST(AttentionGpuArgsTest, BackwardRefusesAWorkspaceSmallerThanItsSize) {
  GpuLabelled m(5, 64, 4, 2);
  DeviceContext ctx;
  ctx.device = gpu_test::Gpu0();
  ctx.workspace = Workspace{.data = nullptr, .bytes = 16};
  const absl::Status s = AttentionBackward(ctx, {.qkv = m.Qkv(),
                                                 .out = m.Out(),
                                                 .lse = m.Lse(),
                                                 .dout = m.Dout(),
                                                 .dqkv = m.Dqkv(),
                                                 .n_head = 4,
                                                 .n_kv_head = 2});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  // (B, H, T) f32 = 2 · 4 · 5 · 4 bytes.
  EXPECT_EQ(AttentionWorkspaceBytes(DeviceKind::kCuda, 2, 5, 4), 160);
  EXPECT_NE(s.message().find("needs 160"), std::string_view::npos) << s;
  EXPECT_EQ(AttentionWorkspaceBytes(DeviceKind::kCpu, 2, 5, 4), 0);
}

TEST(AttentionGpuArgsTest, RefusesAHeadSizeTheKernelDoesNotHave) {
  GpuLabelled m(5, 32, 4, 2);
  DeviceContext ctx;
  ctx.device = gpu_test::Gpu0();
  const absl::Status s = AttentionForward(
      ctx, {.qkv = m.Qkv(), .out = m.Out(), .lse = m.Lse(), .n_head = 4, .n_kv_head = 2});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("D = 32; the CUDA kernel supports D = 64 and D = 128"),
            std::string_view::npos)
      << s;
}

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
