#include "worker/optim/adafactor_splits.h"

#include "worker/model/lora_tensor_parallel.h"
#include "worker/model/tensor_parallel_slice.h"

namespace zt {

namespace {

// A replicated KV head's rows are held by tp / n_kv_head consecutive ranks; the first of them
// counts the rows in the group's sums (as in the gradient norm, NormCountedRanges).
int KvGroup(const zerotrain::ModelConfig& model, int tp) {
  return model.n_kv_head() <= 0 || model.n_kv_head() >= tp ? 1 : tp / model.n_kv_head();
}

// The split of a matrix whose rank share is `s`.
Optimizer::TensorSplit MatrixSplit(const TensorParallelSlice& s, int rank, int kv_group) {
  Optimizer::TensorSplit split;
  if (s.split && s.local_cols == s.global_cols) {
    split.logical_rows = s.global_rows;
    for (const TensorParallelSlice::Rows& run : s.rows) {
      if (run.replicated && rank % kv_group != 0) {
        split.uncounted_rows.emplace_back(run.local_begin, run.local_begin + run.count);
      }
    }
  } else if (s.split) {
    split.logical_cols = s.global_cols;
  }
  return split;
}

}  // namespace

std::vector<std::vector<Optimizer::TensorSplit>> AdafactorSplits(
    const zerotrain::ModelConfig& model, const ModelLayout& local, int tp, int rank,
    const std::vector<int>& held) {
  const ModelLayout whole = BuildModelLayout(model);
  const int kv_group = KvGroup(model, tp);
  std::vector<std::vector<Optimizer::TensorSplit>> splits(local.units.size());
  for (size_t u = 0; u < local.units.size(); ++u) {
    const UnitLayout& whole_unit = whole.units[held.empty() ? u : held[u]];
    for (const ParamSpec& p : local.units[u].params) {
      Optimizer::TensorSplit split;
      const ParamSpec* w = whole_unit.Find(p.name);
      if (w == nullptr && p.name == "lm_head.weight") w = whole.units[0].Find("wte");
      const TensorParallelSlice s =
          w == nullptr ? TensorParallelSlice{} : SliceOf(model, w->name, w->shape, tp, rank);
      if (s.split && p.shape.size() == 1) {
        split.logical_cols = s.global_rows;  // a vector's slice counts its elements as rows
      } else {
        split = MatrixSplit(s, rank, kv_group);
      }
      splits[u].push_back(split);
    }
  }
  return splits;
}

std::vector<std::vector<Optimizer::TensorSplit>> LoraAdafactorSplits(
    const zerotrain::ModelConfig& model, const ModelLayout& local, int tp, int rank,
    const std::vector<int>& held) {
  const ModelLayout whole = BuildModelLayout(model);
  const int kv_group = KvGroup(model, tp);
  std::vector<std::vector<Optimizer::TensorSplit>> splits;
  for (size_t u = 0; u < local.units.size(); ++u) {
    if (local.units[u].lora.empty()) continue;  // not a unit of LoraAdapterLayout's
    const UnitLayout& whole_unit = whole.units[held.empty() ? u : held[u]];
    std::vector<Optimizer::TensorSplit>& unit = splits.emplace_back();
    for (const LoraSite& site : whole_unit.lora) {
      for (const bool a : {true, false}) {
        unit.push_back(MatrixSplit(LoraSliceOf(model, site, a, tp, rank), rank, kv_group));
      }
    }
  }
  return splits;
}

}  // namespace zt
