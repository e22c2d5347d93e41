// Tensor-parallel local ops on the CPU. Rows are independent work items; each row is summed
// in one fixed order (Σexp in double, as the fused SoftmaxCrossEntropy), so results do not
// depend on the thread count.
// 16-bit data (wte, wpe, out, dout, dwte, dwpe, logits, bias) is loaded to f32, computed as
// the f32 path computes it and rounded once when stored (kernels/cpu/load_store.h), as the
// whole-model ops do: a 16-bit dwte or dwpe element is its f32 sum, in position order,
// rounded once, and a 16-bit logits row becomes its f32 gradient rounded once.
#include "kernels/cpu/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/load_store.h"

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
  const Tensor& wte = args.wte;
  const Tensor& wpe = args.wpe;
  const Tensor& out = args.out;
  const int32_t* positions = args.positions.empty() ? nullptr : args.positions.data<int32_t>();
  const int64_t pl = wpe.empty() ? 0 : wpe.dim(0);
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t i = 0; i < bt; ++i) {
    const int64_t local = int64_t{tokens[i]} - args.vocab_begin;
    const int64_t local_pos = (positions ? int64_t{positions[i]} : i % t_len) - args.position_begin;
    float* o = WriteRow(out.raw(), out.dtype(), i * c, c, 0, /*load=*/false);
    const float* row =
        local >= 0 && local < vl ? ReadRow(wte.raw(), wte.dtype(), local * c, c, 1) : nullptr;
    const float* pos = local_pos >= 0 && local_pos < pl
                           ? ReadRow(wpe.raw(), wpe.dtype(), local_pos * c, c, 2)
                           : nullptr;
    for (int64_t j = 0; j < c; ++j) {
      // x + 0 would be x: the position is added exactly as the whole-table embedding adds it.
      o[j] = row && pos ? row[j] + pos[j] : row ? row[j] : pos ? pos[j] : 0.0f;
    }
    FinishRow(o, c, out.raw(), out.dtype(), i * c);
  }
  return absl::OkStatus();
}

namespace {

// table[id(i) − begin] += dout[i] for every row i whose id falls in the table's rows.
// Channels are split between threads; every thread walks the rows in order, so each
// element's sum has one order whatever the thread count. A 16-bit table's column j is
// summed in a per-thread f32 column (the rows the ids touch loaded first, stored once
// after every row was added).
template <typename IdOf>
void ScatterAddRows(const DeviceContext& ctx, int64_t n, IdOf id_of, int64_t begin,
                    const Tensor& dout, const Tensor& table) {
  const int64_t rows = table.dim(0), c = table.dim(1);
  const bool f32_table = table.dtype() == DType::kF32;
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t j = 0; j < c; ++j) {
    float* acc = f32_table ? nullptr : ScratchRow(0, rows);
    if (!f32_table) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t local = id_of(i) - begin;
        if (local >= 0 && local < rows)
          acc[local] = Load(table.raw(), table.dtype(), local * c + j);
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t local = id_of(i) - begin;
      if (local < 0 || local >= rows) continue;
      const float d = Load(dout.raw(), dout.dtype(), i * c + j);
      if (f32_table) {
        table.data<float>()[local * c + j] += d;
      } else {
        acc[local] += d;
      }
    }
    if (!f32_table) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t local = id_of(i) - begin;
        if (local >= 0 && local < rows)
          Store(table.raw(), table.dtype(), local * c + j, acc[local]);
      }
    }
  }
}

}  // namespace

absl::Status VocabShardEmbeddingBackward(const DeviceContext& ctx,
                                         const VocabShardEmbeddingBackwardArgs& args) {
  const int64_t bt = args.tokens.numel(), t_len = args.tokens.dim(1);
  const int32_t* tokens = args.tokens.data<int32_t>();
  ScatterAddRows(
      ctx, bt, [tokens](int64_t i) { return int64_t{tokens[i]}; }, args.vocab_begin, args.dout,
      args.dwte);
  if (args.dwpe.empty()) return absl::OkStatus();
  if (args.positions.empty()) {
    ScatterAddRows(
        ctx, bt, [t_len](int64_t i) { return i % t_len; }, args.position_begin, args.dout,
        args.dwpe);
  } else {
    const int32_t* positions = args.positions.data<int32_t>();
    ScatterAddRows(
        ctx, bt, [positions](int64_t i) { return int64_t{positions[i]}; }, args.position_begin,
        args.dout, args.dwpe);
  }
  return absl::OkStatus();
}

absl::Status VocabShardRowMax(const DeviceContext& ctx, const VocabShardRowMaxArgs& args) {
  const int64_t n = args.logits.dim(0), vl = args.logits.dim(1);
  const Tensor& logits = args.logits;
  float* max = args.max.data<float>();
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    const float* x = ReadRow(logits.raw(), logits.dtype(), r * vl, args.valid, 0);
    float m = kLowest;
    for (int64_t i = 0; i < args.valid; ++i) m = x[i] > m ? x[i] : m;
    max[r] = m;
  }
  return absl::OkStatus();
}

absl::Status VocabShardExpSum(const DeviceContext& ctx, const VocabShardExpSumArgs& args) {
  const int64_t n = args.logits.dim(0), vl = args.logits.dim(1), p = args.maxes.dim(0);
  const Tensor& logits = args.logits;
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
    const float* x = ReadRow(logits.raw(), logits.dtype(), r * vl, args.valid, 0);
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
  const Tensor& logits = args.logits;
  const float* maxes = args.maxes.data<float>();
  const float* sums = args.sums.data<float>();
  const int32_t* targets = args.targets.data<int32_t>();
  float* losses = args.losses.data<float>();
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    if (targets[r] < 0) {
      losses[r] = 0.0f;
      if (args.write_grad) {
        float* x = WriteRow(logits.raw(), logits.dtype(), r * vl, vl, 0, /*load=*/false);
        std::fill(x, x + vl, 0.0f);
        FinishRow(x, vl, logits.raw(), logits.dtype(), r * vl);
      }
      continue;
    }
    const float m = GlobalMax(maxes, p, n, r);
    const double sum = sums[2 * r];
    losses[r] = static_cast<float>(static_cast<double>(m) + std::log(sum) - sums[2 * r + 1]);
    if (!args.write_grad) continue;
    float* x = WriteRow(logits.raw(), logits.dtype(), r * vl, vl, 0, /*load=*/true);
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
    FinishRow(x, vl, logits.raw(), logits.dtype(), r * vl);
  }
  return absl::OkStatus();
}

absl::Status AddRowBias(const DeviceContext& ctx, const AddRowBiasArgs& args) {
  const int64_t n = args.out.dim(0), c = args.out.dim(1);
  const Tensor& out = args.out;
  const float* bias = ReadRow(args.bias.raw(), args.bias.dtype(), 0, c, 1);
  // The bias row is converted once, on this thread; each thread converts its rows of out.
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    float* o = WriteRow(out.raw(), out.dtype(), r * c, c, 0, /*load=*/true);
    for (int64_t j = 0; j < c; ++j) o[j] += bias[j];
    FinishRow(o, c, out.raw(), out.dtype(), r * c);
  }
  return absl::OkStatus();
}

}  // namespace zt::cpu
