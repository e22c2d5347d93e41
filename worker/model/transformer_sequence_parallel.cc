// Sequence parallelism's collectives for the transformer (Korthikanti et al. 2022, section
// 4.2.2): with it, the norms, the residual adds and the residual stream run on rank k's rows
// [k·B·T/t, (k+1)·B·T/t) of the flattened (B·T) tokens (for B = 1 exactly a 1/t slice of the
// sequence; every op there is row-wise, so which rows a rank holds changes nothing but the
// memory). Megatron's f and g become all-gather and reduce-scatter pairs: a column-parallel
// linear reads the group's shards of its input gathered, a row-parallel linear's partial
// products are reduce-scattered onto the shards, and the backward takes the conjugates. The
// ring cost of an all-gather plus a reduce-scatter is that of one all-reduce.
//
// One (B·T, C) workspace buffer, "tp.sequence_full", holds whatever whole-sequence tensor the
// moment needs (a gathered norm output, a row-parallel product before its reduce-scatter, a
// gathered residual gradient); its first B·T/t rows take a reduce-scatter's result. Each use
// ends before the next begins. The norm outputs are kept as shards (the plan's activations),
// so the backward gathers a norm output again for its linear's weight gradient.
#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "worker/model/transformer.h"

namespace zt {

Tensor Transformer::SequenceShardScratch() const {
  return sequence_full_.Slice(0, sequence_full_.dim(0) / tp_.size);
}

absl::StatusOr<Tensor> Transformer::GatherSequence(const Tensor& shard, const std::string& label) {
  if (shard.numel() * tp_.size != sequence_full_.numel()) {
    return absl::InternalError(absl::StrCat("sequence parallel gather '", label, "': shard ",
                                            shard.DebugString(), " is not 1/", tp_.size, " of ",
                                            sequence_full_.DebugString()));
  }
  ZT_RETURN_IF_ERROR(tp_.all_gather(shard, sequence_full_, label));
  return sequence_full_;
}

absl::Status Transformer::ScatterSequence(const Tensor& full, const Tensor& shard,
                                          const std::string& label) {
  return tp_.reduce_scatter(full, shard, label);
}

absl::StatusOr<Tensor> Transformer::ColumnParallelInput(const Tensor& normed,
                                                        const std::string& label) {
  if (!sequence_parallel()) return normed;
  return GatherSequence(normed, label);
}

absl::StatusOr<Tensor> Transformer::ColumnParallelInputGrad(const std::string& label) {
  if (!sequence_parallel()) {
    ZT_RETURN_IF_ERROR(TpAllReduce(grad_.ln, label));
    return grad_.ln;
  }
  const Tensor shard = SequenceShardScratch();
  ZT_RETURN_IF_ERROR(ScatterSequence(grad_.ln, shard, label));
  return shard;
}

Tensor Transformer::RowParallelOutput(const Tensor& out) const {
  return sequence_parallel() ? sequence_full_ : out;
}

absl::Status Transformer::ReduceRowParallelOutput(const Tensor& out, const std::string& label) {
  if (!sequence_parallel()) return TpAllReduce(out, label);
  return ScatterSequence(sequence_full_, out, label);
}

absl::StatusOr<Tensor> Transformer::RowParallelOutputGrad(const std::string& label) {
  if (!sequence_parallel()) return grad_.residual;
  return GatherSequence(grad_.residual, label);
}

absl::Status Transformer::ReduceSequenceParallelNormGrads(int u, const Tensor& grads) {
  if (!sequence_parallel() || grads.empty()) return absl::OkStatus();
  const UnitLayout& unit = layout_.units[u];
  // A frozen unit's norms (a LoRA block's) have no gradient to sum: `grads` are its adapters'
  // and the norms' went to the sink.
  if (!unit.trainable()) return absl::OkStatus();
  for (const ParamSpec& p : unit.params) {
    if (!p.name.starts_with("ln")) continue;  // ln1, ln2, ln_f: weights and biases
    ZT_RETURN_IF_ERROR(
        tp_.all_reduce(grads.Slice(p.offset, p.offset + p.numel),
                       absl::StrCat(unit.name, ".", p.name, " sequence-parallel gradient sum")));
  }
  return absl::OkStatus();
}

}  // namespace zt
