// Tensor-parallel local ops on the CPU. Rows are independent work items; each row is summed
// in one fixed order (Σexp in double, as the fused SoftmaxCrossEntropy), so results do not
// depend on the thread count.
#include "kernels/cpu/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace zt::cpu {
namespace {

constexpr float kLowest = -std::numeric_limits<float>::infinity();

absl::Status CheckTokens(const char* op, const char* arg, const int32_t* t, int64_t n,
                         bool negative_ok) {
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] < 0 && !negative_ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", arg, "[", i, "] = ", t[i], " is negative"));
    }
  }
  return absl::OkStatus();
}

// The row maximum over every rank: the largest of the P gathered maxima.
float GlobalMax(const float* maxes, int64_t p, int64_t n, int64_t r) {
  float m = kLowest;
  for (int64_t k = 0; k < p; ++k) m = std::max(m, maxes[k * n + r]);
  return m;
}

}  // namespace

absl::Status VocabShardEmbeddingForward(const DeviceContext& ctx,
                                        const VocabShardEmbeddingForwardArgs& args) {
  const int64_t bt = args.tokens.numel(), t_len = args.tokens.dim(1);
  const int64_t vl = args.wte.dim(0), c = args.wte.dim(1);
  const int32_t* tokens = args.tokens.data<int32_t>();
  if (absl::Status s = CheckTokens("VocabShardEmbeddingForward", "tokens", tokens, bt, false);
      !s.ok()) {
    return s;
  }
  const float* wte = args.wte.data<float>();
  const float* wpe = args.wpe.empty() ? nullptr : args.wpe.data<float>();
  float* out = args.out.data<float>();
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t i = 0; i < bt; ++i) {
    const int64_t local = int64_t{tokens[i]} - args.vocab_begin;
    float* o = out + i * c;
    const float* row = local >= 0 && local < vl ? wte + local * c : nullptr;
    const float* pos = wpe ? wpe + (i % t_len) * c : nullptr;
    for (int64_t j = 0; j < c; ++j) {
      // x + 0 would be x: the position is added exactly as the whole-table embedding adds it.
      o[j] = row && pos ? row[j] + pos[j] : row ? row[j] : pos ? pos[j] : 0.0f;
    }
  }
  return absl::OkStatus();
}

absl::Status VocabShardEmbeddingBackward(const DeviceContext& ctx,
                                         const VocabShardEmbeddingBackwardArgs& args) {
  const int64_t bt = args.tokens.numel(), t_len = args.tokens.dim(1);
  const int64_t vl = args.dwte.dim(0), c = args.dwte.dim(1);
  const int32_t* tokens = args.tokens.data<int32_t>();
  const float* dout = args.dout.data<float>();
  float* dwte = args.dwte.data<float>();
  // Channels are split between threads; every thread walks the positions in order, so each
  // element's sum has one order whatever the thread count.
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t j = 0; j < c; ++j) {
    for (int64_t i = 0; i < bt; ++i) {
      const int64_t local = int64_t{tokens[i]} - args.vocab_begin;
      if (local >= 0 && local < vl) dwte[local * c + j] += dout[i * c + j];
    }
  }
  if (args.dwpe.empty()) return absl::OkStatus();
  float* dwpe = args.dwpe.data<float>();
  const int64_t b = bt / t_len;
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t t = 0; t < t_len; ++t) {
    for (int64_t bi = 0; bi < b; ++bi) {
      const float* d = dout + (bi * t_len + t) * c;
      for (int64_t j = 0; j < c; ++j) dwpe[t * c + j] += d[j];
    }
  }
  return absl::OkStatus();
}

absl::Status VocabShardRowMax(const DeviceContext& ctx, const VocabShardRowMaxArgs& args) {
  const int64_t n = args.logits.dim(0), vl = args.logits.dim(1);
  const float* logits = args.logits.data<float>();
  float* max = args.max.data<float>();
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    const float* x = logits + r * vl;
    float m = kLowest;
    for (int64_t i = 0; i < args.valid; ++i) m = x[i] > m ? x[i] : m;
    max[r] = m;
  }
  return absl::OkStatus();
}

absl::Status VocabShardExpSum(const DeviceContext& ctx, const VocabShardExpSumArgs& args) {
  const int64_t n = args.logits.dim(0), vl = args.logits.dim(1), p = args.maxes.dim(0);
  const float* logits = args.logits.data<float>();
  const float* maxes = args.maxes.data<float>();
  const int32_t* targets = args.targets.data<int32_t>();
  float* sums = args.sums.data<float>();
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    float* s = sums + 2 * r;
    if (targets[r] < 0) {
      s[0] = s[1] = 0.0f;
      continue;
    }
    const float* x = logits + r * vl;
    const float m = GlobalMax(maxes, p, n, r);
    double sum = 0;
    for (int64_t i = 0; i < args.valid; ++i) sum += std::exp(static_cast<double>(x[i] - m));
    const int64_t local = int64_t{targets[r]} - args.vocab_begin;
    s[0] = static_cast<float>(sum);
    s[1] = local >= 0 && local < args.valid ? x[local] : 0.0f;
  }
  return absl::OkStatus();
}

absl::Status VocabShardCrossEntropy(const DeviceContext& ctx,
                                    const VocabShardCrossEntropyArgs& args) {
  const int64_t n = args.logits.dim(0), vl = args.logits.dim(1), p = args.maxes.dim(0);
  float* logits = args.logits.data<float>();
  const float* maxes = args.maxes.data<float>();
  const float* sums = args.sums.data<float>();
  const int32_t* targets = args.targets.data<int32_t>();
  float* losses = args.losses.data<float>();
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    float* x = logits + r * vl;
    if (targets[r] < 0) {
      losses[r] = 0.0f;
      if (args.write_grad) std::fill(x, x + vl, 0.0f);
      continue;
    }
    const float m = GlobalMax(maxes, p, n, r);
    const double sum = sums[2 * r];
    losses[r] = static_cast<float>(static_cast<double>(m) + std::log(sum) - sums[2 * r + 1]);
    if (!args.write_grad) continue;
    const double scale = args.grad_scale;
    for (int64_t i = 0; i < args.valid; ++i) {
      x[i] = static_cast<float>(std::exp(static_cast<double>(x[i] - m)) / sum * scale);
    }
    std::fill(x + args.valid, x + vl, 0.0f);
    const int64_t local = int64_t{targets[r]} - args.vocab_begin;
    if (local >= 0 && local < args.valid) {
      // In double from the target's logit (sums[·, 1], the one rank's value): its probability
      // is often close to 1, and p − 1 would cancel in f32.
      const double e = std::exp(static_cast<double>(sums[2 * r + 1] - m));
      x[local] = static_cast<float>((e / sum - 1.0) * scale);
    }
  }
  return absl::OkStatus();
}

absl::Status AddRowBias(const DeviceContext& ctx, const AddRowBiasArgs& args) {
  const int64_t n = args.out.dim(0), c = args.out.dim(1);
  float* out = args.out.data<float>();
  const float* bias = args.bias.data<float>();
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < c; ++j) out[r * c + j] += bias[j];
  }
  return absl::OkStatus();
}

}  // namespace zt::cpu
