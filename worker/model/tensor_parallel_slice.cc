#include "worker/model/tensor_parallel_slice.h"

#include <algorithm>

namespace zt {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

const UnitLayout* WholeUnit(const ModelLayout& whole, const std::string& name) {
  for (const UnitLayout& u : whole.units) {
    if (u.name == name) return &u;
  }
  return nullptr;
}

void AddRange(std::vector<std::pair<int64_t, int64_t>>& out, int64_t begin, int64_t end) {
  if (begin >= end) return;
  if (!out.empty() && out.back().second == begin) {
    out.back().second = end;
  } else {
    out.emplace_back(begin, end);
  }
}

}  // namespace

TensorParallelSlice SliceOf(const zerotrain::ModelConfig& m, const std::string& name,
                            const std::vector<int64_t>& shape, int tp, int rank) {
  TensorParallelSlice s;
  s.global_rows = shape[0];
  s.global_cols = shape.size() > 1 ? shape[1] : 1;
  s.local_rows = s.global_rows;
  s.local_cols = s.global_cols;
  auto whole_rows = [&] { s.rows = {{.count = s.global_rows}}; };
  if (tp <= 1) {
    whole_rows();
    return s;
  }
  s.split = true;
  const int64_t D = m.d_model() / m.n_head();
  if (name == "wte" || name == "lm_head.weight") {
    const int64_t per = CeilDiv(s.global_rows, tp);
    const int64_t begin = std::min(s.global_rows, rank * per);
    s.local_rows = per;
    s.rows = {{.global_begin = begin, .count = std::min(s.global_rows, begin + per) - begin}};
  } else if (name == "attn.qkv.weight" || name == "attn.qkv.bias") {
    const int64_t H = m.n_head(), Hkv = m.n_kv_head();
    const int64_t hl = H / tp;
    const bool kv_split = Hkv >= tp;
    const int64_t kvl = kv_split ? Hkv / tp : 1;
    // The first KV head this rank reads: its own share, or the head of its query group.
    const int64_t kv0 = kv_split ? rank * kvl : rank * hl / (H / Hkv);
    s.local_rows = (hl + 2 * kvl) * D;
    s.rows = {{.local_begin = 0, .global_begin = rank * hl * D, .count = hl * D},
              {.local_begin = hl * D,
               .global_begin = (H + kv0) * D,
               .count = kvl * D,
               .replicated = !kv_split},
              {.local_begin = (hl + kvl) * D,
               .global_begin = (H + Hkv + kv0) * D,
               .count = kvl * D,
               .replicated = !kv_split}};
  } else if (name == "mlp.fc.weight" || name == "mlp.fc.bias") {
    const int64_t F = m.d_ff(), fl = F / tp;
    s.local_rows = s.global_rows / tp;
    s.rows = {{.global_begin = rank * fl, .count = fl}};
    // Llama's [gate | up]: each half split the same way.
    if (s.global_rows == 2 * F) s.rows.push_back({fl, F + rank * fl, fl, false});
  } else if (name == "attn.proj.weight" || name == "mlp.proj.weight") {
    s.local_cols = s.global_cols / tp;
    s.col_begin = rank * s.local_cols;
    whole_rows();
  } else {
    s.split = false;
    whole_rows();
  }
  return s;
}

void ExtractSlice(const TensorParallelSlice& s, const float* whole, float* local) {
  std::fill(local, local + s.local_rows * s.local_cols, 0.0f);
  for (const TensorParallelSlice::Rows& run : s.rows) {
    for (int64_t i = 0; i < run.count; ++i) {
      const float* from = whole + (run.global_begin + i) * s.global_cols + s.col_begin;
      std::copy(from, from + s.local_cols, local + (run.local_begin + i) * s.local_cols);
    }
  }
}

void PlaceSlice(const TensorParallelSlice& s, const float* local, float* whole) {
  for (const TensorParallelSlice::Rows& run : s.rows) {
    for (int64_t i = 0; i < run.count; ++i) {
      const float* from = local + (run.local_begin + i) * s.local_cols;
      std::copy(from, from + s.local_cols,
                whole + (run.global_begin + i) * s.global_cols + s.col_begin);
    }
  }
}

std::vector<std::pair<int64_t, int64_t>> NormCountedRanges(const zerotrain::ModelConfig& m,
                                                           const UnitLayout& local, int tp,
                                                           int rank) {
  std::vector<std::pair<int64_t, int64_t>> out;
  const ModelLayout whole = BuildModelLayout(m);
  const UnitLayout* w = WholeUnit(whole, local.name);
  // Rank 0 of each replicated KV head's group counts its rows: the group's ranks are
  // consecutive, tp / n_kv_head of them.
  const int kv_group = m.n_kv_head() >= tp ? 1 : tp / m.n_kv_head();
  for (const ParamSpec& p : local.params) {
    if (p.quantized) continue;  // not in the flat buffer (a QLoRA base's frozen weight)
    const ParamSpec* g = w != nullptr ? w->Find(p.name) : nullptr;
    const TensorParallelSlice s =
        g != nullptr ? SliceOf(m, p.name, g->shape, tp, rank) : TensorParallelSlice{};
    if (!s.split) {
      if (rank == 0) AddRange(out, p.offset, p.offset + p.numel);
      continue;
    }
    int64_t next = 0;  // local rows before `next` are handled
    for (const TensorParallelSlice::Rows& run : s.rows) {
      const bool counted = !run.replicated || rank % kv_group == 0;
      // Rows between runs are padding: zero, so counting them changes nothing.
      AddRange(out, p.offset + next * s.local_cols, p.offset + run.local_begin * s.local_cols);
      if (counted) {
        AddRange(out, p.offset + run.local_begin * s.local_cols,
                 p.offset + (run.local_begin + run.count) * s.local_cols);
      }
      next = run.local_begin + run.count;
    }
    AddRange(out, p.offset + next * s.local_cols, p.offset + p.numel);
  }
  return out;
}

std::vector<std::pair<int64_t, int64_t>> ReplicatedKvRanges(const zerotrain::ModelConfig& m,
                                                            const UnitLayout& local, int tp,
                                                            int rank) {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (tp <= 1 || m.n_kv_head() >= tp || local.kind != UnitKind::kBlock) return out;
  const ModelLayout whole = BuildModelLayout(m);
  const UnitLayout* w = WholeUnit(whole, local.name);
  for (const char* name : {"attn.qkv.weight", "attn.qkv.bias"}) {
    const ParamSpec* p = local.Find(name);
    if (p == nullptr || w == nullptr) continue;
    const TensorParallelSlice s = SliceOf(m, name, w->Find(name)->shape, tp, rank);
    for (const TensorParallelSlice::Rows& run : s.rows) {
      if (!run.replicated) continue;
      AddRange(out, p->offset + run.local_begin * s.local_cols,
               p->offset + (run.local_begin + run.count) * s.local_cols);
    }
  }
  return out;
}

}  // namespace zt
