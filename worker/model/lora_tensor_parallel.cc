#include "worker/model/lora_tensor_parallel.h"

namespace zt {

bool IsRowParallelLoraSite(const LoraSite& site) {
  return site.weight == "attn.proj.weight" || site.weight == "mlp.proj.weight";
}

bool IsKvLoraSite(const LoraSite& site) {
  return site.weight == "attn.qkv.weight" && (site.module == "k_proj" || site.module == "v_proj");
}

namespace {

// KV heads a rank holds and the first of them, as the base's qkv slice (tensor_parallel_slice.h):
// n_kv_head / tp split heads, or one head shared by tp / n_kv_head ranks.
struct KvHeads {
  int64_t count = 0;
  int64_t first = 0;
};
KvHeads KvHeadsOf(const zerotrain::ModelConfig& model, int tp, int rank) {
  const int64_t kv = model.n_kv_head();
  if (kv >= tp) return {.count = kv / tp, .first = rank * (kv / tp)};
  return {.count = 1, .first = rank / (tp / kv)};
}

}  // namespace

void SplitLoraSites(const zerotrain::ModelConfig& model, int tp, UnitLayout& unit) {
  if (tp <= 1) return;
  unit.lora_numel = 0;
  const int64_t head_dim = model.d_model() / model.n_head();
  const int64_t local_q_rows = model.n_head() / tp * head_dim;
  const int64_t local_kv_rows = KvHeadsOf(model, tp, 0).count * head_dim;
  for (LoraSite& site : unit.lora) {
    const int64_t r = site.a.shape[0];
    if (IsRowParallelLoraSite(site)) {
      site.in /= tp;  // A's input columns: the rank's share of the base weight's input
    } else if (IsKvLoraSite(site)) {
      // The rank's KV heads' K (or V) rows, after its query heads' rows (and its K rows).
      site.row_begin = local_q_rows + (site.module == "v_proj" ? local_kv_rows : 0);
      site.rows = local_kv_rows;
    } else {
      // The base weight's rows of every part (q, k, v; gate, up; GPT-2's fused qkv and fc)
      // divide by tp, each part's block of them the rank's.
      site.rows /= tp;
      site.row_begin /= tp;
    }
    site.a.shape = {r, site.in};
    site.a.numel = r * site.in;
    site.a.offset = unit.lora_numel;
    unit.lora_numel += site.a.numel;
    site.b.shape = {site.rows, r};
    site.b.numel = site.rows * r;
    site.b.offset = unit.lora_numel;
    unit.lora_numel += site.b.numel;
  }
}

TensorParallelSlice LoraSliceOf(const zerotrain::ModelConfig& model, const LoraSite& whole, bool a,
                                int tp, int rank) {
  const int64_t r = whole.a.shape[0];
  const bool row_parallel = IsRowParallelLoraSite(whole);
  TensorParallelSlice s;
  if (tp <= 1 || (a && !row_parallel) || (!a && row_parallel)) {
    // Replicated: the whole matrix on every rank.
    const ParamSpec& m = a ? whole.a : whole.b;
    s.global_rows = s.local_rows = m.shape[0];
    s.global_cols = s.local_cols = m.shape[1];
    s.rows = {{.local_begin = 0, .global_begin = 0, .count = m.shape[0]}};
    return s;
  }
  s.split = true;
  if (a) {
    // A (r, in) of a row-parallel site: the rank's input columns, as the base weight's.
    s.global_rows = s.local_rows = r;
    s.global_cols = whole.in;
    s.local_cols = whole.in / tp;
    s.col_begin = rank * s.local_cols;
    s.rows = {{.local_begin = 0, .global_begin = 0, .count = r}};
    return s;
  }
  // B (rows, r) of a column-parallel site: the rows of the base weight's the rank holds.
  if (IsKvLoraSite(whole)) {
    // Its KV heads' rows of K (or V); replicated on tp / n_kv_head ranks when n_kv_head < tp.
    const int64_t head_dim = model.d_model() / model.n_head();
    const KvHeads heads = KvHeadsOf(model, tp, rank);
    s.global_rows = whole.rows;
    s.local_rows = heads.count * head_dim;
    s.global_cols = s.local_cols = r;
    s.rows = {{.local_begin = 0,
               .global_begin = heads.first * head_dim,
               .count = s.local_rows,
               .replicated = model.n_kv_head() < tp}};
    // One KV head in all (n_kv_head 1): every rank holds the whole matrix, replicated as a
    // row-parallel site's B is.
    s.split = s.local_rows < s.global_rows;
    return s;
  }
  if (whole.weight == "attn.qkv.weight" && whole.row_begin == 0 &&
      whole.rows == (model.n_head() + 2 * model.n_kv_head()) * (model.d_model() / model.n_head())) {
    // GPT-2's c_attn adapts the whole fused qkv: its q, k and v runs.
    return SliceOf(model, "attn.qkv.weight", {whole.rows, r}, tp, rank);
  }
  const int64_t local = whole.rows / tp;
  s.global_rows = whole.rows;
  s.local_rows = local;
  s.global_cols = s.local_cols = r;
  s.rows = {{.local_begin = 0, .global_begin = rank * local, .count = local}};
  return s;
}

bool CountsLoraShareInNorm(const zerotrain::ModelConfig& model, const LoraSite& site, bool a,
                           int tp, int rank) {
  if (a != IsRowParallelLoraSite(site)) return rank == 0;  // replicated over the group
  if (!a && IsKvLoraSite(site) && model.n_kv_head() < tp) {
    return rank % (tp / model.n_kv_head()) == 0;  // the head's first rank
  }
  return true;
}

}  // namespace zt
