// Where a tensor-parallel rank's share of each parameter sits in the whole model's tensor
// (Megatron-LM, Shoeybi et al. 2019), matching the shapes of TensorParallelModelLayout
// (worker/plan/parallel_plan.h):
//   wte, lm_head.weight    vocabulary rows [r·⌈V/P⌉, …) (the last rank's tail is padding)
//   attn.qkv.{weight,bias} its query heads' rows, then the K and V rows of its KV heads: split
//                          when n_kv_head ≥ P, else the one KV head its query heads read
//                          (those rows are replicated on P / n_kv_head ranks)
//   mlp.fc.{weight,bias}   rows / P (Llama: the gate's and the up projection's, each split)
//   attn.proj.weight, mlp.proj.weight   columns / P (row-parallel)
//   everything else        replicated whole
// Initialisation generates the whole tensor's stream and keeps the rank's slice, so a P-rank
// model starts equal to the one-rank model of the same seed; tests slice whole-model
// gradients the same way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "proto/job.pb.h"
#include "worker/model/param_layout.h"

namespace zt {

struct TensorParallelSlice {
  // Runs of local rows that are whole-tensor rows; local rows in no run are padding (zero).
  struct Rows {
    int64_t local_begin = 0;
    int64_t global_begin = 0;
    int64_t count = 0;
    bool replicated = false;  // these rows are also held by other ranks (replicated KV heads)
  };
  std::vector<Rows> rows;
  int64_t global_rows = 0;
  int64_t global_cols = 1;  // 1 for vectors
  int64_t local_rows = 0;
  int64_t local_cols = 1;
  int64_t col_begin = 0;  // the whole tensor's first column this rank holds
  bool split = false;     // false: the whole tensor, the same on every rank of the group
};

// The slice of tensor `name` (whole shape `global_shape`) on rank `rank` of `tp`.
TensorParallelSlice SliceOf(const zerotrain::ModelConfig& model, const std::string& name,
                            const std::vector<int64_t>& global_shape, int tp, int rank);

// Copies the rank's slice of `whole` (row-major, the whole tensor) into `local` (row-major,
// local_rows × local_cols); padding rows get 0.
void ExtractSlice(const TensorParallelSlice& slice, const float* whole, float* local);

// The inverse: writes the slice's real rows from `local` into their place in `whole` (padding
// rows are skipped; other elements of `whole` are left as they are).
void PlaceSlice(const TensorParallelSlice& slice, const float* local, float* whole);

// Ranges of unit `local` (a rank's TensorParallelModelLayout unit) whose elements this rank
// counts in the global gradient norm: every element of a split tensor except replicated KV
// rows held by a lower rank as well, and replicated tensors only on rank 0 — so that the sum
// of every rank's squares counts each element of the model once. Sorted, disjoint.
std::vector<std::pair<int64_t, int64_t>> NormCountedRanges(const zerotrain::ModelConfig& model,
                                                           const UnitLayout& local, int tp,
                                                           int rank);

// Ranges of the replicated KV rows of a block unit's attn.qkv weight and bias: their gradient
// is a partial sum (this rank's query heads only) until summed over the ranks that share the
// KV head. Empty when n_kv_head ≥ tp.
std::vector<std::pair<int64_t, int64_t>> ReplicatedKvRanges(const zerotrain::ModelConfig& model,
                                                            const UnitLayout& local, int tp,
                                                            int rank);

}  // namespace zt
