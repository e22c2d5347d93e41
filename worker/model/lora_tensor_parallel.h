// LoRA adapters on tensor-parallel ranks (Megatron's rule for PEFT): a column-parallel base
// weight (attn.qkv, mlp.fc: output rows split) keeps A (r, in) whole on every rank and splits
// B (out, r) by the rows its base weight's rows are split by; a row-parallel one (attn.proj,
// mlp.proj: input columns split) splits A by input columns and keeps B (out, r) whole. So the
// forward of a column-parallel site needs no communication, and a row-parallel site's
// h = Σ_k x_k·A_kᵀ is one all-reduce of B·T × r (docs/lora.md, "Tensor parallelism").
// With n_kv_head < tp each rank holds one KV head whole, replicated on tp / n_kv_head ranks
// (as the base's qkv rows, tensor_parallel_slice.h): the k_proj / v_proj sites' B keeps that
// head's rows, and their gradient is summed over the ranks sharing the head. Stateless.
#pragma once

#include "proto/job.pb.h"
#include "worker/model/param_layout.h"
#include "worker/model/tensor_parallel_slice.h"

namespace zt {

// Whether the site adapts a row-parallel base weight (attn.proj, mlp.proj).
bool IsRowParallelLoraSite(const LoraSite& site);

// Whether the site adapts K or V rows of the fused qkv (Llama's k_proj, v_proj): with
// n_kv_head < tp their B rows are a replicated KV head.
bool IsKvLoraSite(const LoraSite& site);

// Rewrites the sites of `unit` (a block of BuildModelLayout's, whole) into rank-share shapes at
// `tp` ranks: rows, row_begin, in and each A/B's shape and offset in the unit's adapter buffer,
// and unit.lora_numel. The rows of a qkv site are where the rank's share of attn.qkv holds them
// (its query heads', then its KV heads' K, then V: one head each when n_kv_head < tp).
void SplitLoraSites(const zerotrain::ModelConfig& model, int tp, UnitLayout& unit);

// Whether rank `rank` counts its share of the site's A (`a` true) or B in the global gradient
// norm, so that the group's sum counts every element once: a matrix replicated over the group
// on rank 0, a replicated KV head's B rows on the first rank sharing the head, a split one on
// every rank.
bool CountsLoraShareInNorm(const zerotrain::ModelConfig& model, const LoraSite& site, bool a,
                           int tp, int rank);

// Where rank `rank`'s share of the site's A (`a` true) or B sits in the whole matrix, for
// ExtractSlice / PlaceSlice. `whole` is the site of BuildModelLayout's block.
TensorParallelSlice LoraSliceOf(const zerotrain::ModelConfig& model, const LoraSite& whole, bool a,
                                int tp, int rank);

}  // namespace zt
