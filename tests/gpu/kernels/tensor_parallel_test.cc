// The tensor-parallel local ops (kernels/tensor_parallel.h) on the GPU against the CPU op on
// the same inputs, f32/bf16/f16 data:
// - the vocabulary-parallel embedding, forward and backward (+= into nonzero gradients), for a
//   shard of the vocabulary that some tokens miss, the whole position table (tensor
//   parallelism's p0 = 0) and a slice of it (a ZeRO-3 vocabulary shard's p0 > 0), with t and
//   with packed positions, tokens scattered over 1200 rows (five chunks of the backward's sort)
//   and repeated within and across chunks;
// - the three cross-entropy passes of each of three ranks (the last holding padding columns),
//   a shard wider than a block, ignored targets and targets on every rank;
// - the row bias with the bias in its own dtype.
// Bounds are per op, from what the two sides compute (each commented where it is checked).
#if ZT_HAVE_CUDA

#include "kernels/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/embedding.h"
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

constexpr int64_t kB = 4, kT = 300;  // 1200 token rows

// Packed documents: positions restart at 0 at each document (lengths 1 to 80).
std::vector<int32_t> PackedPositions(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(kB * kT);
  for (int64_t b = 0; b < kB; ++b) {
    int32_t left = 0, pos = 0;
    for (int64_t t = 0; t < kT; ++t) {
      if (left == 0) {
        left = 1 + static_cast<int32_t>(rng() % 80);
        pos = 0;
      }
      p[b * kT + t] = pos++;
      --left;
    }
  }
  return p;
}

struct EmbeddingCase {
  DType dtype;
  int64_t channels;
  bool packed;
  int64_t position_begin;  // p0; 0 with the whole table, as tensor parallelism binds it
  int64_t position_rows;   // Pl
};

class VocabShardEmbeddingGpuTest : public ::testing::TestWithParam<EmbeddingCase> {};

TEST_P(VocabShardEmbeddingGpuTest, MatchesTheCpuOpBitForBit) {
  ZT_SKIP_WITHOUT_GPU();
  const EmbeddingCase k = GetParam();
  const int64_t c = k.channels, n = kB * kT;
  // A rank of a vocabulary of 200 holding rows [70, 140): most tokens are another rank's, and
  // each of its 70 rows repeats ~6 times across the sort's chunks.
  constexpr int64_t kV = 200, kV0 = 70, kVl = 70;
  std::mt19937 rng(3);
  std::vector<int32_t> tokens(n);
  for (int32_t& x : tokens) x = static_cast<int32_t>(rng() % kV);
  for (int64_t i = 0; i < 40; ++i) tokens[500 + i] = kV0 + 3;  // a run of one token
  const std::vector<int32_t> positions = PackedPositions(4);
  const int64_t pl = k.position_rows;
  Twin tok = Twin::Of(tokens, DType::kI32, {kB, kT});
  Twin pos = k.packed ? Twin::Of(positions, DType::kI32, {kB, kT}) : Twin();
  Twin wte = Twin::Floats(RandomVector(kVl * c, 1), k.dtype, {kVl, c});
  Twin wpe = Twin::Floats(RandomVector(pl * c, 2), k.dtype, {pl, c});
  Twin out = Twin::Floats(std::vector<float>(n * c, 7.0f), k.dtype, {n, c});  // overwritten
  Twin dout = Twin::Floats(RandomVector(n * c, 3), k.dtype, {n, c});
  Twin dwte = Twin::Floats(RandomVector(kVl * c, 4, -0.1f, 0.1f), k.dtype, {kVl, c});
  Twin dwpe = Twin::Floats(RandomVector(pl * c, 5, -0.1f, 0.1f), k.dtype, {pl, c});
  ZT_ASSERT_CUDA(cudaDeviceSynchronize());  // the twins' uploads have landed
  GpuStream stream;
  DeviceBuffer workspace(VocabShardEmbeddingWorkspaceBytes(DeviceKind::kCuda, n, kVl));
  for (const bool gpu : {false, true}) {
    const DeviceContext ctx =
        gpu ? gpu_test::CudaContext(stream, workspace.AsWorkspace()) : CpuContext(2);
    ASSERT_TRUE(VocabShardEmbeddingForward(ctx, {.tokens = tok.on(gpu),
                                                 .wte = wte.on(gpu),
                                                 .wpe = wpe.on(gpu),
                                                 .vocab_begin = kV0,
                                                 .position_begin = k.position_begin,
                                                 .positions = pos.on(gpu),
                                                 .out = out.on(gpu).Reshape({kB, kT, c})})
                    .ok());
    ASSERT_TRUE(VocabShardEmbeddingBackward(ctx, {.tokens = tok.on(gpu),
                                                  .dout = dout.on(gpu).Reshape({kB, kT, c}),
                                                  .dwte = dwte.on(gpu),
                                                  .dwpe = dwpe.on(gpu),
                                                  .vocab_begin = kV0,
                                                  .position_begin = k.position_begin,
                                                  .positions = pos.on(gpu)})
                    .ok());
  }
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  // A lookup and one f32 add per element, and each gradient element summed in f32 from its
  // old value in row order on both sides (the GPU's sorted scatter-add keeps row order) and
  // rounded once: the bytes must be equal.
  EXPECT_EQ(out.GpuBytes(), out.CpuBytes());
  EXPECT_EQ(dwte.GpuBytes(), dwte.CpuBytes());
  EXPECT_EQ(dwpe.GpuBytes(), dwpe.CpuBytes());
  // Not vacuous: the rank owns some of the tokens and misses others; where it misses both the
  // token and the position (a slice of the positions) the row is zero; its own rows of dwte
  // were added to.
  int64_t owned = 0;
  for (int32_t x : tokens) owned += x >= kV0 && x < kV0 + kVl;
  EXPECT_GT(owned, 0);
  EXPECT_LT(owned, n);
  if (k.position_begin > 0) {
    const std::vector<float> o = out.CpuFloats();
    int64_t zero_rows = 0;
    for (int64_t i = 0; i < n; ++i) zero_rows += o[i * c] == 0.0f;
    EXPECT_GT(zero_rows, 0);
  }
  EXPECT_NE(dwte.CpuFloats(),
            Twin::Floats(RandomVector(kVl * c, 4, -0.1f, 0.1f), k.dtype, {kVl, c}).CpuFloats());
}

std::vector<EmbeddingCase> EmbeddingCases() {
  std::vector<EmbeddingCase> cases;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (bool packed : {false, true}) {
      // Tensor parallelism: the whole table, more rows than T. C not a multiple of the block.
      cases.push_back({dtype, 300, packed, 0, kT + 4});
      // A vocabulary shard's slice [40, 140) of the positions: tokens at t < 40 or ≥ 140 (or
      // packed positions there) are another rank's.
      cases.push_back({dtype, 96, packed, 40, 100});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, VocabShardEmbeddingGpuTest, ::testing::ValuesIn(EmbeddingCases()),
                         [](const auto& info) {
                           const EmbeddingCase& k = info.param;
                           return std::string(DTypeName(k.dtype)) + "_C" +
                                  std::to_string(k.channels) + (k.packed ? "_packed" : "_t") +
                                  "_p0_" + std::to_string(k.position_begin);
                         });

struct CeCase {
  DType dtype;
  int64_t vocab;
};

// ⌈V/P⌉ columns a rank; the last rank's shard ends in padding columns.
constexpr int kRanks = 3;

class VocabShardCrossEntropyGpuTest : public ::testing::TestWithParam<CeCase> {};

TEST_P(VocabShardCrossEntropyGpuTest, EachPassOfEachRankMatchesTheCpuOp) {
  ZT_SKIP_WITHOUT_GPU();
  const CeCase k = GetParam();
  constexpr int64_t kN = 9;
  const int64_t v = k.vocab, vl = (v + kRanks - 1) / kRanks;
  auto valid = [&](int r) { return std::clamp<int64_t>(v - r * vl, 0, vl); };
  // Logits over ±4 (probabilities over several orders of magnitude); padding columns hold
  // garbage that no pass may read.
  std::vector<std::vector<float>> shards;
  for (int r = 0; r < kRanks; ++r) shards.push_back(RandomVector(kN * vl, 10 + r, -4.0f, 4.0f));
  std::mt19937 rng(5);
  std::vector<int32_t> targets(kN);
  for (int32_t& t : targets) t = static_cast<int32_t>(rng() % v);
  targets[1] = -1;                           // ignored
  targets[2] = 0;                            // rank 0's first column
  targets[3] = static_cast<int32_t>(v - 1);  // the last rank's last valid column
  targets[4] = static_cast<int32_t>(vl);     // rank 1's first column
  Twin tgt = Twin::Of(targets, DType::kI32, {kN});

  // The collectives' inputs, computed once by the CPU ops and fed to both sides, so each pass
  // is compared on the same inputs.
  std::vector<Twin> logits;
  for (int r = 0; r < kRanks; ++r) logits.push_back(Twin::Floats(shards[r], k.dtype, {kN, vl}));
  std::vector<float> maxes(kRanks * kN), sums(2 * kN, 0.0f);
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(
        VocabShardRowMax(CpuContext(2), {.logits = logits[r].cpu(),
                                         .valid = valid(r),
                                         .max = Tensor(maxes.data() + r * kN, DType::kF32, {kN})})
            .ok());
  }
  Twin all_maxes = Twin::Of(maxes, DType::kF32, {kRanks, kN});
  for (int r = 0; r < kRanks; ++r) {
    std::vector<float> part(2 * kN);
    ASSERT_TRUE(VocabShardExpSum(CpuContext(2), {.logits = logits[r].cpu(),
                                                 .valid = valid(r),
                                                 .maxes = all_maxes.cpu(),
                                                 .targets = tgt.cpu(),
                                                 .vocab_begin = r * vl,
                                                 .sums = Tensor(part.data(), DType::kF32, {kN, 2})})
                    .ok());
    for (int64_t i = 0; i < 2 * kN; ++i) sums[i] += part[i];
  }
  Twin all_sums = Twin::Of(sums, DType::kF32, {kN, 2});
  ZT_ASSERT_CUDA(cudaDeviceSynchronize());
  GpuStream stream;
  const double ulp16 = k.dtype == DType::kBF16 ? 0x1p-7 : k.dtype == DType::kF16 ? 0x1p-10 : 0.0;

  for (int r = 0; r < kRanks; ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    Twin max = Twin::Floats(std::vector<float>(kN, 1.0f), DType::kF32, {kN});
    Twin part = Twin::Floats(std::vector<float>(2 * kN, 1.0f), DType::kF32, {kN, 2});
    Twin losses = Twin::Floats(std::vector<float>(kN, -1.0f), DType::kF32, {kN});
    Twin grad = Twin::Floats(shards[r], k.dtype, {kN, vl});  // the logits, overwritten
    ZT_ASSERT_CUDA(cudaDeviceSynchronize());
    for (const bool gpu : {false, true}) {
      const DeviceContext ctx = gpu ? gpu_test::CudaContext(stream) : CpuContext(2);
      ASSERT_TRUE(VocabShardRowMax(
                      ctx, {.logits = logits[r].on(gpu), .valid = valid(r), .max = max.on(gpu)})
                      .ok());
      ASSERT_TRUE(VocabShardExpSum(ctx, {.logits = logits[r].on(gpu),
                                         .valid = valid(r),
                                         .maxes = all_maxes.on(gpu),
                                         .targets = tgt.on(gpu),
                                         .vocab_begin = r * vl,
                                         .sums = part.on(gpu)})
                      .ok());
      ASSERT_TRUE(VocabShardCrossEntropy(ctx, {.logits = grad.on(gpu),
                                               .valid = valid(r),
                                               .maxes = all_maxes.on(gpu),
                                               .sums = all_sums.on(gpu),
                                               .targets = tgt.on(gpu),
                                               .vocab_begin = r * vl,
                                               .losses = losses.on(gpu),
                                               .grad_scale = 1.0f / 7.0f,
                                               .write_grad = true})
                      .ok());
    }
    ASSERT_EQ(stream.Sync(), cudaSuccess);
    // A maximum is exact, and the padding columns are skipped on both: equal bytes.
    EXPECT_EQ(max.GpuBytes(), max.CpuBytes());
    // Σexp(x − M): the same f64 terms (exp in f64 of the same f32 difference; CUDA's and
    // glibc's f64 exp are both within 1 ulp) summed in two orders, ≤ Vl·2⁻⁵³ apart, then
    // rounded to f32: equal or one f32 ulp (2⁻²⁴) apart. The target's logit is copied: exact.
    // 1e-6 is ~16 f32 ulps.
    const std::vector<float> gs = part.GpuFloats(), cs = part.CpuFloats();
    std::vector<float> g_exp, c_exp;
    for (int64_t i = 0; i < kN; ++i) {
      g_exp.push_back(gs[2 * i]);
      c_exp.push_back(cs[2 * i]);
      EXPECT_EQ(gs[2 * i + 1], cs[2 * i + 1]) << "row " << i;
    }
    EXPECT_LT(NormalizedError(g_exp, c_exp), 1e-6);
    // The loss from the same (M, sums) by the same f64 expression, differing only by log's
    // last f64 bit before the f32 rounding: 1e-6 as above.
    EXPECT_LT(NormalizedError(losses.GpuFloats(), losses.CpuFloats()), 1e-6);
    // Each gradient is the same f64 expression of the same inputs rounded to f32 (exp's last
    // f64 bit apart): 1e-6. A 16-bit gradient rounds that f32 once more; where the two sides
    // straddle a 16-bit rounding boundary they differ by one 16-bit ulp, and even every
    // element doing so keeps the normalized error under one ulp relative.
    EXPECT_LT(NormalizedError(grad.GpuFloats(), grad.CpuFloats()), 1e-6 + ulp16);
    // Ignored rows and padding columns are exactly zero on the GPU.
    const std::vector<float> g = grad.GpuFloats();
    for (int64_t i = 0; i < vl; ++i) ASSERT_EQ(g[1 * vl + i], 0.0f) << "ignored row, column " << i;
    for (int64_t i = valid(r); i < vl; ++i) ASSERT_EQ(g[i], 0.0f) << "padding column " << i;
  }
}

std::vector<CeCase> CeCases() {
  std::vector<CeCase> cases;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    cases.push_back({dtype, 1000});   // 334 columns a rank, the last with 2 of padding
    cases.push_back({dtype, 50257});  // 16753 columns: far more than a block's 256 threads
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, VocabShardCrossEntropyGpuTest, ::testing::ValuesIn(CeCases()),
                         [](const auto& info) {
                           return std::string(DTypeName(info.param.dtype)) + "_V" +
                                  std::to_string(info.param.vocab);
                         });

TEST(AddRowBiasGpuTest, MatchesTheCpuOpBitForBit) {
  ZT_SKIP_WITHOUT_GPU();
  constexpr int64_t kN = 37, kC = 300;
  GpuStream stream;
  for (DType out_dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (DType bias_dtype : {DType::kF32, DType::kBF16}) {
      Twin out = Twin::Floats(RandomVector(kN * kC, 1), out_dtype, {kN, kC});
      Twin bias = Twin::Floats(RandomVector(kC, 2), bias_dtype, {kC});
      ZT_ASSERT_CUDA(cudaDeviceSynchronize());
      for (const bool gpu : {false, true}) {
        const DeviceContext ctx = gpu ? gpu_test::CudaContext(stream) : CpuContext(2);
        ASSERT_TRUE(AddRowBias(ctx, {.out = out.on(gpu), .bias = bias.on(gpu)}).ok());
      }
      ASSERT_EQ(stream.Sync(), cudaSuccess);
      // One f32 add of the same loaded values, rounded once: equal bytes.
      EXPECT_EQ(out.GpuBytes(), out.CpuBytes())
          << DTypeName(out_dtype) << " out, " << DTypeName(bias_dtype) << " bias";
    }
  }
}

TEST(VocabShardEmbeddingGpuOnlyTest, ANegativeTokenGivesANaNRow) {
  // The CPU op returns InvalidArgument; the GPU cannot without waiting for the stream, so the
  // row is poisoned instead (kernels/cuda/tensor_parallel.h); a token of another rank's rows
  // gives 0 as on the CPU.
  ZT_SKIP_WITHOUT_GPU();
  Twin tok = Twin::Of(std::vector<int32_t>{1, -3, 9}, DType::kI32, {1, 3});
  Twin wte = Twin::Floats(std::vector<float>(4 * 2, 1.0f), DType::kF32, {4, 2});
  Twin out = Twin::Floats(std::vector<float>(3 * 2, 5.0f), DType::kF32, {3, 2});
  ZT_ASSERT_CUDA(cudaDeviceSynchronize());
  GpuStream stream;
  ASSERT_TRUE(VocabShardEmbeddingForward(
                  gpu_test::CudaContext(stream),
                  {.tokens = tok.gpu(), .wte = wte.gpu(), .out = out.gpu().Reshape({1, 3, 2})})
                  .ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  const std::vector<float> got = out.GpuFloats();
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_TRUE(std::isnan(got[2]));
  EXPECT_EQ(got[4], 0.0f);
}

// Runs without a GPU: refused before any CUDA call.
TEST(VocabShardEmbeddingGpuArgsTest, BackwardRefusesAWorkspaceSmallerThanItsSize) {
  std::vector<int32_t> tokens(2 * 3);
  std::vector<float> dwte(5 * 4), dout(2 * 3 * 4);
  DeviceContext ctx;
  ctx.device = gpu_test::Gpu0();
  ctx.workspace = Workspace{.data = nullptr, .bytes = 8};
  const absl::Status s = VocabShardEmbeddingBackward(
      ctx, {.tokens = Tensor(tokens.data(), DType::kI32, {2, 3}, gpu_test::Gpu0()),
            .dout = Tensor(dout.data(), DType::kF32, {2, 3, 4}, gpu_test::Gpu0()),
            .dwte = Tensor(dwte.data(), DType::kF32, {5, 4}, gpu_test::Gpu0()),
            .vocab_begin = 5});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  // The whole-table backward's sort over max(Vl, B·T) = 6 rows: (2·6 + 1 + 6) · 4 bytes.
  EXPECT_EQ(VocabShardEmbeddingWorkspaceBytes(DeviceKind::kCuda, 6, 5), 76);
  EXPECT_NE(s.message().find("needs 76"), std::string_view::npos) << s;
  EXPECT_EQ(VocabShardEmbeddingWorkspaceBytes(DeviceKind::kCpu, 6, 5), 0);
}

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
