// How each tensor of a tensor-parallel rank's layout is split, as Adafactor's factored
// statistics need it (Optimizer::TensorSplit): a weight split by its output rows (column-
// parallel: attn.qkv, mlp.fc, the vocabulary-parallel wte and lm_head) keeps whole rows, so its
// row statistics are local and its column statistics need the group's sum; a weight split by
// columns (row-parallel: attn.proj, mlp.proj) the other way round; a split bias is a part of a
// vector; replicated tensors (norms, positions, row-parallel biases) are whole on every rank.
// A replicated KV head's rows (n_kv_head < tp) sit in the qkv weight of every rank that shares
// the head: only the first of those ranks counts them in the group's sums (uncounted_rows on
// the others), so the logical matrix's statistics hold each row once.
#pragma once

#include <vector>

#include "proto/job.pb.h"
#include "worker/model/param_layout.h"
#include "worker/optim/optimizer.h"

namespace zt {

// Per unit of `local` (the rank's TensorParallelModelLayout), per tensor, its split on rank
// `rank` of `tp` (worker/model/tensor_parallel_slice.h's SliceOf). A pipeline stage's unit u is
// the whole model's held[u] (empty: every unit, in order), and a head stage's copy of a tied
// wte ("lm_head.weight" where the whole head has none) is split as wte is.
std::vector<std::vector<Optimizer::TensorSplit>> AdafactorSplits(
    const zerotrain::ModelConfig& model, const ModelLayout& local, int tp, int rank,
    const std::vector<int>& held = {});

// The same for a LoRA job's adapters: per unit of LoraAdapterLayout(local) (the units with
// adapters, in order), per tensor (each site's A then B), the split of the rank's share
// (worker/model/lora_tensor_parallel.h's LoraSliceOf): a row-parallel site's A by columns, a
// column-parallel site's B by rows (a replicated KV head's rows counted by the head's first
// rank only), the other matrix whole on every rank.
std::vector<std::vector<Optimizer::TensorSplit>> LoraAdafactorSplits(
    const zerotrain::ModelConfig& model, const ModelLayout& local, int tp, int rank,
    const std::vector<int>& held = {});

}  // namespace zt
