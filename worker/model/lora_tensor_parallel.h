// LoRA adapters on tensor-parallel ranks (Megatron's rule for PEFT): a column-parallel base
// weight (attn.qkv, mlp.fc: output rows split) keeps A (r, in) whole on every rank and splits
// B (out, r) by the rows its base weight's rows are split by; a row-parallel one (attn.proj,
// mlp.proj: input columns split) splits A by input columns and keeps B (out, r) whole. So the
// forward of a column-parallel site needs no communication, and a row-parallel site's
// h = Σ_k x_k·A_kᵀ is one all-reduce of B·T × r (docs/lora.md, "Tensor parallelism").
// Requires n_kv_head ≥ tp (KV heads split, not replicated). Stateless.
#pragma once

#include "proto/job.pb.h"
#include "worker/model/param_layout.h"
#include "worker/model/tensor_parallel_slice.h"

namespace zt {

// Whether the site adapts a row-parallel base weight (attn.proj, mlp.proj).
bool IsRowParallelLoraSite(const LoraSite& site);

// Rewrites the sites of `unit` (a block of BuildModelLayout's, whole) into rank-share shapes at
// `tp` ranks: rows, row_begin, in and each A/B's shape and offset in the unit's adapter buffer,
// and unit.lora_numel.
void SplitLoraSites(int tp, UnitLayout& unit);

// Where rank `rank`'s share of the site's A (`a` true) or B sits in the whole matrix, for
// ExtractSlice / PlaceSlice. `whole` is the site of BuildModelLayout's block.
TensorParallelSlice LoraSliceOf(const zerotrain::ModelConfig& model, const LoraSite& whole, bool a,
                                int tp, int rank);

}  // namespace zt
