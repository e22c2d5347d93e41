// kernels/tensor_parallel: the vocabulary-parallel cross-entropy split over P simulated ranks
// (the collectives done here by plain sums and maxima) against a float64 softmax
// cross-entropy and the fused one-rank op; the vocabulary-parallel embedding's shares summing
// to the whole table's lookup and gradient; the row bias; a CUDA context refused cleanly.
#include "kernels/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cross_entropy.h"
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

  // No CUDA twin yet: a CUDA context is refused by name, before any pointer is read.
  DeviceContext cuda = CpuContext(1);
  cuda.device.kind = DeviceKind::kCuda;
  const absl::Status on_cuda =
      VocabShardRowMax(cuda, {.logits = Tensor(logits.data(), DType::kF32, {2, 3}),
                              .valid = 3,
                              .max = Tensor(max.data(), DType::kF32, {2})});
  EXPECT_EQ(on_cuda.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(on_cuda.message().find("VocabShardRowMax"), std::string::npos) << on_cuda;
}

}  // namespace
}  // namespace zt
