// EmbeddingForward and EmbeddingBackward on the GPU against the CPU op (kernels/embedding.h)
// on the same inputs, with and without learned positions, with packed positions (documents
// restarting at 0, so rows of wpe repeat within and across the sort's chunks), f32/bf16/f16
// tables and gradients:
// GPT-2's vocabulary with scattered tokens, a 17-row vocabulary where every token repeats
// across many of the backward sort's 256-position chunks, and a batch of one repeated token.
// Channel counts that are and are not a multiple of the 256-thread block. The backward adds
// (+=) to nonzero gradients.
//
// Both sides compute every element with the same f32 additions in the same order (the GPU's
// backward sorts the positions by token, and packed positions by position, keeping their
// order, then sums each gradient element from its old value in position order, as the CPU
// does) and round once: the results must be bitwise equal, so the bound is exact equality.
#if ZT_HAVE_CUDA

#include "kernels/embedding.h"

#include <cmath>
#include <cstdint>
#include <random>
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
using gpu_test::ToDevice;
using gpu_test::ToHostFloats;

enum class Tokens { kScattered, kFewRepeated, kAllTheSame };

struct Case {
  DType dtype;
  int64_t vocab;
  int64_t channels;
  Tokens tokens;
  bool positions;
  bool packed = false;  // with positions: each token's packed position instead of t
};

constexpr int64_t kB = 4, kT = 300;  // 1200 positions: five chunks of the backward's sort

std::vector<int32_t> MakeTokens(const Case& c) {
  std::mt19937 rng(9);
  std::vector<int32_t> t(kB * kT);
  for (int32_t& x : t) {
    x = c.tokens == Tokens::kAllTheSame ? static_cast<int32_t>(c.vocab - 1)
                                        : static_cast<int32_t>(rng() % c.vocab);
  }
  return t;
}

// Documents of 1 to 80 tokens: positions restart at 0 at each.
std::vector<int32_t> PackedPositions() {
  std::mt19937 rng(11);
  std::vector<int32_t> p(kB * kT);
  int32_t left = 0, pos = 0;
  for (int64_t i = 0; i < kB * kT; ++i) {
    if (i % kT == 0 || left == 0) {
      left = 1 + static_cast<int32_t>(rng() % 80);
      pos = 0;
    }
    p[i] = pos++;
    --left;
  }
  return p;
}

class EmbeddingGpuTest : public ::testing::TestWithParam<Case> {};

TEST_P(EmbeddingGpuTest, MatchesTheCpuOpBitForBit) {
  ZT_SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  const int64_t v = c.vocab, ch = c.channels;
  const int64_t p = kT + 3;  // more positions than the sequence uses
  std::vector<int32_t> tokens = MakeTokens(c);
  const Tensor h_tokens(tokens.data(), DType::kI32, {kB, kT});
  std::vector<int32_t> packed = PackedPositions();
  const Tensor h_positions = c.packed ? Tensor(packed.data(), DType::kI32, {kB, kT}) : Tensor();
  testing::Stored wte(testing::RandomVector(v * ch, 1), c.dtype);
  testing::Stored wpe(testing::RandomVector(p * ch, 2), c.dtype);
  testing::Stored out(kB * kT * ch, c.dtype);
  testing::Stored dout(testing::RandomVector(kB * kT * ch, 3), c.dtype);
  // Nonzero gradients: the backward adds to them.
  const std::vector<float> dwte_init = testing::RandomVector(v * ch, 4, -0.1f, 0.1f);
  const std::vector<float> dwpe_init = testing::RandomVector(p * ch, 5, -0.1f, 0.1f);
  testing::Stored dwte(dwte_init, c.dtype), dwpe(dwpe_init, c.dtype);

  const Tensor h_wpe = c.positions ? wpe.View({p, ch}) : Tensor();
  const Tensor h_dwpe = c.positions ? dwpe.View({p, ch}) : Tensor();
  ASSERT_TRUE(EmbeddingForward(CpuContext(2), {.tokens = h_tokens,
                                               .wte = wte.View({v, ch}),
                                               .wpe = h_wpe,
                                               .out = out.View({kB, kT, ch}),
                                               .positions = h_positions})
                  .ok());
  ASSERT_TRUE(EmbeddingBackward(CpuContext(2), {.tokens = h_tokens,
                                                .dout = dout.View({kB, kT, ch}),
                                                .dwte = dwte.View({v, ch}),
                                                .dwpe = h_dwpe,
                                                .positions = h_positions})
                  .ok());

  testing::Stored gpu_dwte_init(dwte_init, c.dtype), gpu_dwpe_init(dwpe_init, c.dtype);
  DeviceBuffer positions_mem;
  const Tensor d_positions = ToDevice(h_positions, positions_mem);
  DeviceBuffer tokens_mem, wte_mem, wpe_mem, out_mem, dout_mem, dwte_mem, dwpe_mem;
  const Tensor d_tokens = ToDevice(h_tokens, tokens_mem);
  const Tensor d_out = ToDevice(out.View({kB, kT, ch}), out_mem);  // overwritten
  const Tensor d_dwte = ToDevice(gpu_dwte_init.View({v, ch}), dwte_mem);
  const Tensor d_dwpe = c.positions ? ToDevice(gpu_dwpe_init.View({p, ch}), dwpe_mem) : Tensor();
  const Tensor d_wte = ToDevice(wte.View({v, ch}), wte_mem);
  const Tensor d_wpe = ToDevice(h_wpe, wpe_mem);
  const Tensor d_dout = ToDevice(dout.View({kB, kT, ch}), dout_mem);
  // cudaMemcpy from pageable memory may return before its DMA has landed, and the op's
  // non-blocking stream does not wait for it: let the uploads finish first.
  ZT_ASSERT_CUDA(cudaDeviceSynchronize());
  GpuStream stream;
  DeviceBuffer workspace(EmbeddingWorkspaceBytes(DeviceKind::kCuda, kB * kT, v));
  const DeviceContext ctx = gpu_test::CudaContext(stream, workspace.AsWorkspace());
  ASSERT_TRUE(
      EmbeddingForward(
          ctx,
          {.tokens = d_tokens, .wte = d_wte, .wpe = d_wpe, .out = d_out, .positions = d_positions})
          .ok());
  ASSERT_TRUE(EmbeddingBackward(ctx, {.tokens = d_tokens,
                                      .dout = d_dout,
                                      .dwte = d_dwte,
                                      .dwpe = d_dwpe,
                                      .positions = d_positions})
                  .ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);

  EXPECT_EQ(ToHostFloats(d_out), HostFloats(out.View({kB, kT, ch})));
  EXPECT_EQ(ToHostFloats(d_dwte), HostFloats(dwte.View({v, ch})));
  if (c.positions) EXPECT_EQ(ToHostFloats(d_dwpe), HostFloats(dwpe.View({p, ch})));
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (bool positions : {true, false}) {
      cases.push_back({dtype, 50304, 96, Tokens::kScattered, positions});
      cases.push_back({dtype, 17, 300, Tokens::kFewRepeated, positions});
      cases.push_back({dtype, 17, 256, Tokens::kAllTheSame, positions});
    }
    // Packed positions: the position sort over T = 300 rows, more than the 17-row vocabulary's
    // (the workspace covers max(V, B·T) rows), and beside GPT-2's.
    cases.push_back({dtype, 17, 300, Tokens::kFewRepeated, true, true});
    cases.push_back({dtype, 50304, 96, Tokens::kScattered, true, true});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, EmbeddingGpuTest, ::testing::ValuesIn(Cases()), [](const auto& info) {
  const Case& c = info.param;
  const char* tokens = c.tokens == Tokens::kScattered     ? "scattered"
                       : c.tokens == Tokens::kFewRepeated ? "repeated"
                                                          : "one_token";
  return std::string(DTypeName(c.dtype)) + "_V" + std::to_string(c.vocab) + "_C" +
         std::to_string(c.channels) + "_" + tokens +
         (c.positions ? (c.packed ? "_packed_wpe" : "_wpe") : "_no_wpe");
});

TEST(EmbeddingGpuOnlyTest, ATokenOutsideTheVocabularyGivesANaNRow) {
  // The CPU op returns InvalidArgument; the GPU cannot without waiting for the stream, so the
  // row is poisoned instead (kernels/cuda/embedding.h).
  ZT_SKIP_WITHOUT_GPU();
  std::vector<int32_t> tokens = {1, 4};
  std::vector<float> wte(4 * 2, 1.0f), out(2 * 2, 0.0f);
  DeviceBuffer tokens_mem, wte_mem, out_mem;
  const EmbeddingForwardArgs args{
      .tokens = ToDevice(Tensor(tokens.data(), DType::kI32, {1, 2}), tokens_mem),
      .wte = ToDevice(Tensor(wte.data(), DType::kF32, {4, 2}), wte_mem),
      .out = ToDevice(Tensor(out.data(), DType::kF32, {1, 2, 2}), out_mem)};
  // cudaMemcpy from pageable memory may return before its DMA has landed, and the op's
  // non-blocking stream does not wait for it: let the uploads finish first.
  ZT_ASSERT_CUDA(cudaDeviceSynchronize());
  GpuStream stream;
  ASSERT_TRUE(EmbeddingForward(gpu_test::CudaContext(stream), args).ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  const std::vector<float> got = ToHostFloats(args.out);
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_TRUE(std::isnan(got[2]));
}

// The checks below run without a GPU: each is refused before any CUDA call.

TEST(EmbeddingGpuArgsTest, RefusesATensorOnAnotherDevice) {
  std::vector<int32_t> tokens(2 * 3);
  std::vector<float> wte(5 * 4), out(2 * 3 * 4);
  DeviceContext ctx;
  ctx.device = gpu_test::Gpu0();
  const absl::Status s =
      EmbeddingForward(ctx, {.tokens = Tensor(tokens.data(), DType::kI32, {2, 3}, gpu_test::Gpu0()),
                             .wte = Tensor(wte.data(), DType::kF32, {5, 4}),
                             .out = Tensor(out.data(), DType::kF32, {2, 3, 4}, gpu_test::Gpu0())});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("wte is on cpu:0"), std::string_view::npos) << s;
}

TEST(EmbeddingGpuArgsTest, BackwardRefusesAWorkspaceSmallerThanItsSize) {
  std::vector<int32_t> tokens(2 * 3);
  std::vector<float> dwte(5 * 4), dout(2 * 3 * 4);
  DeviceContext ctx;
  ctx.device = gpu_test::Gpu0();
  ctx.workspace = Workspace{.data = nullptr, .bytes = 8};
  const absl::Status s = EmbeddingBackward(
      ctx, {.tokens = Tensor(tokens.data(), DType::kI32, {2, 3}, gpu_test::Gpu0()),
            .dout = Tensor(dout.data(), DType::kF32, {2, 3, 4}, gpu_test::Gpu0()),
            .dwte = Tensor(dwte.data(), DType::kF32, {5, 4}, gpu_test::Gpu0())});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  // Offsets (R + 1), cursors (R) and the sorted positions (B·T), i32, for R = max(V, B·T) = 6
  // rows (the packed positions' sort covers T ≤ B·T rows): (2·6 + 1 + 6) · 4 bytes.
  EXPECT_EQ(EmbeddingWorkspaceBytes(DeviceKind::kCuda, 6, 5), 76);
  EXPECT_NE(s.message().find("needs 76"), std::string_view::npos) << s;
  EXPECT_EQ(EmbeddingWorkspaceBytes(DeviceKind::kCpu, 6, 5), 0);
}

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
