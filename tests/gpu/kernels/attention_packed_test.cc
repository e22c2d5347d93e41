// Packed rows (doc_starts) in AttentionForward and AttentionBackward on the GPU: against the
// CPU op on the same inputs (three documents with boundaries inside tiles in one row, two in
// the other, so tiles are skipped), and with every other document's keys and values NaN a
// document's output, log-sum-exp and gradients keep every bit. f32 storage: the two backends
// sum in different orders, so the comparison is the normalized error, 1e-5 (as the unpacked
// f32 attention's GPU test allows).
#if ZT_HAVE_CUDA

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::GpuStream;
using gpu_test::NormalizedError;
using gpu_test::ToDevice;
using gpu_test::ToHostFloats;
using testing::RandomVector;
using testing::SameBits;

constexpr int kB = 2, kT = 150, kH = 4, kHkv = 2, kD = 64;
constexpr int64_t kRow = int64_t{kH + 2 * kHkv} * kD, kOutRow = int64_t{kH} * kD;
// Row 0: documents of 70, 50 and 30 tokens; row 1: 100 and 50, padded with T.
const std::vector<int32_t> kStarts = {0, 70, 120, 0, 100, kT};

struct Host {
  std::vector<float> qkv, out, lse, dout, dqkv;
};

Host MakeHost(uint32_t seed) {
  return {RandomVector(kB * kT * kRow, seed, -1.5f, 1.5f), std::vector<float>(kB * kT * kOutRow),
          std::vector<float>(kB * kH * kT), RandomVector(kB * kT * kOutRow, seed + 1),
          std::vector<float>(kB * kT * kRow)};
}

AttentionForwardArgs ForwardArgs(Host& h, std::vector<int32_t>& starts) {
  return {.qkv = Tensor(h.qkv.data(), DType::kF32, {kB, kT, kRow}),
          .out = Tensor(h.out.data(), DType::kF32, {kB, kT, kOutRow}),
          .lse = Tensor(h.lse.data(), DType::kF32, {kB, kH, kT}),
          .n_head = kH,
          .n_kv_head = kHkv,
          .doc_starts = Tensor(starts.data(), DType::kI32, {kB, 3})};
}

AttentionBackwardArgs BackwardArgs(const AttentionForwardArgs& f, Host& h) {
  return {.qkv = f.qkv,
          .out = f.out,
          .lse = f.lse,
          .dout = Tensor(h.dout.data(), DType::kF32, {kB, kT, kOutRow}),
          .dqkv = Tensor(h.dqkv.data(), DType::kF32, {kB, kT, kRow}),
          .n_head = kH,
          .n_kv_head = kHkv,
          .doc_starts = f.doc_starts};
}

// Runs forward and backward on the GPU and returns out, lse and dqkv.
struct GpuResult {
  std::vector<float> out, lse, dqkv;
};
GpuResult RunOnGpu(Host& h, std::vector<int32_t>& starts) {
  GpuStream stream;
  DeviceBuffer qkv, out, lse, dout, dqkv, doc;
  const AttentionForwardArgs host_f = ForwardArgs(h, starts);
  const AttentionBackwardArgs host_b = BackwardArgs(host_f, h);
  const AttentionForwardArgs f{.qkv = ToDevice(host_f.qkv, qkv),
                               .out = ToDevice(host_f.out, out),
                               .lse = ToDevice(host_f.lse, lse),
                               .n_head = kH,
                               .n_kv_head = kHkv,
                               .doc_starts = ToDevice(host_f.doc_starts, doc)};
  const AttentionBackwardArgs b{.qkv = f.qkv,
                                .out = f.out,
                                .lse = f.lse,
                                .dout = ToDevice(host_b.dout, dout),
                                .dqkv = ToDevice(host_b.dqkv, dqkv),
                                .n_head = kH,
                                .n_kv_head = kHkv,
                                .doc_starts = f.doc_starts};
  DeviceBuffer ws(AttentionWorkspaceBytes(DeviceKind::kCuda, kB, kT, kH));
  const DeviceContext ctx = gpu_test::CudaContext(stream, ws.AsWorkspace());
  EXPECT_TRUE(AttentionForward(ctx, f).ok());
  EXPECT_TRUE(AttentionBackward(ctx, b).ok());
  return {ToHostFloats(f.out), ToHostFloats(f.lse), ToHostFloats(b.dqkv)};
}

TEST(PackedAttentionGpuTest, MatchesTheCpuOp) {
  ZT_SKIP_WITHOUT_GPU();
  Host h = MakeHost(1);
  std::vector<int32_t> starts = kStarts;
  const GpuResult gpu = RunOnGpu(h, starts);
  const AttentionForwardArgs f = ForwardArgs(h, starts);
  ASSERT_TRUE(AttentionForward(CpuContext(2), f).ok());
  ASSERT_TRUE(AttentionBackward(CpuContext(2), BackwardArgs(f, h)).ok());
  EXPECT_LT(NormalizedError(gpu.out, h.out), 1e-5);
  EXPECT_LT(NormalizedError(gpu.lse, h.lse), 1e-5);
  EXPECT_LT(NormalizedError(gpu.dqkv, h.dqkv), 1e-5);
}

TEST(PackedAttentionGpuTest, NoReadAcrossADocumentBoundary) {
  ZT_SKIP_WITHOUT_GPU();
  Host clean = MakeHost(2);
  Host poisoned = clean;
  const int first = 70, last = 120;  // document 1 of row 0
  for (int b = 0; b < kB; ++b) {
    for (int t = 0; t < kT; ++t) {
      if (b == 0 && t >= first && t < last) continue;
      float* row = poisoned.qkv.data() + (int64_t{b} * kT + t) * kRow;
      std::fill(row + int64_t{kH} * kD, row + kRow, std::numeric_limits<float>::quiet_NaN());
    }
  }
  std::vector<int32_t> starts = kStarts;
  const GpuResult a = RunOnGpu(clean, starts);
  const GpuResult p = RunOnGpu(poisoned, starts);
  const auto rows = [&](const std::vector<float>& v, int64_t width) {
    return std::vector<float>(v.begin() + first * width, v.begin() + last * width);
  };
  EXPECT_TRUE(SameBits(rows(p.out, kOutRow), rows(a.out, kOutRow)));
  EXPECT_TRUE(SameBits(rows(p.dqkv, kRow), rows(a.dqkv, kRow)));
  for (int h = 0; h < kH; ++h) {
    const auto at = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + h * kT + first, v.begin() + h * kT + last);
    };
    EXPECT_TRUE(SameBits(at(p.lse), at(a.lse))) << "head " << h;
  }
}

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
