// The tied embedding split by rows over a ZeRO-3 shard group (VocabShardGroup,
// transformer.h; docs/memory.md, "The tied embedding at ZeRO-3"). The embedding's flat buffer
// [wte; wpe] is read as V + P rows of C and each rank owns one contiguous range of them, its
// ZeRO shard (RowAlignedShardOf): so the embedding is never gathered and its gradient never
// exists whole. The G ranks train different micro-batches, so where tensor parallelism
// all-reduces (every rank has the same rows), this gathers the group's rows and scatters the
// sums back:
//   lookup    all-gather the G·B·T tokens (and packed positions); each rank looks up the
//             rows it owns for all of them; reduce-scatter the (G·B·T, C) partial sums onto
//             each rank's B·T rows — each token and position has one owner, so the sum is
//             the whole table's lookup exactly.
//   head      all-gather the final norm's outputs and the targets; logits of the owned
//             vocabulary rows for all G·B·T rows, chunk by chunk; the parallel cross-entropy
//             over the group; dwte += its rows' gradient (complete: every row of every rank
//             was seen), and the (G·B·T, C) f32 partials of dL/d(norm output)
//             reduce-scattered in f32 and rounded once to the activations' dtype.
//   backward  all-gather dL/d(embedding output); each rank adds its rows' gradient.
// Per micro-batch and rank that is four collectives of (G − 1)·B·T·C elements and the
// token ids, in place of gathering V·C parameters and reduce-scattering V·C gradients.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "kernels/tensor_parallel.h"
#include "worker/model/activation_table.h"
#include "worker/model/transformer.h"
#include "worker/status_macros.h"

namespace zt {

absl::Status Transformer::BindVocabShardGroup(VocabShardGroup group, const Arenas& work) {
  if (!layout_.tied_embeddings || tp_.size > 1 || pipelined_) {
    return absl::FailedPreconditionError(
        "vocabulary-sharded embedding: needs a tied embedding on a model that is neither "
        "tensor-parallel nor a pipeline stage");
  }
  const UnitLayout& u = layout_.embedding();
  if (group.size < 2 || group.rank < 0 || group.rank >= group.size ||
      group.row_begin > group.row_end || group.row_end * C_ > u.numel) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocabulary-sharded embedding: rank ", group.rank, " of ", group.size, " owning rows [",
        group.row_begin, ", ", group.row_end, ") of ", u.numel / C_));
  }
  vocab_ = std::move(group);
  for (const auto& [field, name] : {std::pair{&Transformer::vocab_tokens_, "vocab.tokens"},
                                    std::pair{&Transformer::vocab_targets_, "vocab.targets"},
                                    std::pair{&Transformer::vocab_rows_, "vocab.rows"},
                                    std::pair{&Transformer::vocab_row_grads_, "vocab.row_grads"},
                                    std::pair{&Transformer::vocab_maxes_, "vocab.ce_maxes"},
                                    std::pair{&Transformer::vocab_sums_, "vocab.ce_sums"},
                                    std::pair{&Transformer::vocab_losses_, "vocab.losses"}}) {
    ZT_ASSIGN_OR_RETURN(this->*field, work.Get(name));
  }
  // Planned only where rows may restart (data.packing with learned positions): unpacked rows
  // count 0 … T − 1 on every rank, which the lookup takes from each row's own index.
  if (work.Spec("vocab.positions").ok()) {
    ZT_ASSIGN_OR_RETURN(vocab_positions_, work.Get("vocab.positions"));
  }
  // 16-bit activations: the head's input-gradient partials are summed in f32 and rounded once
  // into grad_.ln, as the one-rank head rounds its f32 GEMM once; f32 needs no copy.
  if (work.Spec("vocab.head_grad").ok()) {
    ZT_ASSIGN_OR_RETURN(vocab_head_grad_, work.Get("vocab.head_grad"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Transformer::GatherVocabPositions() {
  // No learned positions, or unpacked rows (data.packing is the job's, so every rank of the
  // group agrees): the lookup takes each row's own index 0 … T − 1, and nothing is gathered.
  if (layout_.embedding().Find("wpe") == nullptr || positions_.empty()) return Tensor();
  if (vocab_positions_.empty()) {
    return absl::FailedPreconditionError(
        "vocabulary-sharded embedding: packed positions, but the plan holds no vocab.positions");
  }
  const int64_t G = vocab_.size, BT = B_ * T_;
  const Tensor all = vocab_positions_.Reshape({vocab_positions_.numel()}).Slice(0, G * BT);
  // Gathered straight from the micro-batch's positions, as the tokens are: on a device whose
  // memory is its own they are the trainer's uploaded copy (batch.positions), which the host
  // cannot read.
  ZT_RETURN_IF_ERROR(
      vocab_.all_gather(positions_.Reshape({BT}), all, "vocab-sharded embedding positions"));
  return all.Reshape({G * B_, T_});
}

Transformer::VocabRows Transformer::VocabRowsOf(const Tensor& shard) const {
  const UnitLayout& u = layout_.embedding();
  const int64_t V = u.Find("wte")->shape[0];
  const int64_t r0 = vocab_.row_begin, r1 = vocab_.row_end;
  VocabRows rows;
  rows.vocab_begin = std::min(r0, V);
  const int64_t vocab_end = std::min(r1, V);
  const Tensor flat = shard.Reshape({shard.numel()});
  rows.wte = flat.Slice(0, (vocab_end - rows.vocab_begin) * C_)
                 .Reshape({vocab_end - rows.vocab_begin, C_});
  rows.position_begin = std::max(r0, V) - V;
  const int64_t position_end = std::max(r1, V) - V;
  if (u.Find("wpe") != nullptr && position_end > rows.position_begin) {
    rows.wpe = flat.Slice((vocab_end - rows.vocab_begin) * C_, (r1 - r0) * C_)
                   .Reshape({position_end - rows.position_begin, C_});
  }
  return rows;
}

absl::Status Transformer::VocabShardedEmbeddingForward(const DeviceContext& ctx,
                                                       const Tensor& shard) {
  const int64_t G = vocab_.size;
  const Tensor tokens = vocab_tokens_.Reshape({vocab_tokens_.numel()}).Slice(0, G * B_ * T_);
  ZT_RETURN_IF_ERROR(
      vocab_.all_gather(tokens_.Reshape({B_ * T_}), tokens, "vocab-sharded embedding tokens"));
  ZT_ASSIGN_OR_RETURN(const Tensor positions, GatherVocabPositions());
  const VocabRows rows = VocabRowsOf(shard);
  const Tensor partial = vocab_rows_.Reshape({vocab_rows_.numel()}).Slice(0, G * B_ * T_ * C_);
  ZT_RETURN_IF_ERROR(VocabShardEmbeddingForward(ctx, {.tokens = tokens.Reshape({G * B_, T_}),
                                                      .wte = rows.wte,
                                                      .wpe = rows.wpe,
                                                      .vocab_begin = rows.vocab_begin,
                                                      .position_begin = rows.position_begin,
                                                      .positions = positions,
                                                      .out = partial.Reshape({G * B_, T_, C_})}));
  return vocab_.reduce_scatter(partial, residual_[0].Reshape({B_ * T_ * C_}),
                               "vocab-sharded embedding reduce-scatter");
}

absl::Status Transformer::VocabShardedEmbeddingBackward(const DeviceContext& ctx,
                                                        const Tensor& grad_shard) {
  const int64_t G = vocab_.size;
  const Tensor dout = vocab_rows_.Reshape({vocab_rows_.numel()}).Slice(0, G * B_ * T_ * C_);
  ZT_RETURN_IF_ERROR(vocab_.all_gather(grad_.residual.Reshape({B_ * T_ * C_}), dout,
                                       "vocab-sharded embedding backward gather"));
  // The group's tokens and positions are still the forward's: nothing gathers them between.
  const Tensor positions = layout_.embedding().Find("wpe") == nullptr || positions_.empty()
                               ? Tensor()
                               : vocab_positions_.Reshape({vocab_positions_.numel()})
                                     .Slice(0, G * B_ * T_)
                                     .Reshape({G * B_, T_});
  const VocabRows rows = VocabRowsOf(grad_shard);
  return VocabShardEmbeddingBackward(ctx, {.tokens = vocab_tokens_.Reshape({vocab_tokens_.numel()})
                                                         .Slice(0, G * B_ * T_)
                                                         .Reshape({G * B_, T_}),
                                           .dout = dout.Reshape({G * B_, T_, C_}),
                                           .dwte = rows.wte,
                                           .dwpe = rows.wpe,
                                           .vocab_begin = rows.vocab_begin,
                                           .position_begin = rows.position_begin,
                                           .positions = positions});
}

absl::Status Transformer::VocabShardedHeadLoss(const DeviceContext& ctx, const Tensor& shard,
                                               const Tensor& grad_shard,
                                               const LossOptions& options) {
  const int64_t G = vocab_.size, N = G * B_ * T_;
  const Tensor lnf_all =
      vocab_rows_.Reshape({vocab_rows_.numel()}).Slice(0, N * C_).Reshape({N, C_});
  ZT_RETURN_IF_ERROR(vocab_.all_gather(lnf_.Reshape({B_ * T_ * C_}), lnf_all.Reshape({N * C_}),
                                       "vocab-sharded head gather"));
  const Tensor targets = vocab_targets_.Reshape({vocab_targets_.numel()}).Slice(0, N);
  ZT_RETURN_IF_ERROR(
      vocab_.all_gather(targets_.Reshape({B_ * T_}), targets, "vocab-sharded head targets"));
  const VocabRows rows = VocabRowsOf(shard);
  const Tensor w = rows.wte;  // (Vl, C): this rank's columns of the logits
  const int64_t Vl = w.dim(0);
  const Tensor dw = options.write_grad ? VocabRowsOf(grad_shard).wte : Tensor();
  const Tensor dlnf =
      vocab_row_grads_.Reshape({vocab_row_grads_.numel()}).Slice(0, N * C_).Reshape({N, C_});
  // As many rows a pass as the planned logits chunk holds at the widest rank's width: the
  // chunk is (rows, V) elements, so V / G columns take about G times the rows.
  const int64_t V = layout_.embedding().Find("wte")->shape[0];
  const int64_t chunk = VocabShardChunkRows(logits_.numel(), N, std::min(V, vocab_.rows_per_rank));
  const int64_t width = std::max<int64_t>(1, Vl);
  const VocabColumns columns{.size = vocab_.size,
                             .rank = vocab_.rank,
                             .vocab_begin = rows.vocab_begin,
                             .valid = Vl,
                             .all_gather = vocab_.all_gather,
                             .all_reduce = vocab_.all_reduce,
                             .maxes = vocab_maxes_,
                             .sums = vocab_sums_};
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t r1 = std::min(N, r0 + chunk);
    const Tensor logits =
        logits_.Reshape({logits_.numel()}).Slice(0, (r1 - r0) * width).Reshape({r1 - r0, width});
    const Tensor lnf = lnf_all.Slice(r0, r1);
    if (Vl > 0) {
      ZT_RETURN_IF_ERROR(LinearForward(ctx, {.inp = lnf, .weight = w, .out = logits}));
    }
    ZT_RETURN_IF_ERROR(SplitCrossEntropy(ctx, columns, logits, targets.Slice(r0, r1),
                                         vocab_losses_.Slice(r0, r1), options));
    if (!options.write_grad) continue;
    if (Vl > 0) {
      ZT_RETURN_IF_ERROR(LinearBackward(
          ctx,
          {.dout = logits, .inp = lnf, .weight = w, .dinp = dlnf.Slice(r0, r1), .dweight = dw}));
    } else {
      // No vocabulary rows here: this rank's share of dL/d(norm output) is zero.
      ZT_RETURN_IF_ERROR(Zero(ctx, dlnf.Slice(r0, r1)));
    }
  }
  if (options.write_grad) {
    // Each rank's f32 partial dL/d(norm output) over its vocabulary columns, summed in f32
    // onto the rows' own rank and rounded once into grad_.ln (16-bit activations), as the
    // one-rank head rounds its GEMM's f32 sum once: HeadBackward reads grad_.ln as without the
    // split.
    const Tensor sum = vocab_head_grad_.empty() ? grad_.ln : vocab_head_grad_;
    ZT_RETURN_IF_ERROR(vocab_.reduce_scatter(dlnf.Reshape({N * C_}), sum.Reshape({B_ * T_ * C_}),
                                             "vocab-sharded head reduce-scatter"));
    if (!vocab_head_grad_.empty()) {
      ZT_RETURN_IF_ERROR(
          Cast(ctx, vocab_head_grad_.Reshape({B_ * T_ * C_}), grad_.ln.Reshape({B_ * T_ * C_})));
    }
  }
  if (options.loss_sum.empty()) return absl::OkStatus();
  // Every rank computed every row's loss; it adds its own micro-batch's, as without the split.
  return AccumulateMeanLoss(
      ctx, {.losses = vocab_losses_.Slice(vocab_.rank * B_ * T_, (vocab_.rank + 1) * B_ * T_),
            .targets = targets_.Reshape({B_ * T_}),
            .divisor = options.loss_divisor,
            .sum = options.loss_sum});
}

}  // namespace zt
