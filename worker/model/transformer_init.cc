// Transformer's initial weights (worker/model/transformer.h): GPT-2's normal init drawn from
// streams keyed by (seed, unit, tensor), so every rank, stage and tensor-parallel share fills
// its own range of the one-rank model's numbers without generating the rest.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/model/tensor_parallel_slice.h"
#include "worker/model/transformer.h"

namespace zt {

namespace {

// FNV-1a: a stable hash, so initialisation streams do not depend on the standard library.
uint64_t StableHash(std::string_view s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// Writes elements [begin, end) of a stream of n draws from N(0, std) keyed by (seed, key) to
// out[0, end − begin), via Box–Muller on 53-bit uniforms in chunks of 64Ki draws, each chunk
// its own generator: the same numbers on every platform and thread count, and any range of
// the stream (a ZeRO shard) costs only the chunks it touches.
void FillNormalRange(float* out, int64_t n, int64_t begin, int64_t end, float std, uint64_t seed,
                     std::string_view key) {
  constexpr int64_t kChunk = 1 << 16;
  end = std::min(end, n);
  if (begin >= end) return;
  const int64_t first = begin / kChunk, last = (end - 1) / kChunk;
  const uint64_t base = StableHash(key, seed * 0x9E3779B97F4A7C15ull + 1);
#pragma omp parallel for schedule(static)
  for (int64_t c = first; c <= last; ++c) {
    std::mt19937_64 rng(base ^ (static_cast<uint64_t>(c) * 0xD1B54A32D192ED03ull));
    auto uniform = [&] { return (static_cast<double>(rng() >> 11) + 0.5) * 0x1p-53; };
    const int64_t chunk_end = std::min(n, (c + 1) * kChunk);
    auto put = [&](int64_t i, double v) {
      if (i >= begin && i < end) out[i - begin] = static_cast<float>(v * std);
    };
    for (int64_t i = c * kChunk; i < chunk_end; i += 2) {
      const double r = std::sqrt(-2.0 * std::log(uniform()));
      const double a = 2.0 * std::numbers::pi * uniform();
      put(i, r * std::cos(a));
      if (i + 1 < chunk_end) put(i + 1, r * std::sin(a));
    }
  }
}

}  // namespace

void Transformer::InitializeWeights(uint64_t seed) { InitializeWeights(seed, unit_params()); }

void Transformer::InitializeWeights(uint64_t seed, const std::vector<Tensor>& into) {
  for (size_t u = 0; u < layout().units.size(); ++u) {
    InitializeUnitRange(seed, static_cast<int>(u), 0, layout().units[u].numel,
                        into[u].data<float>());
  }
}

void Transformer::InitializeUnitRange(uint64_t seed, int u, int64_t begin, int64_t end,
                                      float* out) const {
  const UnitLayout& unit = layout_.units[held_units_[u]];  // a stage's u: its own units
  std::fill(out, out + (end - begin), 0.0f);               // padding past the unit's last tensor
  for (const ParamSpec& p : unit.params) {
    if (p.quantized) continue;  // not in the flat buffer: InitializeQuantizedBase
    const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo >= hi) continue;
    float* data = out + (lo - begin);
    const bool is_norm_weight = p.name.starts_with("ln") && p.name.ends_with(".weight");
    if (is_norm_weight) {
      std::fill(data, data + (hi - lo), 1.0f);
    } else if (p.shape.size() == 1) {
      std::fill(data, data + (hi - lo), 0.0f);  // biases
    } else if (pipelined_ && p.name == "lm_head.weight" && whole_layout_.tied_embeddings) {
      // The last stage's copy of the tied embedding starts as the embedding itself (under
      // tensor parallelism as the rank's vocabulary rows of it, the first stage's share).
      const UnitLayout& embedding = whole_layout_.embedding();
      const ParamSpec& wte = *embedding.Find("wte");
      if (tp_.size > 1) {
        FillInitialSlice(seed, embedding, wte, lo - p.offset, hi - p.offset, data);
      } else {
        FillInitialMatrix(seed, embedding, wte, lo - p.offset, hi - p.offset, data);
      }
    } else if (tp_.size > 1) {
      const UnitLayout& whole_unit = whole_layout_.units[&unit - layout_.units.data()];
      FillInitialSlice(seed, whole_unit, *whole_unit.Find(p.name), lo - p.offset, hi - p.offset,
                       data);
    } else {
      FillInitialMatrix(seed, unit, p, lo - p.offset, hi - p.offset, data);
    }
  }
}

void Transformer::FillInitialSlice(uint64_t seed, const UnitLayout& whole_unit,
                                   const ParamSpec& whole, int64_t begin, int64_t end,
                                   float* out) const {
  const TensorParallelSlice s = SliceOf(config_, whole.name, whole.shape, tp_.size, tp_.rank);
  std::fill(out, out + (end - begin), 0.0f);  // padding rows
  const int64_t lc = s.local_cols, gc = s.global_cols;
  std::vector<float> rows;
  for (const TensorParallelSlice::Rows& run : s.rows) {
    // The run's local rows that overlap [begin, end), generated as whole rows of the whole
    // tensor's stream (a row-parallel weight's rows are P times wider than the slice's).
    const int64_t first = std::max(run.local_begin, begin / lc);
    const int64_t last = std::min(run.local_begin + run.count, (end + lc - 1) / lc);
    if (first >= last) continue;
    const int64_t g0 = run.global_begin + (first - run.local_begin);
    rows.resize((last - first) * gc);
    FillInitialMatrix(seed, whole_unit, whole, g0 * gc, (g0 + last - first) * gc, rows.data());
    for (int64_t r = first; r < last; ++r) {
      for (int64_t c = 0; c < lc; ++c) {
        const int64_t local = r * lc + c;
        if (local >= begin && local < end) {
          out[local - begin] = rows[(r - first) * gc + s.col_begin + c];
        }
      }
    }
  }
}

void Transformer::FillInitialMatrix(uint64_t seed, const UnitLayout& unit, const ParamSpec& p,
                                    int64_t begin, int64_t end, float* out) const {
  const float std = config_.init_std();
  const float residual_std = std / std::sqrt(2.0f * static_cast<float>(config_.n_layer()));
  const bool residual_proj = p.name == "attn.proj.weight" || p.name == "mlp.proj.weight";
  FillNormalRange(out, p.numel, begin, end, residual_proj ? residual_std : std, seed,
                  absl::StrCat(unit.name, ".", p.name));
}

}  // namespace zt
