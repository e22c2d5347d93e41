// kernels/tensor_parallel: the vocabulary-parallel cross-entropy split over P simulated ranks
// (the collectives done here by plain sums and maxima) against a float64 softmax
// cross-entropy and the fused one-rank op; the vocabulary-parallel embedding's shares summing
// to the whole table's lookup and gradient; the row bias; host tensors on a CUDA context
// refused cleanly; each op on bf16 and f16 data against its f32 result.
#include "kernels/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cross_entropy.h"
#include "kernels/dtype.h"
#include "kernels/embedding.h"

namespace zt {
namespace {

struct ShardedCe {
  std::vector<float> losses;       // rank 0's (every rank's are the same)
  std::vector<float> dlogits;      // (N, V) assembled from the ranks' columns
  std::vector<float> rank_losses;  // (P, N)
};

// The three passes on P ranks of ⌈V/P⌉ columns each, the all-gather and all-reduce in between
// done by hand.
ShardedCe RunSharded(int p, int64_t n, int64_t v, const std::vector<float>& logits,
                     std::vector<int32_t>& targets, float scale) {
  const DeviceContext ctx = CpuContext(2);
  const int64_t vl = (v + p - 1) / p;
  std::vector<std::vector<float>> shard(p, std::vector<float>(n * vl, 0.0f));
  for (int k = 0; k < p; ++k) {
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < vl && k * vl + c < v; ++c)
        shard[k][r * vl + c] = logits[r * v + k * vl + c];
    }
  }
  auto valid = [&](int k) { return std::clamp<int64_t>(v - k * vl, 0, vl); };
  std::vector<float> maxes(p * n);
  for (int k = 0; k < p; ++k) {
    EXPECT_TRUE(VocabShardRowMax(ctx, {.logits = Tensor(shard[k].data(), DType::kF32, {n, vl}),
                                       .valid = valid(k),
                                       .max = Tensor(maxes.data() + k * n, DType::kF32, {n})})
                    .ok());
  }
  std::vector<float> sums(2 * n, 0.0f), part(2 * n);
  const Tensor t_targets(targets.data(), DType::kI32, {n});
  for (int k = 0; k < p; ++k) {
    EXPECT_TRUE(VocabShardExpSum(ctx, {.logits = Tensor(shard[k].data(), DType::kF32, {n, vl}),
                                       .valid = valid(k),
                                       .maxes = Tensor(maxes.data(), DType::kF32, {p, n}),
                                       .targets = t_targets,
                                       .vocab_begin = k * vl,
                                       .sums = Tensor(part.data(), DType::kF32, {n, 2})})
                    .ok());
    for (int64_t i = 0; i < 2 * n; ++i) sums[i] += part[i];
  }
  ShardedCe out;
  out.dlogits.assign(n * v, 0.0f);
  out.rank_losses.assign(p * n, 0.0f);
  for (int k = 0; k < p; ++k) {
    EXPECT_TRUE(VocabShardCrossEntropy(
                    ctx, {.logits = Tensor(shard[k].data(), DType::kF32, {n, vl}),
                          .valid = valid(k),
                          .maxes = Tensor(maxes.data(), DType::kF32, {p, n}),
                          .sums = Tensor(sums.data(), DType::kF32, {n, 2}),
                          .targets = t_targets,
                          .vocab_begin = k * vl,
                          .losses = Tensor(out.rank_losses.data() + k * n, DType::kF32, {n}),
                          .grad_scale = scale,
                          .write_grad = true})
                    .ok());
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < vl; ++c) {
        if (c >= valid(k)) {
          EXPECT_EQ(shard[k][r * vl + c], 0.0f) << "padding column gets no gradient";
        } else {
          out.dlogits[r * v + k * vl + c] = shard[k][r * vl + c];
        }
      }
    }
  }
  out.losses.assign(out.rank_losses.begin(), out.rank_losses.begin() + n);
  return out;
}

TEST(TensorParallelTest, ParallelCrossEntropyEqualsFloat64AndTheFusedOp) {
  const int64_t n = 23, v = 37;  // 37 splits unevenly: the last shards end in padding
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(n * v);
  for (float& x : logits) x = normal(rng);
  logits[5 * v + 3] = 60.0f;  // a large logit: the shifted sums must not overflow
  std::vector<int32_t> targets(n);
  for (int32_t& t : targets) t = static_cast<int32_t>(rng() % v);
  targets[4] = kIgnoreTarget;
  targets[5] = 3;
  const float scale = 1.0f / 22.0f;

  // float64 reference: loss m + log Σexp − x_t, gradient scale·(softmax − onehot).
  std::vector<double> want_loss(n, 0.0), want_grad(n * v, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    if (targets[r] < 0) continue;
    const float* x = &logits[r * v];
    const double m = *std::max_element(x, x + v);
    double sum = 0;
    for (int64_t i = 0; i < v; ++i) sum += std::exp(x[i] - m);
    want_loss[r] = m + std::log(sum) - x[targets[r]];
    for (int64_t i = 0; i < v; ++i) {
      want_grad[r * v + i] = scale * (std::exp(x[i] - m) / sum - (i == targets[r] ? 1.0 : 0.0));
    }
  }
  // The fused one-rank op on the same logits.
  std::vector<float> fused = logits, fused_loss(n);
  ASSERT_TRUE(
      SoftmaxCrossEntropy(CpuContext(1), {.logits = Tensor(fused.data(), DType::kF32, {n, v}),
                                          .targets = Tensor(targets.data(), DType::kI32, {n}),
                                          .losses = Tensor(fused_loss.data(), DType::kF32, {n}),
                                          .grad_scale = scale,
                                          .write_grad = true})
          .ok());
  for (int p : {1, 2, 3, 4, 8}) {
    const ShardedCe got = RunSharded(p, n, v, logits, targets, scale);
    for (int64_t r = 0; r < n; ++r) {
      // Σexp is summed in f64 per shard and the shards' partial sums added in f32 (what the
      // f32 all-reduce does): ~1e-7 relative on log Σexp, i.e. a few f32 ulps of the loss.
      EXPECT_NEAR(got.losses[r], want_loss[r], 2e-6 * std::max(1.0, want_loss[r]))
          << "P " << p << " row " << r;
      EXPECT_NEAR(got.losses[r], fused_loss[r], 1e-5 * std::max(1.0f, fused_loss[r]));
      for (int k = 1; k < p; ++k) {
        EXPECT_EQ(got.rank_losses[k * n + r], got.losses[r]) << "every rank has the same loss";
      }
      for (int64_t i = 0; i < v; ++i) {
        // Probabilities are at most scale (~0.05): 1e-8 absolute is ~1e-6 relative to the
        // largest, f32 rounding of exp(x − m)/Σ.
        EXPECT_NEAR(got.dlogits[r * v + i], want_grad[r * v + i], 1e-8)
            << "P " << p << " row " << r << " col " << i;
        EXPECT_NEAR(got.dlogits[r * v + i], fused[r * v + i], 1e-7);
      }
    }
    EXPECT_EQ(got.losses[4], 0.0f) << "ignored target";
  }
}

TEST(TensorParallelTest, EmbeddingSharesSumToTheWholeLookupAndGradient) {
  const int64_t b = 2, t = 5, c = 6, v = 11, positions = 8;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> wte(v * c), wpe(positions * c), dout(b * t * c);
  for (float& x : wte) x = normal(rng);
  for (float& x : wpe) x = normal(rng);
  for (float& x : dout) x = normal(rng);
  std::vector<int32_t> tokens(b * t);
  for (int32_t& x : tokens) x = static_cast<int32_t>(rng() % v);
  tokens[3] = tokens[7] = 10;  // a repeated token in the last, short shard
  const DeviceContext ctx = CpuContext(2);
  const Tensor tok(tokens.data(), DType::kI32, {b, t});

  std::vector<float> want(b * t * c), want_dwte(v * c, 0.0f), want_dwpe(positions * c, 0.0f);
  ASSERT_TRUE(EmbeddingForward(ctx, {.tokens = tok,
                                     .wte = Tensor(wte.data(), DType::kF32, {v, c}),
                                     .wpe = Tensor(wpe.data(), DType::kF32, {positions, c}),
                                     .out = Tensor(want.data(), DType::kF32, {b, t, c})})
                  .ok());
  ASSERT_TRUE(
      EmbeddingBackward(ctx, {.tokens = tok,
                              .dout = Tensor(dout.data(), DType::kF32, {b, t, c}),
                              .dwte = Tensor(want_dwte.data(), DType::kF32, {v, c}),
                              .dwpe = Tensor(want_dwpe.data(), DType::kF32, {positions, c})})
          .ok());
  for (int p : {2, 3, 4}) {
    const int64_t vl = (v + p - 1) / p;
    std::vector<float> sum(b * t * c, 0.0f), dwte(v * c, 0.0f);
    for (int k = 0; k < p; ++k) {
      std::vector<float> table(vl * c, 0.0f), out(b * t * c), grad(vl * c, 0.0f), dwpe;
      for (int64_t i = 0; i < vl * c && k * vl * c + i < v * c; ++i) table[i] = wte[k * vl * c + i];
      ASSERT_TRUE(
          VocabShardEmbeddingForward(
              ctx, {.tokens = tok,
                    .wte = Tensor(table.data(), DType::kF32, {vl, c}),
                    .wpe = k == 0 ? Tensor(wpe.data(), DType::kF32, {positions, c}) : Tensor(),
                    .vocab_begin = k * vl,
                    .out = Tensor(out.data(), DType::kF32, {b, t, c})})
              .ok());
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += out[i];
      std::vector<float> pos_grad(positions * c, 0.0f);
      ASSERT_TRUE(VocabShardEmbeddingBackward(
                      ctx, {.tokens = tok,
                            .dout = Tensor(dout.data(), DType::kF32, {b, t, c}),
                            .dwte = Tensor(grad.data(), DType::kF32, {vl, c}),
                            .dwpe = Tensor(pos_grad.data(), DType::kF32, {positions, c}),
                            .vocab_begin = k * vl})
                      .ok());
      // Every rank's position gradient is the whole one: it is replicated.
      for (size_t i = 0; i < pos_grad.size(); ++i) EXPECT_FLOAT_EQ(pos_grad[i], want_dwpe[i]);
      for (int64_t i = 0; i < vl * c; ++i) {
        if (k * vl * c + i < v * c) {
          dwte[k * vl * c + i] = grad[i];
        } else {
          EXPECT_EQ(grad[i], 0.0f) << "a padding row gets no gradient";
        }
      }
    }
    // One rank holds each token: the sum is the lookup exactly (x + 0 = x).
    EXPECT_EQ(sum, want) << "P " << p;
    for (size_t i = 0; i < dwte.size(); ++i) EXPECT_FLOAT_EQ(dwte[i], want_dwte[i]) << "P " << p;
  }
}

// The split a ZeRO-3 shard group gives the tied embedding (worker/model/
// transformer_vocab_shard.cc): [wte; wpe] read as V + P rows, each rank owning one contiguous
// range of them, so a rank may hold vocabulary rows, position rows, both or neither, and the
// positions are a packed batch's. The ranks' lookups sum to the whole table's exactly, and
// their row gradients are the whole gradient's rows.
TEST(TensorParallelTest, RowRangesOfTheStackedTablesSumToTheWholeLookupAndGradient) {
  const int64_t b = 2, t = 6, c = 5, v = 9, n_pos = 7, rows = v + n_pos;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> table(rows * c), dout(b * t * c);
  for (float& x : table) x = normal(rng);
  for (float& x : dout) x = normal(rng);
  std::vector<int32_t> tokens(b * t), positions(b * t);
  for (int32_t& x : tokens) x = static_cast<int32_t>(rng() % v);
  // Two packed documents in the first row, one in the second: positions restart.
  const int32_t pos[] = {0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 4, 5};
  std::copy(std::begin(pos), std::end(pos), positions.begin());
  tokens[1] = tokens[8] = 8;  // a repeated token
  const DeviceContext ctx = CpuContext(2);
  const Tensor tok(tokens.data(), DType::kI32, {b, t});
  const Tensor at(positions.data(), DType::kI32, {b, t});
  const Tensor wte(table.data(), DType::kF32, {v, c});
  const Tensor wpe(table.data() + v * c, DType::kF32, {n_pos, c});
  std::vector<float> want(b * t * c), want_grad(rows * c, 0.0f);
  ASSERT_TRUE(EmbeddingForward(ctx, {.tokens = tok,
                                     .wte = wte,
                                     .wpe = wpe,
                                     .out = Tensor(want.data(), DType::kF32, {b, t, c}),
                                     .positions = at})
                  .ok());
  ASSERT_TRUE(
      EmbeddingBackward(ctx, {.tokens = tok,
                              .dout = Tensor(dout.data(), DType::kF32, {b, t, c}),
                              .dwte = Tensor(want_grad.data(), DType::kF32, {v, c}),
                              .dwpe = Tensor(want_grad.data() + v * c, DType::kF32, {n_pos, c}),
                              .positions = at})
          .ok());
  for (int g : {2, 3, 5}) {
    const int64_t each = (rows + g - 1) / g;
    std::vector<float> sum(b * t * c, 0.0f), grad(rows * c, 0.0f);
    for (int k = 0; k < g; ++k) {
      const int64_t r0 = std::min(rows, k * each), r1 = std::min(rows, r0 + each);
      // Rows [r0, r1): vocabulary rows [r0, min(r1, V)), position rows [max(r0, V), r1) − V.
      const int64_t v0 = std::min(r0, v), v1 = std::min(r1, v);
      const int64_t p0 = std::max(r0, v) - v, p1 = std::max(r1, v) - v;
      std::vector<float> out(b * t * c);
      const auto rows_of = [&](float* base, int64_t begin, int64_t end) {
        return Tensor(base + begin * c, DType::kF32, {end - begin, c});
      };
      ASSERT_TRUE(
          VocabShardEmbeddingForward(ctx, {.tokens = tok,
                                           .wte = rows_of(table.data(), v0, v1),
                                           .wpe = rows_of(table.data() + v * c, p0, p1),
                                           .vocab_begin = v0,
                                           .position_begin = p0,
                                           .positions = at,
                                           .out = Tensor(out.data(), DType::kF32, {b, t, c})})
              .ok());
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += out[i];
      ASSERT_TRUE(
          VocabShardEmbeddingBackward(ctx, {.tokens = tok,
                                            .dout = Tensor(dout.data(), DType::kF32, {b, t, c}),
                                            .dwte = rows_of(grad.data(), v0, v1),
                                            .dwpe = rows_of(grad.data() + v * c, p0, p1),
                                            .vocab_begin = v0,
                                            .position_begin = p0,
                                            .positions = at})
              .ok());
    }
    // Each token and each position has one owner: the sum is the lookup exactly (x + 0 = x),
    // and each gradient row is summed by its owner alone, in row order, as the whole op does.
    EXPECT_EQ(sum, want) << "G " << g;
    EXPECT_EQ(grad, want_grad) << "G " << g;
  }
}

TEST(TensorParallelTest, RowBiasAndErrors) {
  std::vector<float> out = {1, 2, 3, 4, 5, 6}, bias = {10, 20, 30};
  ASSERT_TRUE(AddRowBias(CpuContext(1), {.out = Tensor(out.data(), DType::kF32, {2, 3}),
                                         .bias = Tensor(bias.data(), DType::kF32, {3})})
                  .ok());
  EXPECT_EQ(out, (std::vector<float>{11, 22, 33, 14, 25, 36}));
  const absl::Status wrong =
      AddRowBias(CpuContext(1), {.out = Tensor(out.data(), DType::kF32, {2, 3}),
                                 .bias = Tensor(bias.data(), DType::kF32, {2})});
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("bias"), std::string::npos) << wrong;

  std::vector<float> logits(6), max(2);
  const absl::Status bad_valid =
      VocabShardRowMax(CpuContext(1), {.logits = Tensor(logits.data(), DType::kF32, {2, 3}),
                                       .valid = 4,
                                       .max = Tensor(max.data(), DType::kF32, {2})});
  EXPECT_EQ(bad_valid.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_valid.message().find("valid"), std::string::npos) << bad_valid;

  // A CUDA context (its twin: kernels/cuda/tensor_parallel.h) refuses host tensors by name,
  // before any pointer is read.
  DeviceContext cuda = CpuContext(1);
  cuda.device.kind = DeviceKind::kCuda;
  const absl::Status on_cuda =
      VocabShardRowMax(cuda, {.logits = Tensor(logits.data(), DType::kF32, {2, 3}),
                              .valid = 3,
                              .max = Tensor(max.data(), DType::kF32, {2})});
  EXPECT_EQ(on_cuda.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(on_cuda.message().find("logits is on cpu:0"), std::string::npos) << on_cuda;
  EXPECT_NE(on_cuda.message().find("VocabShardRowMax"), std::string::npos) << on_cuda;
}

// 16-bit storage of one op's data: values kept as 16 bits, read back as f32.
struct Half16 {
  DType dtype;
  std::vector<uint16_t> bits;
  Half16(DType t, const std::vector<float>& x) : dtype(t), bits(x.size()) {
    for (size_t i = 0; i < x.size(); ++i) bits[i] = Round(x[i]);
  }
  uint16_t Round(float x) const { return dtype == DType::kBF16 ? FloatToBf16(x) : FloatToHalf(x); }
  float At(size_t i) const {
    return dtype == DType::kBF16 ? Bf16ToFloat(bits[i]) : HalfToFloat(bits[i]);
  }
  std::vector<float> Floats() const {
    std::vector<float> out(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) out[i] = At(i);
    return out;
  }
  Tensor View(std::initializer_list<int64_t> shape) { return Tensor(bits.data(), dtype, shape); }
};

// Each op with 16-bit data against the same op on the same values held in f32: the 16-bit op
// loads to f32, computes exactly as the f32 op and rounds once when it stores, so its result is
// the f32 result rounded once to the 16-bit dtype, bit for bit (within bf16/f16 rounding: half
// an ulp of the dtype, the least any 16-bit result can differ by). The f32 statistics
// (maxima, sums, losses) from 16-bit logits are the f32 op's exactly.
TEST(TensorParallelTest, SixteenBitDataIsTheF32ResultRoundedOnce) {
  const DeviceContext ctx = CpuContext(2);
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    const std::string what = DTypeName(dtype);
    std::mt19937 rng(11);
    std::normal_distribution<float> normal;
    auto random = [&](size_t n, float scale) {
      std::vector<float> x(n);
      for (float& v : x) v = scale * normal(rng);
      // Representable in the 16-bit dtype, so both runs read the same values.
      return Half16(dtype, x).Floats();
    };
    // Embedding forward and backward on one rank's shard (rows [4, 8) of 11), positions on.
    const int64_t b = 2, t = 5, c = 6, vl = 4, v0 = 4, positions = 8;
    std::vector<int32_t> tokens(b * t);
    for (int32_t& x : tokens) x = static_cast<int32_t>(rng() % 11);
    tokens[2] = tokens[6] = 5;  // a repeated token this rank owns
    const Tensor tok(tokens.data(), DType::kI32, {b, t});
    std::vector<float> wte = random(vl * c, 1.0f), wpe = random(positions * c, 1.0f);
    std::vector<float> dout = random(b * t * c, 1.0f);
    std::vector<float> dwte = random(vl * c, 0.1f), dwpe = random(positions * c, 0.1f);
    std::vector<float> out(b * t * c);
    Half16 wte16(dtype, wte), wpe16(dtype, wpe), dout16(dtype, dout), dwte16(dtype, dwte),
        dwpe16(dtype, dwpe), out16(dtype, out);
    ASSERT_TRUE(
        VocabShardEmbeddingForward(ctx, {.tokens = tok,
                                         .wte = Tensor(wte.data(), DType::kF32, {vl, c}),
                                         .wpe = Tensor(wpe.data(), DType::kF32, {positions, c}),
                                         .vocab_begin = v0,
                                         .out = Tensor(out.data(), DType::kF32, {b, t, c})})
            .ok());
    ASSERT_TRUE(VocabShardEmbeddingForward(ctx, {.tokens = tok,
                                                 .wte = wte16.View({vl, c}),
                                                 .wpe = wpe16.View({positions, c}),
                                                 .vocab_begin = v0,
                                                 .out = out16.View({b, t, c})})
                    .ok());
    ASSERT_TRUE(
        VocabShardEmbeddingBackward(ctx, {.tokens = tok,
                                          .dout = Tensor(dout.data(), DType::kF32, {b, t, c}),
                                          .dwte = Tensor(dwte.data(), DType::kF32, {vl, c}),
                                          .dwpe = Tensor(dwpe.data(), DType::kF32, {positions, c}),
                                          .vocab_begin = v0})
            .ok());
    ASSERT_TRUE(VocabShardEmbeddingBackward(ctx, {.tokens = tok,
                                                  .dout = dout16.View({b, t, c}),
                                                  .dwte = dwte16.View({vl, c}),
                                                  .dwpe = dwpe16.View({positions, c}),
                                                  .vocab_begin = v0})
                    .ok());
    auto expect_rounded = [&](const std::vector<float>& f32, const Half16& got, const char* arg) {
      ASSERT_EQ(f32.size(), got.bits.size());
      for (size_t i = 0; i < f32.size(); ++i) {
        EXPECT_EQ(got.bits[i], got.Round(f32[i])) << what << " " << arg << "[" << i << "]";
      }
    };
    expect_rounded(out, out16, "out");
    expect_rounded(dwte, dwte16, "dwte");
    expect_rounded(dwpe, dwpe16, "dwpe");

    // The three cross-entropy passes on one of two ranks' shards (columns [5, 10) of 9: one
    // padding column), the other rank's statistics stood in by hand.
    const int64_t n = 6, cols = 5, valid = 4;
    std::vector<float> logits = random(n * cols, 2.0f);
    std::vector<int32_t> targets = {5, 0, 8, -1, 6, 2};  // this rank's, the other's, ignored
    const Tensor t_targets(targets.data(), DType::kI32, {n});
    Half16 logits16(dtype, logits);
    std::vector<float> max(n), max16(n);
    ASSERT_TRUE(VocabShardRowMax(ctx, {.logits = Tensor(logits.data(), DType::kF32, {n, cols}),
                                       .valid = valid,
                                       .max = Tensor(max.data(), DType::kF32, {n})})
                    .ok());
    ASSERT_TRUE(VocabShardRowMax(ctx, {.logits = logits16.View({n, cols}),
                                       .valid = valid,
                                       .max = Tensor(max16.data(), DType::kF32, {n})})
                    .ok());
    EXPECT_EQ(max16, max) << what;
    std::vector<float> maxes(2 * n);
    for (int64_t r = 0; r < n; ++r) {
      maxes[r] = max[r] - 0.5f;  // rank 0's maxima (pass 1 there)
      maxes[n + r] = max[r];
    }
    std::vector<float> sums(2 * n), sums16(2 * n);
    const Tensor t_maxes(maxes.data(), DType::kF32, {2, n});
    ASSERT_TRUE(VocabShardExpSum(ctx, {.logits = Tensor(logits.data(), DType::kF32, {n, cols}),
                                       .valid = valid,
                                       .maxes = t_maxes,
                                       .targets = t_targets,
                                       .vocab_begin = 5,
                                       .sums = Tensor(sums.data(), DType::kF32, {n, 2})})
                    .ok());
    ASSERT_TRUE(VocabShardExpSum(ctx, {.logits = logits16.View({n, cols}),
                                       .valid = valid,
                                       .maxes = t_maxes,
                                       .targets = t_targets,
                                       .vocab_begin = 5,
                                       .sums = Tensor(sums16.data(), DType::kF32, {n, 2})})
                    .ok());
    EXPECT_EQ(sums16, sums) << what;
    for (int64_t r = 0; r < n; ++r) sums[2 * r] += 1.5f;  // the other rank's Σexp
    std::vector<float> losses(n), losses16(n);
    ASSERT_TRUE(
        VocabShardCrossEntropy(ctx, {.logits = Tensor(logits.data(), DType::kF32, {n, cols}),
                                     .valid = valid,
                                     .maxes = t_maxes,
                                     .sums = Tensor(sums.data(), DType::kF32, {n, 2}),
                                     .targets = t_targets,
                                     .vocab_begin = 5,
                                     .losses = Tensor(losses.data(), DType::kF32, {n}),
                                     .grad_scale = 0.25f,
                                     .write_grad = true})
            .ok());
    ASSERT_TRUE(VocabShardCrossEntropy(ctx, {.logits = logits16.View({n, cols}),
                                             .valid = valid,
                                             .maxes = t_maxes,
                                             .sums = Tensor(sums.data(), DType::kF32, {n, 2}),
                                             .targets = t_targets,
                                             .vocab_begin = 5,
                                             .losses = Tensor(losses16.data(), DType::kF32, {n}),
                                             .grad_scale = 0.25f,
                                             .write_grad = true})
                    .ok());
    EXPECT_EQ(losses16, losses) << what;
    expect_rounded(logits, logits16, "dlogits");

    // The row-parallel bias, 16-bit out and bias.
    std::vector<float> rows = random(n * c, 1.0f), bias = random(c, 1.0f);
    Half16 rows16(dtype, rows), bias16(dtype, bias);
    ASSERT_TRUE(AddRowBias(ctx, {.out = Tensor(rows.data(), DType::kF32, {n, c}),
                                 .bias = Tensor(bias.data(), DType::kF32, {c})})
                    .ok());
    ASSERT_TRUE(AddRowBias(ctx, {.out = rows16.View({n, c}), .bias = bias16.View({c})}).ok());
    expect_rounded(rows, rows16, "out + bias");
  }
  // The statistics stay f32: a 16-bit maxima buffer is refused by name.
  std::vector<uint16_t> half(6);
  std::vector<float> logits(6);
  const absl::Status bad =
      VocabShardRowMax(CpuContext(1), {.logits = Tensor(logits.data(), DType::kF32, {2, 3}),
                                       .valid = 3,
                                       .max = Tensor(half.data(), DType::kBF16, {2})});
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("max"), std::string::npos) << bad;
}

}  // namespace
}  // namespace zt
