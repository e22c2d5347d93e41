// Token and position embedding on the CPU.
// Legend: B batch, T sequence, C channels, V vocabulary.
// Forward parallelizes over the B·T output rows. Backward is a scatter-add, where two
// positions with the same token hit the same dwte row: it parallelizes over blocks of
// channels instead, and each block walks the positions in order, so every dwte element is
// summed by one thread in one fixed order whatever the thread count (no atomics).
// wte, wpe, out, dout, dwte and dwpe may each be f32, bf16 or f16. A 16-bit gradient table is
// summed in f32: each channel block loads the rows the batch touches into per-thread f32
// accumulators, adds in the f32 path's order and rounds each element back once, so a 16-bit
// dwte is the f32 path's result rounded once (adding to a 16-bit row term by term would round
// at every token).
#include "kernels/cpu/embedding.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/load_store.h"

namespace zt::cpu {
namespace {

// Channels one backward work item owns: 256 bytes of a row, and C = 768 still splits into
// 12 items for the threads to share.
constexpr int64_t kChannelBlock = 64;

absl::Status CheckTokens(const char* op, const int32_t* tokens, int64_t b, int64_t t, int64_t v) {
  for (int64_t i = 0; i < b * t; ++i) {
    if (tokens[i] < 0 || tokens[i] >= v) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": tokens[", i / t, ", ", i % t, "] = ", tokens[i], " is outside [0, ", v, ")"));
    }
  }
  return absl::OkStatus();
}

// Which gradient row position bt adds to. Position bt goes to slot slot_of[bt] (bt % t when
// slot_of is null), and slot s is gradient row rows[s] (s when rows is null). A 16-bit
// gradient accumulates slot by slot in f32, so its slots are the distinct rows the batch
// touches; an f32 gradient is added to in place and its slots are the rows themselves.
struct ScatterMap {
  const int32_t* slot_of = nullptr;
  const int32_t* rows = nullptr;
  int64_t slots = 0;
  int64_t t = 1;

  int64_t Slot(int64_t bt) const { return slot_of != nullptr ? slot_of[bt] : bt % t; }
  int64_t Row(int64_t s) const { return rows != nullptr ? rows[s] : s; }
};

// The distinct tokens in ascending order (`rows`) and each position's index among them
// (`slot_of`), in the calling thread's buffers: grown on first use and kept, as ScratchRow.
ScatterMap DistinctTokens(const int32_t* tokens, int64_t bt_count) {
  thread_local std::vector<int32_t> rows, slot_of;
  rows.assign(tokens, tokens + bt_count);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  slot_of.resize(bt_count);
  for (int64_t bt = 0; bt < bt_count; ++bt) {
    slot_of[bt] =
        static_cast<int32_t>(std::lower_bound(rows.begin(), rows.end(), tokens[bt]) - rows.begin());
  }
  return ScatterMap{
      .slot_of = slot_of.data(), .rows = rows.data(), .slots = static_cast<int64_t>(rows.size())};
}

// grad[row of bt, c0 : c0 + n) += dout[bt, c0 : c0 + n) for bt = 0, 1, ... in order.
void ScatterAddBlock(const Tensor& dout, int64_t bt_count, int64_t c, int64_t c0, int64_t n,
                     const ScatterMap& map, const Tensor& grad) {
  float dout_block[kChannelBlock];
  auto source = [&](int64_t bt) -> const float* {
    if (dout.dtype() == DType::kF32) return dout.data<float>() + bt * c + c0;
    LoadRow(dout.raw(), dout.dtype(), bt * c + c0, n, dout_block);
    return dout_block;
  };
  if (grad.dtype() == DType::kF32) {
    float* g = grad.data<float>();
    for (int64_t bt = 0; bt < bt_count; ++bt) {
      const float* src = source(bt);
      float* dst = g + map.Row(map.Slot(bt)) * c + c0;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
    }
    return;
  }
  float* acc = ScratchRow(0, map.slots * n);  // slot s at acc + s·n
  for (int64_t s = 0; s < map.slots; ++s) {
    LoadRow(grad.raw(), grad.dtype(), map.Row(s) * c + c0, n, acc + s * n);
  }
  for (int64_t bt = 0; bt < bt_count; ++bt) {
    const float* src = source(bt);
    float* dst = acc + map.Slot(bt) * n;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
  }
  for (int64_t s = 0; s < map.slots; ++s) {
    StoreRow(acc + s * n, n, grad.raw(), grad.dtype(), map.Row(s) * c + c0);
  }
}

}  // namespace

absl::Status EmbeddingForward(const DeviceContext& ctx, const EmbeddingForwardArgs& args) {
  const int64_t b = args.tokens.dim(0), t = args.tokens.dim(1);
  const int64_t v = args.wte.dim(0), c = args.wte.dim(1);
  const int32_t* tokens = args.tokens.data<int32_t>();
  if (absl::Status s = CheckTokens("EmbeddingForward", tokens, b, t, v); !s.ok()) return s;
  const Tensor& wte = args.wte;  // (V, C)
  const Tensor& wpe = args.wpe;  // (P, C) or empty
  const Tensor& out = args.out;  // (B, T, C)
  const int32_t* positions = args.positions.empty() ? nullptr : args.positions.data<int32_t>();

#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t bt = 0; bt < b * t; ++bt) {
    const float* tok_row = ReadRow(wte.raw(), wte.dtype(), tokens[bt] * c, c, 0);
    float* out_row = WriteRow(out.raw(), out.dtype(), bt * c, c, 1, /*load=*/false);
    if (wpe.empty()) {
      std::copy(tok_row, tok_row + c, out_row);
    } else {
      const float* pos_row = ReadRow(
          wpe.raw(), wpe.dtype(), (positions != nullptr ? positions[bt] : bt % t) * c, c, 2);
#pragma omp simd
      for (int64_t i = 0; i < c; ++i) out_row[i] = tok_row[i] + pos_row[i];
    }
    FinishRow(out_row, c, out.raw(), out.dtype(), bt * c);
  }
  return absl::OkStatus();
}

absl::Status EmbeddingBackward(const DeviceContext& ctx, const EmbeddingBackwardArgs& args) {
  const int64_t b = args.tokens.dim(0), t = args.tokens.dim(1);
  const int64_t v = args.dwte.dim(0), c = args.dwte.dim(1);
  const int32_t* tokens = args.tokens.data<int32_t>();
  if (absl::Status s = CheckTokens("EmbeddingBackward", tokens, b, t, v); !s.ok()) return s;
  const int64_t bt_count = b * t;
  const ScatterMap wte_map = args.dwte.dtype() == DType::kF32
                                 ? ScatterMap{.slot_of = tokens, .slots = v}
                                 : DistinctTokens(tokens, bt_count);
  // Positions (packed sequences) lie in [0, t) too, so slot = row = position either way.
  const ScatterMap wpe_map{
      .slot_of = args.positions.empty() ? nullptr : args.positions.data<int32_t>(),
      .slots = t,
      .t = t};
  const int64_t blocks = (c + kChannelBlock - 1) / kChannelBlock;

#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kChannelBlock;
    const int64_t n = std::min(kChannelBlock, c - c0);
    ScatterAddBlock(args.dout, bt_count, c, c0, n, wte_map, args.dwte);  // (V, C) +=
    if (!args.dwpe.empty()) {
      ScatterAddBlock(args.dout, bt_count, c, c0, n, wpe_map, args.dwpe);  // (P, C) +=
    }
  }
  return absl::OkStatus();
}

}  // namespace zt::cpu
