#include "worker/model/transformer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/status_macros.h"
#include "kernels/tensor_parallel.h"
#include "worker/model/lora_tensor_parallel.h"

namespace zt {

absl::Status Transformer::StageForward(const DeviceContext& ctx, const LossOptions& options) {
  if (options.write_grad && grads_.empty()) {
    return absl::FailedPreconditionError("forward with gradients on a model bound without them");
  }
  if (head_backward_due_) {
    return absl::FailedPreconditionError(
        "the last stage's forward before the backward of its previous micro-batch (the head's "
        "gradient scratch holds one)");
  }
  const int head = static_cast<int>(layout_.units.size()) - 1;
  if (chunk_is_first()) {
    ZT_ASSIGN_OR_RETURN(const Tensor p, AcquireStageUnit(0));
    ZT_RETURN_IF_ERROR(EmbeddingForward(ctx, p));
    ZT_RETURN_IF_ERROR(FinishStageUnit(0));
  }
  for (int u = std::max(first_unit_, 1); u < std::min(last_unit_, head); ++u) {
    ZT_ASSIGN_OR_RETURN(const Tensor p, AcquireStageUnit(u));
    ZT_RETURN_IF_ERROR(BlockForward(ctx, u - 1, p));
    ZT_RETURN_IF_ERROR(FinishStageUnit(u));
  }
  if (!chunk_is_last()) return absl::OkStatus();
  ZT_ASSIGN_OR_RETURN(const Tensor p, AcquireStageUnit(head));
  ZT_RETURN_IF_ERROR(HeadForward(ctx, p));
  head_grad_ = Tensor();
  if (options.write_grad) {
    ZT_ASSIGN_OR_RETURN(head_grad_, StageGradient(ctx, head));
  }
  ZT_RETURN_IF_ERROR(HeadLoss(ctx, p, head_grad_, ComputeParams(0),
                              options.write_grad && HoldsUnit(0) ? grads_.front() : Tensor(),
                              options));
  ZT_RETURN_IF_ERROR(FinishStageUnit(head));
  head_backward_due_ = options.write_grad;
  return absl::OkStatus();
}

absl::Status Transformer::StageBackward(const DeviceContext& ctx) {
  if (grads_.empty()) {
    return absl::FailedPreconditionError("backward on a model bound without gradients");
  }
  const int head = static_cast<int>(layout_.units.size()) - 1;
  if (chunk_is_last()) {
    if (!head_backward_due_) {
      return absl::FailedPreconditionError(
          "the last stage's backward without the forward (with write_grad) of its micro-batch");
    }
    head_backward_due_ = false;
    ZT_ASSIGN_OR_RETURN(const Tensor p, AcquireStageUnit(head));
    ZT_RETURN_IF_ERROR(HeadBackward(ctx, p, head_grad_));
    ZT_RETURN_IF_ERROR(FinishStageUnit(head));
    ZT_RETURN_IF_ERROR(StageGradientDone(ctx, head));
  }
  for (int u = std::min(last_unit_, head) - 1; u >= std::max(first_unit_, 1); --u) {
    ZT_ASSIGN_OR_RETURN(const Tensor p, AcquireStageUnit(u));
    // The gradient of the block's trainable buffer: its adapters' in a LoRA model.
    ZT_ASSIGN_OR_RETURN(const Tensor g, StageGradient(ctx, u));
    ZT_RETURN_IF_ERROR(BlockBackward(ctx, u - 1, p, g));
    ZT_RETURN_IF_ERROR(FinishStageUnit(u));
    ZT_RETURN_IF_ERROR(StageGradientDone(ctx, u));
  }
  if (chunk_is_first()) {
    ZT_ASSIGN_OR_RETURN(const Tensor g, StageGradient(ctx, 0));
    ZT_RETURN_IF_ERROR(EmbeddingBackward(ctx, g));
    ZT_RETURN_IF_ERROR(StageGradientDone(ctx, 0));
  }
  return absl::OkStatus();
}

Tensor Transformer::View(const UnitLayout& unit, const Tensor& flat, const char* name) const {
  const ParamSpec* p = unit.Find(name);
  if (p == nullptr || p->quantized || flat.empty()) return Tensor();
  // Parameters and gradients may be 16-bit (precision.param_dtype / grad_dtype): the view
  // keeps the buffer's dtype.
  char* data = static_cast<char*>(flat.raw()) + p->offset * DTypeSize(flat.dtype());
  if (p->shape.size() == 1) return Tensor(data, flat.dtype(), {p->shape[0]}, flat.device());
  return Tensor(data, flat.dtype(), {p->shape[0], p->shape[1]}, flat.device());
}
absl::Status Transformer::TpAllReduce(const Tensor& t, const std::string& label) {
  if (tp_.size <= 1) return absl::OkStatus();
  return tp_.all_reduce(t, label);
}

absl::Status Transformer::ReduceReplicatedKvGrads(int i, const Tensor& grads) {
  if (tp_.size <= 1) return absl::OkStatus();
  if (layout_.lora && !grads.empty()) {
    // A LoRA block's `grads` are its adapters': a column-parallel site's A is replicated and
    // each rank's gradient of it is the partial dhᵀx of its own output rows (dh = Σ_k dy_k·B_k),
    // summed here over the group so every rank steps the same A.
    // A replicated KV head's B rows (n_kv_head < tp) have, on each rank, the gradient of its own
    // query heads' share of dK / dV only: summed over the ranks sharing the head, as the base's
    // replicated KV rows are below.
    const int64_t size = DTypeSize(grads.dtype());
    const auto flat = [&](const ParamSpec& p) {
      return Tensor(static_cast<char*>(grads.raw()) + p.offset * size, grads.dtype(), {p.numel},
                    grads.device());
    };
    for (const LoraSite& site : layout_.block(i).lora) {
      if (IsRowParallelLoraSite(site)) continue;
      ZT_RETURN_IF_ERROR(tp_.all_reduce(
          flat(site.a),
          absl::StrCat(layout_.block(i).name, " ", site.hf_path, ".lora_A gradient all-reduce")));
      if (IsKvLoraSite(site) && config_.n_kv_head() < tp_.size) {
        ZT_RETURN_IF_ERROR(tp_.kv_all_reduce(
            flat(site.b),
            absl::StrCat(layout_.block(i).name, " ", site.hf_path, ".lora_B kv all-reduce")));
      }
    }
    return absl::OkStatus();
  }
  for (const auto& [begin, end] : kv_ranges_[i]) {
    ZT_RETURN_IF_ERROR(tp_.kv_all_reduce(grads.Slice(begin, end),
                                         absl::StrCat(layout_.block(i).name, " kv all-reduce")));
  }
  return absl::OkStatus();
}

absl::Status Transformer::EmbeddingForward(const DeviceContext& ctx, const Tensor& params) {
  if (vocab_sharded()) return VocabShardedEmbeddingForward(ctx, params);
  const UnitLayout& u = layout_.embedding();
  if (tp_.size > 1) {
    // Each rank looks up the tokens of its vocabulary rows (zero elsewhere); rank 0 adds the
    // positions (a packed batch's, restarting at each document), so the group's sum is the
    // whole table's embedding.
    // With sequence parallelism the sum is reduce-scattered onto the rank's token rows.
    const Tensor out = RowParallelOutput(residual_[0]).Reshape({B_, T_, C_});
    const Tensor wpe = tp_.rank == 0 ? View(u, params, "wpe") : Tensor();
    ZT_RETURN_IF_ERROR(
        VocabShardEmbeddingForward(ctx, {.tokens = tokens_,
                                         .wte = View(u, params, "wte"),
                                         .wpe = wpe,
                                         .vocab_begin = vocab_begin_,
                                         .positions = wpe.empty() ? Tensor() : positions_,
                                         .out = out}));
    return ReduceRowParallelOutput(residual_[0], "embedding all-reduce");
  }
  const Tensor wpe = View(u, params, "wpe");
  return zt::EmbeddingForward(ctx, {.tokens = tokens_,
                                    .wte = View(u, params, "wte"),
                                    .wpe = wpe,
                                    .out = residual_[0].Reshape({B_, T_, C_}),
                                    .positions = wpe.empty() ? Tensor() : positions_});
}

absl::Status Transformer::BlockForward(const DeviceContext& ctx, int i, const Tensor& params) {
  return BlockForwardImpl(ctx, i, params, /*write_output=*/true);
}

absl::Status Transformer::AttentionCore(const DeviceContext& ctx, const BlockActs& a) {
  return AttentionForward(ctx, {.qkv = a.qkv.Reshape({B_, T_, a.qkv.dim(1)}),
                                .out = a.atty.Reshape({B_, T_, H_ * D_}),
                                .lse = a.att_lse,
                                .n_head = static_cast<int>(H_),
                                .n_kv_head = static_cast<int>(Hkv_),
                                .doc_starts = doc_starts_});
}

absl::Status Transformer::MlpActivation(const DeviceContext& ctx, const BlockActs& a) {
  return gpt2_ ? GeluForward(ctx, a.fch, a.fch_act) : SwigluForward(ctx, a.fch, a.fch_act);
}

absl::Status Transformer::BlockForwardImpl(const DeviceContext& ctx, int i, const Tensor& params,
                                           bool write_output) {
  const UnitLayout& u = layout_.block(i);
  const BlockActs& a = blocks_[i];
  const Tensor& x = residual_[i];        // (BT, C) block input
  const Tensor& out = residual_[i + 1];  // (BT, C) block output

  // Attention branch: x -> ln1 -> qkv -> (rope) -> attention -> proj, added to x.
  if (gpt2_) {
    ZT_RETURN_IF_ERROR(LayerNormForward(ctx, {.inp = x,
                                              .weight = View(u, params, "ln1.weight"),
                                              .bias = View(u, params, "ln1.bias"),
                                              .out = a.ln1,
                                              .mean = a.ln1_mean,
                                              .rstd = a.ln1_rstd,
                                              .eps = config_.norm_eps()}));
  } else {
    ZT_RETURN_IF_ERROR(RmsNormForward(ctx, {.inp = x,
                                            .weight = View(u, params, "ln1.weight"),
                                            .out = a.ln1,
                                            .rstd = a.ln1_rstd,
                                            .eps = config_.norm_eps()}));
  }
  // Sequence parallelism: ln1 is the rank's token rows; qkv reads the group's, gathered.
  ZT_ASSIGN_OR_RETURN(const Tensor ln1_in,
                      ColumnParallelInput(a.ln1, absl::StrCat(u.name, " attention gather")));
  ZT_RETURN_IF_ERROR(BlockLinearForward(ctx, i, params, "attn.qkv.weight", "attn.qkv.bias", ln1_in,
                                        a.qkv));  // (BT, Q)
  const Tensor qkv3 = a.qkv.Reshape({B_, T_, a.qkv.dim(1)});
  if (!gpt2_) {
    ZT_RETURN_IF_ERROR(RopeApply(ctx, {.qkv = qkv3,
                                       .n_head = static_cast<int>(H_),
                                       .n_kv_head = static_cast<int>(Hkv_),
                                       .theta = config_.rope_theta(),
                                       .positions = positions_}));
  }
  ZT_RETURN_IF_ERROR(AttentionCore(ctx, a));
  // Row-parallel under tensor parallelism: the ranks' partial products are summed (Megatron's
  // g), then the bias is added once.
  const bool tp = tp_.size > 1;
  // (Reduce-scattered onto the rank's token rows with sequence parallelism.)
  ZT_RETURN_IF_ERROR(BlockLinearForward(ctx, i, params, "attn.proj.weight",
                                        tp ? "" : "attn.proj.bias", a.atty,
                                        RowParallelOutput(a.res2)));
  if (tp) {
    ZT_RETURN_IF_ERROR(
        ReduceRowParallelOutput(a.res2, absl::StrCat(u.name, " attention all-reduce")));
    if (gpt2_) {
      ZT_RETURN_IF_ERROR(
          AddRowBias(ctx, {.out = a.res2, .bias = View(u, params, "attn.proj.bias")}));
    }
  }
  ZT_RETURN_IF_ERROR(Add(ctx, a.res2, x, a.res2));  // res2 = x + attn(x)

  // MLP branch: res2 -> ln2 -> fc -> gelu | swiglu -> proj, added to res2.
  if (gpt2_) {
    ZT_RETURN_IF_ERROR(LayerNormForward(ctx, {.inp = a.res2,
                                              .weight = View(u, params, "ln2.weight"),
                                              .bias = View(u, params, "ln2.bias"),
                                              .out = a.ln2,
                                              .mean = a.ln2_mean,
                                              .rstd = a.ln2_rstd,
                                              .eps = config_.norm_eps()}));
  } else {
    ZT_RETURN_IF_ERROR(RmsNormForward(ctx, {.inp = a.res2,
                                            .weight = View(u, params, "ln2.weight"),
                                            .out = a.ln2,
                                            .rstd = a.ln2_rstd,
                                            .eps = config_.norm_eps()}));
  }
  ZT_ASSIGN_OR_RETURN(const Tensor ln2_in,
                      ColumnParallelInput(a.ln2, absl::StrCat(u.name, " mlp gather")));
  ZT_RETURN_IF_ERROR(BlockLinearForward(ctx, i, params, "mlp.fc.weight", "mlp.fc.bias", ln2_in,
                                        a.fch));  // (BT, F) | (BT, 2F)
  ZT_RETURN_IF_ERROR(MlpActivation(ctx, a));
  // A recompute for the backward stops here: the block's output is kept already.
  if (!write_output) return absl::OkStatus();
  ZT_RETURN_IF_ERROR(BlockLinearForward(ctx, i, params, "mlp.proj.weight",
                                        tp ? "" : "mlp.proj.bias", a.fch_act,
                                        RowParallelOutput(out)));
  if (tp) {
    ZT_RETURN_IF_ERROR(ReduceRowParallelOutput(out, absl::StrCat(u.name, " mlp all-reduce")));
    if (gpt2_) {
      ZT_RETURN_IF_ERROR(AddRowBias(ctx, {.out = out, .bias = View(u, params, "mlp.proj.bias")}));
    }
  }
  return Add(ctx, out, a.res2, out);  // out = res2 + mlp(res2)
}

absl::Status Transformer::HeadForward(const DeviceContext& ctx, const Tensor& params) {
  const UnitLayout& u = layout_.head();
  const Tensor& x = residual_.back();
  if (gpt2_) {
    return LayerNormForward(ctx, {.inp = x,
                                  .weight = View(u, params, "ln_f.weight"),
                                  .bias = View(u, params, "ln_f.bias"),
                                  .out = lnf_,
                                  .mean = lnf_mean_,
                                  .rstd = lnf_rstd_,
                                  .eps = config_.norm_eps()});
  }
  return RmsNormForward(ctx, {.inp = x,
                              .weight = View(u, params, "ln_f.weight"),
                              .out = lnf_,
                              .rstd = lnf_rstd_,
                              .eps = config_.norm_eps()});
}

Tensor Transformer::HeadWeight(const Tensor& params, const Tensor& embedding_params) const {
  return layout_.tied_embeddings ? View(layout_.embedding(), embedding_params, "wte")
                                 : View(layout_.head(), params, "lm_head.weight");
}

absl::Status Transformer::HeadLoss(const DeviceContext& ctx, const Tensor& params,
                                   const Tensor& grads, const Tensor& embedding_params,
                                   const Tensor& embedding_grads, const LossOptions& options) {
  if (vocab_sharded()) {
    // The tied head's weight is the embedding's wte: each rank projects onto its own rows.
    return VocabShardedHeadLoss(ctx, embedding_params, embedding_grads, options);
  }
  const Tensor w = HeadWeight(params, embedding_params);
  const Tensor dw = options.write_grad ? HeadWeight(grads, embedding_grads) : Tensor();
  const Tensor targets = targets_.Reshape({B_ * T_});
  // The logits exist one chunk of rows at a time: project, fuse softmax + cross-entropy
  // (overwriting the chunk with dL/dlogits), then, when training, the projection's backward
  // for the chunk — so (B·T, V) logits are never held at once.
  // Sequence parallelism: the final norm ran on the rank's token rows; the head reads them all.
  ZT_ASSIGN_OR_RETURN(const Tensor lnf_all, ColumnParallelInput(lnf_, "head gather"));
  const int64_t chunk = logits_.dim(0);
  for (int64_t r0 = 0; r0 < B_ * T_; r0 += chunk) {
    const int64_t r1 = std::min(B_ * T_, r0 + chunk);
    const Tensor logits = logits_.Slice(0, r1 - r0);
    const Tensor lnf = lnf_all.Slice(r0, r1);
    ZT_RETURN_IF_ERROR(LinearForward(ctx, {.inp = lnf, .weight = w, .out = logits}));
    if (tp_.size > 1) {
      ZT_RETURN_IF_ERROR(ParallelCrossEntropy(ctx, logits, targets, r0, r1, options));
    } else {
      ZT_RETURN_IF_ERROR(SoftmaxCrossEntropy(ctx, {.logits = logits,
                                                   .targets = targets.Slice(r0, r1),
                                                   .losses = losses_.Slice(r0, r1),
                                                   .grad_scale = options.grad_scale,
                                                   .write_grad = options.write_grad}));
    }
    if (options.write_grad && dw.empty()) {
      // A frozen head (LoRA): only dL/d(norm output) = dlogits · W.
      ZT_RETURN_IF_ERROR(Gemm(ctx, logits, w, grad_.ln.Slice(r0, r1), {}));
    } else if (options.write_grad) {
      ZT_RETURN_IF_ERROR(LinearBackward(ctx, {.dout = logits,
                                              .inp = lnf,
                                              .weight = w,
                                              .dinp = grad_.ln.Slice(r0, r1),
                                              .dweight = dw}));
    }
  }
  // The head's input gradient is the sum of the ranks' vocabulary shares' (Megatron's f); with
  // sequence parallelism HeadBackward reduce-scatters it onto the token rows instead.
  if (options.write_grad && !sequence_parallel()) {
    ZT_RETURN_IF_ERROR(TpAllReduce(grad_.ln, "head all-reduce"));
  }
  if (options.loss_sum.empty()) return absl::OkStatus();
  // Mean over the valid targets of this micro-batch, summed in double in a fixed order.
  return AccumulateMeanLoss(ctx, {.losses = losses_,
                                  .targets = targets,
                                  .divisor = options.loss_divisor,
                                  .sum = options.loss_sum});
}

absl::Status Transformer::ParallelCrossEntropy(const DeviceContext& ctx, const Tensor& logits,
                                               const Tensor& targets, int64_t r0, int64_t r1,
                                               const LossOptions& options) {
  return SplitCrossEntropy(ctx,
                           {.size = tp_.size,
                            .rank = tp_.rank,
                            .vocab_begin = vocab_begin_,
                            .valid = vocab_valid_,
                            .all_gather = tp_.all_gather,
                            .all_reduce = tp_.all_reduce,
                            .maxes = ce_maxes_,
                            .sums = ce_sums_},
                           logits, targets.Slice(r0, r1), losses_.Slice(r0, r1), options);
}

absl::Status Transformer::SplitCrossEntropy(const DeviceContext& ctx, const VocabColumns& columns,
                                            const Tensor& logits, const Tensor& targets,
                                            const Tensor& losses, const LossOptions& options) {
  // Three passes around two collectives, so that no rank ever holds another's logits: the row
  // maxima are gathered, the sums of exp(logit − max) and the target's logit (from the rank
  // that owns it) are summed, then each rank finishes the loss and its columns' gradient.
  const int64_t rows = logits.dim(0), P = columns.size;
  const Tensor& all_maxes = columns.maxes;
  const Tensor maxes = all_maxes.Reshape({all_maxes.numel()}).Slice(0, P * rows).Reshape({P, rows});
  const Tensor mine =
      maxes.Reshape({P * rows}).Slice(columns.rank * rows, (columns.rank + 1) * rows);
  const Tensor sums =
      columns.sums.Reshape({columns.sums.numel()}).Slice(0, 2 * rows).Reshape({rows, 2});
  ZT_RETURN_IF_ERROR(
      VocabShardRowMax(ctx, {.logits = logits, .valid = columns.valid, .max = mine}));
  ZT_RETURN_IF_ERROR(columns.all_gather(mine, maxes.Reshape({P * rows}), "head logit maxima"));
  ZT_RETURN_IF_ERROR(VocabShardExpSum(ctx, {.logits = logits,
                                            .valid = columns.valid,
                                            .maxes = maxes,
                                            .targets = targets,
                                            .vocab_begin = columns.vocab_begin,
                                            .sums = sums}));
  ZT_RETURN_IF_ERROR(columns.all_reduce(sums, "head softmax sums"));
  return VocabShardCrossEntropy(ctx, {.logits = logits,
                                      .valid = columns.valid,
                                      .maxes = maxes,
                                      .sums = sums,
                                      .targets = targets,
                                      .vocab_begin = columns.vocab_begin,
                                      .losses = losses,
                                      .grad_scale = options.grad_scale,
                                      .write_grad = options.write_grad});
}

absl::Status Transformer::ForwardToHead(const DeviceContext& ctx) {
  ZT_RETURN_IF_ERROR(EmbeddingForward(ctx, params_.front()));
  for (int i = 0; i < layout_.n_blocks(); ++i) {
    ZT_RETURN_IF_ERROR(BlockForward(ctx, i, params_[1 + i]));
  }
  return HeadForward(ctx, params_.back());
}

absl::Status Transformer::ForwardLogits(const DeviceContext& ctx) {
  if (pipelined_) {
    return absl::FailedPreconditionError(
        "forward to logits (sampling) on a pipeline stage: sample from a one-rank model");
  }
  if (tp_.size > 1) {
    return absl::UnimplementedError(
        "forward to logits (sampling) on a tensor-parallel model: each rank holds a vocabulary "
        "shard of the logits; sample from a one-rank model");
  }
  if (logits_.dim(0) != B_ * T_) {
    return absl::FailedPreconditionError(
        "forward to logits needs a plan with a logit for every position (PlanInference); a "
        "training plan holds one loss chunk");
  }
  ZT_RETURN_IF_ERROR(ForwardToHead(ctx));
  return LinearForward(
      ctx, {.inp = lnf_, .weight = HeadWeight(params_.back(), params_.front()), .out = logits_});
}

absl::StatusOr<double> Transformer::ForwardLoss(const DeviceContext& ctx,
                                                const LossOptions& options) {
  if (pipelined_) {
    return absl::FailedPreconditionError(
        "ForwardLoss on a pipeline stage: the schedule runs StageForward / StageBackward");
  }
  if (options.write_grad && grads_.empty()) {
    return absl::FailedPreconditionError("forward with gradients on a model bound without them");
  }
  ZT_RETURN_IF_ERROR(ForwardToHead(ctx));
  // The loss accumulates into a host double: an f64 seen as 2 f32 slots (a CPU tensor, so a
  // context on another device is refused by the op, naming both devices).
  double loss = 0;
  LossOptions with_sum = options;
  with_sum.loss_sum = Tensor(&loss, DType::kF32, {2});
  with_sum.loss_divisor = 1.0;
  ZT_RETURN_IF_ERROR(HeadLoss(ctx, params_.back(), options.write_grad ? grads_.back() : Tensor(),
                              params_.front(), options.write_grad ? grads_.front() : Tensor(),
                              with_sum));
  return loss;
}

absl::Status Transformer::HeadBackward(const DeviceContext& ctx, const Tensor& params,
                                       const Tensor& grads) {
  // HeadLoss already ran the projection's backward: grad_.ln holds dL/d(final norm output).
  const UnitLayout& u = layout_.head();
  const Tensor& x = residual_.back();
  // The frozen norms' unused weight gradients add into the sink: emptied at the start of each
  // backward, so it holds one backward's sums and never grows into inf or NaN.
  if (!lora_.norm_sink.empty()) ZT_RETURN_IF_ERROR(Zero(ctx, lora_.norm_sink));
  // With sequence parallelism the rank's token rows of it, summed over the group.
  Tensor dout = grad_.ln;
  if (sequence_parallel()) {
    dout = SequenceShardScratch();
    ZT_RETURN_IF_ERROR(ScatterSequence(grad_.ln, dout, "head backward reduce-scatter"));
  }
  if (gpt2_) {
    return LayerNormBackward(ctx, {.dout = dout,
                                   .inp = x,
                                   .weight = View(u, params, "ln_f.weight"),
                                   .mean = lnf_mean_,
                                   .rstd = lnf_rstd_,
                                   .dinp = grad_.residual,
                                   .dweight = NormGrad(u, grads, "ln_f.weight"),
                                   .dbias = NormGrad(u, grads, "ln_f.bias")});
  }
  return RmsNormBackward(ctx, {.dout = dout,
                               .inp = x,
                               .weight = View(u, params, "ln_f.weight"),
                               .rstd = lnf_rstd_,
                               .dinp = grad_.residual,
                               .dweight = NormGrad(u, grads, "ln_f.weight")});
}

absl::Status Transformer::BlockBackward(const DeviceContext& ctx, int i, const Tensor& params,
                                        const Tensor& grads) {
  const UnitLayout& u = layout_.block(i);
  const BlockActs& a = blocks_[i];
  const Tensor& x = residual_[i];
  switch (a.recompute) {
    case Recompute::kFull:
      ZT_RETURN_IF_ERROR(BlockForwardImpl(ctx, i, params, /*write_output=*/false));
      break;
    case Recompute::kSelective:
      ZT_RETURN_IF_ERROR(AttentionCore(ctx, a));
      ZT_RETURN_IF_ERROR(MlpActivation(ctx, a));
      break;
    case Recompute::kNone:
      break;
  }
  // grad_.residual holds dL/d(block output) on entry and dL/d(block input) on exit: both
  // branches add their input gradient to it in place.

  // With sequence parallelism grad_.residual and the norms' tensors are the rank's token rows:
  // a row-parallel backward reads the group's rows of its output gradient gathered, a
  // column-parallel one its input (ln1, ln2) gathered again, and its input gradient is
  // reduce-scattered onto the rows (the conjugates of the forward's collectives).

  // MLP branch, reversed.
  ZT_ASSIGN_OR_RETURN(const Tensor mlp_dout,
                      RowParallelOutputGrad(absl::StrCat(u.name, " mlp backward gather")));
  ZT_RETURN_IF_ERROR(BlockLinearBackward(ctx, i, params, grads, "mlp.proj.weight", "mlp.proj.bias",
                                         mlp_dout, a.fch_act, grad_.fch_act));
  if (gpt2_) {
    ZT_RETURN_IF_ERROR(GeluBackward(ctx, a.fch, grad_.fch_act, grad_.fch));
  } else {
    ZT_RETURN_IF_ERROR(SwigluBackward(ctx, a.fch, grad_.fch_act, grad_.fch));
  }
  ZT_ASSIGN_OR_RETURN(const Tensor ln2_in,
                      ColumnParallelInput(a.ln2, absl::StrCat(u.name, " mlp input regather")));
  ZT_RETURN_IF_ERROR(BlockLinearBackward(ctx, i, params, grads, "mlp.fc.weight", "mlp.fc.bias",
                                         grad_.fch, ln2_in, grad_.ln));
  // Column-parallel input: the ranks' shares of dL/d(ln2 output) sum (Megatron's f backward).
  ZT_ASSIGN_OR_RETURN(const Tensor dln2,
                      ColumnParallelInputGrad(absl::StrCat(u.name, " mlp backward all-reduce")));
  if (gpt2_) {
    ZT_RETURN_IF_ERROR(LayerNormBackward(ctx, {.dout = dln2,
                                               .inp = a.res2,
                                               .weight = View(u, params, "ln2.weight"),
                                               .mean = a.ln2_mean,
                                               .rstd = a.ln2_rstd,
                                               .dinp = grad_.residual,
                                               .dweight = NormGrad(u, grads, "ln2.weight"),
                                               .dbias = NormGrad(u, grads, "ln2.bias"),
                                               .dinp_mode = Accumulate::kAdd}));
  } else {
    ZT_RETURN_IF_ERROR(RmsNormBackward(ctx, {.dout = dln2,
                                             .inp = a.res2,
                                             .weight = View(u, params, "ln2.weight"),
                                             .rstd = a.ln2_rstd,
                                             .dinp = grad_.residual,
                                             .dweight = NormGrad(u, grads, "ln2.weight"),
                                             .dinp_mode = Accumulate::kAdd}));
  }

  // Attention branch, reversed.
  ZT_ASSIGN_OR_RETURN(const Tensor attn_dout,
                      RowParallelOutputGrad(absl::StrCat(u.name, " attention backward gather")));
  ZT_RETURN_IF_ERROR(BlockLinearBackward(ctx, i, params, grads, "attn.proj.weight",
                                         "attn.proj.bias", attn_dout, a.atty, grad_.atty));
  const int64_t Q = a.qkv.dim(1);
  ZT_RETURN_IF_ERROR(AttentionBackward(ctx, {.qkv = a.qkv.Reshape({B_, T_, Q}),
                                             .out = a.atty.Reshape({B_, T_, H_ * D_}),
                                             .lse = a.att_lse,
                                             .dout = grad_.atty.Reshape({B_, T_, H_ * D_}),
                                             .dqkv = grad_.qkv.Reshape({B_, T_, Q}),
                                             .n_head = static_cast<int>(H_),
                                             .n_kv_head = static_cast<int>(Hkv_),
                                             .doc_starts = doc_starts_}));
  if (!gpt2_) {
    // RoPE is a rotation: its backward rotates dq, dk back by −θ.
    ZT_RETURN_IF_ERROR(RopeApply(ctx, {.qkv = grad_.qkv.Reshape({B_, T_, Q}),
                                       .n_head = static_cast<int>(H_),
                                       .n_kv_head = static_cast<int>(Hkv_),
                                       .theta = config_.rope_theta(),
                                       .positions = positions_,
                                       .direction = RopeDirection::kInverse}));
  }
  ZT_ASSIGN_OR_RETURN(const Tensor ln1_in,
                      ColumnParallelInput(a.ln1, absl::StrCat(u.name, " attention regather")));
  ZT_RETURN_IF_ERROR(BlockLinearBackward(ctx, i, params, grads, "attn.qkv.weight", "attn.qkv.bias",
                                         grad_.qkv, ln1_in, grad_.ln));
  ZT_ASSIGN_OR_RETURN(const Tensor dln1, ColumnParallelInputGrad(absl::StrCat(
                                             u.name, " attention backward all-reduce")));
  if (gpt2_) {
    return LayerNormBackward(ctx, {.dout = dln1,
                                   .inp = x,
                                   .weight = View(u, params, "ln1.weight"),
                                   .mean = a.ln1_mean,
                                   .rstd = a.ln1_rstd,
                                   .dinp = grad_.residual,
                                   .dweight = NormGrad(u, grads, "ln1.weight"),
                                   .dbias = NormGrad(u, grads, "ln1.bias"),
                                   .dinp_mode = Accumulate::kAdd});
  }
  return RmsNormBackward(ctx, {.dout = dln1,
                               .inp = x,
                               .weight = View(u, params, "ln1.weight"),
                               .rstd = a.ln1_rstd,
                               .dinp = grad_.residual,
                               .dweight = NormGrad(u, grads, "ln1.weight"),
                               .dinp_mode = Accumulate::kAdd});
}

absl::Status Transformer::EmbeddingBackward(const DeviceContext& ctx, const Tensor& grads) {
  if (vocab_sharded()) return VocabShardedEmbeddingBackward(ctx, grads);
  const UnitLayout& u = layout_.embedding();
  if (!u.trainable()) return absl::OkStatus();  // a frozen embedding has no gradient to take
  if (tp_.size > 1) {
    // dL/d(embedding output) is whole on every rank (gathered from the token rows' shards with
    // sequence parallelism): each takes its vocabulary rows, and every rank the positions'
    // (replicated) gradient, at the forward's (packed) positions.
    ZT_ASSIGN_OR_RETURN(const Tensor dout, RowParallelOutputGrad("embedding backward gather"));
    const Tensor dwpe = View(u, grads, "wpe");
    return VocabShardEmbeddingBackward(ctx, {.tokens = tokens_,
                                             .dout = dout.Reshape({B_, T_, C_}),
                                             .dwte = View(u, grads, "wte"),
                                             .dwpe = dwpe,
                                             .vocab_begin = vocab_begin_,
                                             .positions = dwpe.empty() ? Tensor() : positions_});
  }
  const Tensor dwpe = View(u, grads, "wpe");
  return zt::EmbeddingBackward(ctx, {.tokens = tokens_,
                                     .dout = grad_.residual.Reshape({B_, T_, C_}),
                                     .dwte = View(u, grads, "wte"),
                                     .dwpe = dwpe,
                                     .positions = dwpe.empty() ? Tensor() : positions_});
}

absl::Status Transformer::Backward(const DeviceContext& ctx) {
  if (pipelined_) {
    return absl::FailedPreconditionError(
        "Backward on a pipeline stage: the schedule runs StageForward / StageBackward");
  }
  if (grads_.empty()) {
    return absl::FailedPreconditionError("backward on a model bound without gradients");
  }
  ZT_RETURN_IF_ERROR(HeadBackward(ctx, params_.back(), grads_.back()));
  for (int i = layout_.n_blocks() - 1; i >= 0; --i) {
    // The gradient of the block's trainable buffer: its adapters' in a LoRA model.
    const Tensor& grads = layout_.lora ? lora_grads_[1 + i] : grads_[1 + i];
    ZT_RETURN_IF_ERROR(BlockBackward(ctx, i, params_[1 + i], grads));
  }
  return EmbeddingBackward(ctx, grads_.front());
}

}  // namespace zt
