// The decoder-only transformer (GPT-2 and Llama families), one unit at a time.
//
// Legend: B batch, T sequence, C d_model, H heads, Hkv kv heads, D head size, Q = (H+2Hkv)·D,
// F d_ff, V vocab, L layers.
//
// Forward and backward are straight lists of op calls per unit (llm.c-style); the backward
// is the forward reversed. Each per-unit function receives that unit's flat parameter (and
// gradient) buffer as an argument instead of keeping pointers, so the sharding engine can hand
// it a gathered buffer and the offload tier can move a shard between steps.
//
// Accumulation rule: parameter gradients are added to (+=) — micro-batches accumulate —
// and the caller zeroes them at the start of a step; activation gradients are written (=),
// except the residual stream's, which every branch adds to.
//
// Activation checkpointing is read from the buffers the plan gave (the plan is the single
// source of truth, worker/model/activation_table.h): a block whose saved tensors live in the
// shared "recompute.*" set is checkpointed FULL — the backward re-runs its forward from the
// kept residual input first; a block that keeps its own tensors but takes "atty"/"att_lse"/
// "fch_act" from the shared set is SELECTIVE — the backward recomputes only the attention
// core and the MLP activation. Recompute runs the same ops on the same inputs, so gradients
// are bitwise identical to keeping everything.
//
// Not thread-safe: one model per rank thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "kernels/int8_linear.h"
#include "kernels/lora.h"
#include "kernels/nf4.h"
#include "kernels/tensor.h"
#include "proto/job.pb.h"
#include "worker/model/param_layout.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/arena.h"

namespace zt {

struct TensorParallelSlice;  // worker/model/tensor_parallel_slice.h

// The model's place in a tensor-parallel group (Megatron-LM, Shoeybi et al. 2019) and the
// group's blocking collectives, which the caller builds from its communicators (size 1: none
// are called). Each returns once the operation has finished, and labels name the unit.
struct TensorParallelGroup {
  int size = 1;
  int rank = 0;
  // data (n) on every rank becomes the sum over the group, in place.
  std::function<absl::Status(const Tensor& data, const std::string& label)> all_reduce;
  // in (n) from every rank into out (size · n), rank k's at chunk k.
  std::function<absl::Status(const Tensor& in, const Tensor& out, const std::string& label)>
      all_gather;
  // Sum over the ranks that share this rank's KV head (n_kv_head < size only).
  std::function<absl::Status(const Tensor& data, const std::string& label)> kv_all_reduce;
  // Sequence parallelism (Korthikanti et al. 2022, section 4.2.2; needs size > 1): the norms,
  // residual adds and the residual stream hold rank k's 1/size of the B·T token rows, and
  // reduce_scatter, in (size · n) on every rank → out (n) = the sum of every rank's chunk
  // `rank`, replaces the all-reduce after each row-parallel linear (and the embedding).
  bool sequence_parallel = false;
  std::function<absl::Status(const Tensor& in, const Tensor& out, const std::string& label)>
      reduce_scatter;
};

// A ZeRO-3 shard group over which a tied embedding is split by rows
// (VocabularyShardedEmbedding, worker/parallel/parallel_layout.h; docs/memory.md): [wte; wpe]
// read as V + P rows of C, rank `rank` of the `size` owning rows [row_begin, row_end). Unlike a
// tensor-parallel group, its ranks train different micro-batches: the lookup and the head run
// on all of the group's token rows, gathered, and their sums are scattered back.
struct VocabShardGroup {
  int size = 1;
  int rank = 0;
  int64_t row_begin = 0, row_end = 0;
  // Rows of each rank's shard (padding included): the widest rank's vocabulary columns are
  // min(V, rows_per_rank), which sets the head's chunk of rows on every rank alike
  // (VocabShardChunkRows), so the ranks' collectives pair up.
  int64_t rows_per_rank = 0;
  // in (n) from every rank into out (size · n), rank k's at chunk k.
  std::function<absl::Status(const Tensor& in, const Tensor& out, const std::string& label)>
      all_gather;
  // in (size · n) on every rank → out (n) = the sum over the ranks of their chunk `rank`.
  std::function<absl::Status(const Tensor& in, const Tensor& out, const std::string& label)>
      reduce_scatter;
  // data (n) on every rank becomes the sum over the group, in place.
  std::function<absl::Status(const Tensor& data, const std::string& label)> all_reduce;
};

class Transformer {
 public:
  // Binds the model to its buffers: "<unit>.params" (and "<unit>.grads" when `state` has
  // them) from `state`; activations and workspace for `batch` × `seq_len` from `work`.
  // Both may be the same Arenas. The arenas must outlive the model.
  static absl::StatusOr<Transformer> Bind(const zerotrain::ModelConfig& config, const Arenas& state,
                                          const Arenas& work, int64_t batch, int64_t seq_len);
  // A tensor-parallel rank's model (tp.size > 1): its buffers are the rank's shares
  // (TensorParallelModelLayout, worker/plan/parallel_plan.h, the plan's RankModelLayout) and
  // each block runs Megatron's split: qkv and mlp.fc column-parallel, attn.proj and mlp.proj
  // row-parallel (one all-reduce after each in the forward, their biases added once after it;
  // one after each branch's first linear in the backward), the embedding and the head
  // vocabulary-parallel with a parallel cross-entropy that never gathers the logits. Norms,
  // positions and row-parallel biases are whole on every rank, and so are their gradients.
  // Needs f32 parameters and activations, no LoRA, no NF4 base.
  static absl::StatusOr<Transformer> Bind(const zerotrain::ModelConfig& config, const Arenas& state,
                                          const Arenas& work, int64_t batch, int64_t seq_len,
                                          TensorParallelGroup tp);
  const TensorParallelGroup& tensor_parallel() const { return tp_; }
  // Splits the tied embedding over `group` (worker/model/transformer_vocab_shard.cc): from then
  // on EmbeddingForward, HeadLoss and EmbeddingBackward take the rank's shard of the
  // embedding's flat buffer ((row_end − row_begin) · C elements, then padding) where they took
  // the whole buffer, and run over the group's gathered token rows in the planned "vocab.*"
  // buffers of `work`. FailedPrecondition for an untied or tensor-parallel model.
  absl::Status BindVocabShardGroup(VocabShardGroup group, const Arenas& work);
  bool vocab_sharded() const { return vocab_.size > 1; }
  // With KV heads replicated over the group (n_kv_head < tp.size), block i's K and V rows of
  // attn.qkv hold the gradient of this rank's query heads only: sums them over the ranks
  // sharing each KV head, in `grads` (the block's accumulated gradient). Nothing otherwise.
  // The step loop calls it before each data-parallel reduction: once per step, or per
  // micro-batch on a pipeline stage that reduces per micro-batch.
  absl::Status ReduceReplicatedKvGrads(int i, const Tensor& grads);
  // Sequence parallelism: unit u's (whole-model index) norm weights and biases got the
  // gradient of this rank's token rows only: sums them over the tensor-parallel group in
  // `grads` (the unit's accumulated gradient), so every rank holds the whole gradient, as
  // without sequence parallelism (Megatron's allreduce of the sequence-parallel grads). Nothing
  // otherwise. The step loop calls it per unit before each data-parallel reduction (once per
  // step, or per micro-batch on a pipeline stage that reduces per micro-batch).
  absl::Status ReduceSequenceParallelNormGrads(int u, const Tensor& grads);

  // The units the model holds: the whole model's, or a pipeline stage's own (BindStage), in
  // order; unit_params(), unit_grads() and InitializeUnitRange index these.
  const ModelLayout& layout() const { return pipelined_ ? stage_layout_ : layout_; }
  int64_t batch() const { return B_; }
  int64_t seq_len() const { return T_; }

  // The flat buffers of each unit, in layout order.
  // With offload.params NVME a unit's view has its shard's dtype and size but no memory (the
  // shard is in the swap store; the trainer reads and writes it there).
  const std::vector<Tensor>& unit_params() const { return pipelined_ ? stage_params_ : params_; }
  const std::vector<Tensor>& unit_grads() const { return pipelined_ ? stage_grads_ : grads_; }

  // model.lora: each block's trainable adapter buffer ("<unit>.lora", f32) and its gradient,
  // empty for units without adapters (and for every unit without LoRA). The base buffers of a
  // LoRA model (unit_params) are frozen: unit_grads() holds empty tensors and nothing writes a
  // base gradient.
  // Indexed as unit_params(): a pipeline stage's own units.
  const std::vector<Tensor>& unit_lora() const { return pipelined_ ? stage_lora_ : lora_params_; }
  const std::vector<Tensor>& unit_lora_grads() const {
    return pipelined_ ? stage_lora_grads_ : lora_grads_;
  }
  // PEFT's initialisation of every adapter: A (r, in) uniform in ±1/sqrt(in) (PyTorch's
  // kaiming_uniform_(a=sqrt(5))), B zero, so a fresh adapter changes nothing. Deterministic in
  // `seed`, each matrix its own stream.
  // `into`, when given, is host memory indexed and sized as unit_lora() that receives the
  // values instead (a rank whose memory the host cannot address fills it and uploads it).
  void InitializeLora(uint64_t seed, const std::vector<Tensor>* into = nullptr);
  // Sets the held units' adapters from the one-rank model's: `whole[u]` is unit u's adapter
  // buffer in BuildModelLayout's layout (f32, its lora_numel elements; units without adapters
  // are not read). A tensor-parallel rank keeps its shares (LoraSliceOf), so a PEFT directory
  // read whole starts every layout where one rank starts. `into` as InitializeLora's.
  void SetLoraFromWhole(const std::vector<std::vector<float>>& whole,
                        const std::vector<Tensor>* into = nullptr);
  // The seed of the adapters' dropout masks for the next forward and its backward (the mask of
  // each adapter is a function of this seed, the block and the adapter); the step loop sets a
  // new one per micro-batch. Unused when model.lora.dropout is 0.
  void SetLoraDropoutSeed(uint64_t seed) { lora_seed_ = seed; }

  // base_dtype NF4: the NF4 tensor of unit u's quantized weight `name` ("attn.qkv.weight"),
  // or nullptr when that weight is not quantized (or is INT8).
  const Nf4Tensor* QuantizedWeight(int u, std::string_view name) const;
  // base_dtype INT8: the int8 codes and row scales of unit u's quantized weight `name`, or
  // nullptr when that weight is not quantized (or is NF4).
  const Int8Weight* Int8QuantizedWeight(int u, std::string_view name) const;
  // Quantizes `values` ((numel) f32, finite) into unit u's quantized weight `name` (NF4 or
  // INT8, as the base is): how a base streams in, one tensor at a time, so only one tensor is
  // ever held in f32. On a tensor-parallel rank `values` is the whole (one-rank) weight: it is
  // quantized as one rank quantizes it and the rank keeps its share, which dequantizes to the
  // one-rank dequantized weight's slice bit for bit (an NF4 share in f32-absmax form,
  // ModelLayout::nf4_absmax). InvalidArgument when the weight is not quantized, the sizes
  // differ or a value is not finite.
  absl::Status QuantizeBaseWeight(const DeviceContext& ctx, int u, std::string_view name,
                                  const Tensor& values);
  // QuantizeBaseWeight at ZeRO stage 3 into `shard` (host memory of the plan's "<unit>.qbase"
  // size) instead of the model's own shard: a swapped base (offload.params NVME) streamed from
  // model.init_from, staged on its way to the store. u is layout()'s.
  absl::Status QuantizeBaseWeightIntoShard(const DeviceContext& ctx, int u, std::string_view name,
                                           const Tensor& values, const Tensor& shard);
  // InitializeWeights' values for every quantized weight, each generated in f32 in turn and
  // quantized (the rest of the base comes from InitializeWeights, which skips these).
  absl::Status InitializeQuantizedBase(const DeviceContext& ctx, uint64_t seed);
  // ZeRO stage 3 with a quantized base: the plan holds each block's quantized bytes only as
  // the rank's shard "<unit>.qbase" (QuantizedBytesOf, worker/plan/lora_plan.h), empty for
  // units without quantized weights and everywhere below stage 3. QuantizeBaseWeight then
  // quantizes a weight into scratch of its own size and keeps the bytes of the shard of
  // `group_rank` (SetQuantizedShardRank, set before the base is filled); QuantizedWeight's
  // views are empty until the sharding engine gathers the block's bytes and binds them
  // (BindQuantizedBase) for a use.
  // A shard the plan keeps in the swap store (offload.params NVME) has no view here (empty):
  // InitializeQuantizedShard writes unit u's (of layout(): a pipeline stage's own units)
  // seeded quantized weights into `shard` (host memory of the shard's size, on its way to the
  // store) instead: the bytes InitializeQuantizedBase keeps, a tensor-parallel rank's share
  // of each whole weight quantized included.
  const std::vector<Tensor>& unit_quantized_shards() const { return qbase_shards_; }
  absl::Status InitializeQuantizedShard(const DeviceContext& ctx, uint64_t seed, int u,
                                        const Tensor& shard);
  void SetQuantizedShardRank(int group_rank) { qbase_rank_ = group_rank; }
  // A device whose memory the host cannot address (a CUDA rank): the base is still quantized on
  // the host (the quantize ops run on the CPU only), into host staging of one weight's
  // quantized bytes, and each of its buffers — or, at stage 3, the bytes of it inside the
  // rank's "<unit>.qbase" shard — is copied up with `upload` (dst device memory, from
  // dst.size_bytes() host bytes). QuantizeBaseWeight and InitializeQuantizedBase then take the
  // host's context. Unset: they quantize straight into the model's buffers, which the host
  // shares.
  using HostUpload = std::function<absl::Status(const Tensor& dst, const void* host)>;
  void SetQuantizedBaseUpload(HostUpload upload) { upload_ = std::move(upload); }
  // Points unit u's quantized weights at `gathered`, the unit's whole quantized bytes (at
  // least QuantizedBytesOf(...).bytes), which must stay valid while they are used.
  absl::Status BindQuantizedBase(int u, const Tensor& gathered);

  // Packed sequences (data.packing): the (B, S) i32 document starts (kernels/packing.h) and
  // the (B, T) i32 positions (DocumentPositions) of the forwards and backwards that follow,
  // in memory the context reads; the model keeps the views, the caller owns them and refills
  // them per micro-batch. Attention then stays inside each document and RoPE or the learned
  // positions restart at each one. Empty tensors (the default): one sequence a row.
  void SetDocuments(const Tensor& doc_starts, const Tensor& positions) {
    doc_starts_ = doc_starts;
    positions_ = positions;
  }
  // Inputs and targets of the next forward: (B, T) i32 views of the workspace.
  const Tensor& tokens() const { return tokens_; }
  const Tensor& targets() const { return targets_; }
  // (B·T, V) after ForwardLogits on an inference plan. A training plan holds one loss chunk
  // of rows (worker/model/activation_table.h), reused by HeadLoss.
  const Tensor& logits() const { return logits_; }

  // GPT-2-style initialisation from `seed`: N(0, init_std) for matrices and embeddings,
  // residual projections (attn.proj, mlp.proj) scaled by 1/sqrt(2·L), zero biases, unit
  // norm weights. Deterministic: each tensor draws from its own stream keyed by its name.
  void InitializeWeights(uint64_t seed);
  // The same values written to `into`: one f32 flat buffer per unit (the fp32 master weights
  // when the parameters themselves are 16-bit).
  void InitializeWeights(uint64_t seed, const std::vector<Tensor>& into);
  // The same initial values for elements [begin, end) of unit u's flat buffer only, written
  // to out[0, end − begin) in f32 (zero past the unit's last tensor): a ZeRO shard
  // initialises its own range without the whole unit ever existing on the rank.
  void InitializeUnitRange(uint64_t seed, int u, int64_t begin, int64_t end, float* out) const;

  struct LossOptions {
    // Also compute dL/dlogits (in place) for a backward: dlogits = grad_scale · (p − y).
    bool write_grad = false;
    // 1 / (targets in the global batch): the loss is a mean over the global batch.
    float grad_scale = 1.0f;
    // Where HeadLoss adds the mean loss / loss_divisor, on the context's device (an f64 in 2
    // f32 slots, AccumulateMeanLoss in kernels/cross_entropy.h), so the step loop reads its
    // loss once per step. Empty: not accumulated.
    Tensor loss_sum;
    double loss_divisor = 1.0;
  };
  // Forward over tokens() → mean cross-entropy over targets() (targets < 0 ignored). With
  // write_grad the output projection's backward runs here too, chunk by chunk (HeadLoss).
  // Returns the loss as a host value: for a context whose memory the host reads (the CPU);
  // elsewhere set options.loss_sum and read it back (the sharding engine does).
  absl::StatusOr<double> ForwardLoss(const DeviceContext& ctx, const LossOptions& options);
  // Forward to the logits of every position (no loss), on an inference plan: for sampling.
  absl::Status ForwardLogits(const DeviceContext& ctx);
  // Backward of the last ForwardLoss with write_grad: parameter gradients += ….
  absl::Status Backward(const DeviceContext& ctx);

  // The per-unit steps the loops above are made of, for the sharding engine.
  absl::Status EmbeddingForward(const DeviceContext& ctx, const Tensor& params);
  absl::Status BlockForward(const DeviceContext& ctx, int i, const Tensor& params);
  // The final norm.
  absl::Status HeadForward(const DeviceContext& ctx, const Tensor& params);
  // Output projection + fused softmax cross-entropy, one chunk of rows at a time, and with
  // options.write_grad the projection's backward per chunk (its weight gradient += into
  // `grads`, or into the embedding's for tied weights; dL/d(norm output) kept for
  // HeadBackward). `grads`/`embedding_grads` may be empty without write_grad. The micro-batch's
  // mean loss goes to options.loss_sum when set; nothing is read back.
  absl::Status HeadLoss(const DeviceContext& ctx, const Tensor& params, const Tensor& grads,
                        const Tensor& embedding_params, const Tensor& embedding_grads,
                        const LossOptions& options);
  // The final norm's backward.
  absl::Status HeadBackward(const DeviceContext& ctx, const Tensor& params, const Tensor& grads);
  // `grads` is the gradient of the block's trainable buffer: its flat parameters', or in a
  // LoRA model its adapters' ((lora_numel) f32 layout, "<unit>.lora_grads" or a buffer the
  // sharding engine hands out); the frozen base gets no gradient.
  absl::Status BlockBackward(const DeviceContext& ctx, int i, const Tensor& params,
                             const Tensor& grads);
  absl::Status EmbeddingBackward(const DeviceContext& ctx, const Tensor& grads);

  // A pipeline stage's model (Narayanan et al. 2021): rank layout.coordinates().pipeline of
  // `job` (pipeline_parallel > 1) binds only the units of its chunks
  // (PipelineChunksOf, the plan's partition: one chunk under GPIPE and ONE_F_ONE_B, v under
  // INTERLEAVED, rank r holding model chunks r, r + p, …) from the plan PlanMemory(job, layout)
  // made: the embedding on the first stage, the final norm, head and loss on the last. With
  // tied embeddings split across stages the last stage holds its own copy of wte
  // ("lm_head.weight" of the head unit, initialised to the same values); the caller sums the
  // two copies' gradients before the step (Megatron's).
  // layout(), unit_params() and unit_grads() are the stage's units (RankModelLayout), its
  // chunks' in model order; unit u of the stage is unit held_units()[u] of the whole model.
  // Chunk c's saved activations hold in_flight(c) micro-batches; the schedule picks a chunk and
  // slot with SelectMicroBatch before its forward and again before its backward. Its backward
  // accumulates into unit_grads(): a unit's ".grad_accum" buffer where the plan has one (ZeRO
  // stages 2–3, reduce-scattered by the engine afterwards), else its ".grads"; or, where the
  // engine reduces per micro-batch, into the buffers StageUnitSource::gradient hands out.
  // With tensor_parallel t > 1 (`tp`, the layout's TP group: size t and its tensor
  // coordinate; InvalidArgument otherwise) each of the stage's units is the rank's
  // tensor-parallel share and runs Megatron's split as Bind's does; the activations between
  // stages are the whole residual stream, the same on every rank of the TP group; the head's
  // stage runs the vocabulary-parallel head and loss, and a tied wte's copy is the rank's
  // vocabulary rows of it (the same rows as the first stage's share).
  static absl::StatusOr<Transformer> BindStage(const zerotrain::JobSpec& job,
                                               const ParallelLayout& layout, const Arenas& state,
                                               const Arenas& work, int64_t batch, int64_t seq_len,
                                               TensorParallelGroup tp = {});
  bool pipelined() const { return pipelined_; }
  // The selected chunk's units [first_unit, last_unit) of the whole model (all of them
  // unpipelined).
  int first_unit() const { return first_unit_; }
  int last_unit() const { return last_unit_; }
  // The whole model's index of each of the stage's units (0, 1, … unpipelined).
  const std::vector<int>& held_units() const { return held_units_; }
  // Whether any of the stage's chunks holds unit u.
  bool HoldsUnit(int u) const;
  // The stage holds the embedding / the head (in any chunk).
  bool is_first_stage() const { return HoldsUnit(0); }
  bool is_last_stage() const { return HoldsUnit(static_cast<int>(layout_.units.size()) - 1); }
  // The selected chunk holds the embedding / the head: its forward receives no input / sends
  // no output.
  bool chunk_is_first() const { return first_unit_ == 0; }
  bool chunk_is_last() const { return last_unit_ == static_cast<int>(layout_.units.size()); }
  int chunks() const { return static_cast<int>(chunk_ranges_.size()); }
  int in_flight(int chunk = 0) const { return chunk_ranges_[chunk].in_flight; }
  // Makes micro-batch slot `slot` (0 ≤ slot < in_flight(chunk)) of chunk `chunk` the one
  // StageForward / StageBackward run, reading and writing its activations.
  absl::Status SelectMicroBatch(int slot) { return SelectMicroBatch(0, slot); }
  absl::Status SelectMicroBatch(int chunk, int slot);
  // The selected chunk's input, the residual stream entering its first block, in the selected
  // slot: what a chunk after the model's first receives before StageForward.
  const Tensor& stage_input() const { return residual_[first_unit_ - 1]; }
  // Its output (a chunk before the model's last), the residual stream after its last unit, in
  // the selected slot (the plan keeps it on both ranks): what it sends on after StageForward.
  const Tensor& stage_output() const { return residual_[last_unit_ - 1]; }
  // dL/d(residual stream): a chunk before the model's last receives the gradient of its output
  // here before StageBackward; after it, a chunk after the model's first finds the gradient of
  // its input here, to send back.
  const Tensor& residual_grad() const { return grad_.residual; }
  // The buffers StageForward / StageBackward read unit u's parameters from, one per stage
  // unit in layout() order, each at least the unit's size: at ZeRO stage 3 unit_params() are
  // the rank's shards, and the engine gathers the whole units into these for the step.
  // Unset: unit_params().
  absl::Status SetStageComputeParams(const std::vector<Tensor>& units);
  // Where StageForward / StageBackward take each unit's parameters from instead, one use at a
  // time (ZeRO stage 3 with reshard_after_forward: the engine gathers a unit for the use and
  // frees it after, FSDP's per-use gather on a pipeline stage). `acquire(u)` (u: the whole
  // model's unit) runs before the unit's compute and returns its whole parameters; `finish(u)`
  // right after the compute that read them. The forward uses each unit of the selected chunk in
  // model order (the head once, for HeadForward and HeadLoss); the backward uses them in
  // reverse, except the embedding, whose backward reads no parameters. Unset (both empty):
  // SetStageComputeParams' buffers or unit_params().
  // `gradient` and `gradient_done`, where set (the engine reduces each micro-batch's gradients
  // as they end: StageGradientsPerMicroBatch), take the place of unit_grads(): `gradient(u)`
  // returns the zeroed buffer unit u's gradient of this micro-batch goes into (its trainable
  // buffer's: a LoRA block's adapters; empty for a frozen unit), asked for right before the
  // first write — the head's in its StageForward (the projection's backward in HeadLoss), the
  // others' in StageBackward — and `gradient_done(u)` runs after the last write (the head's
  // after HeadBackward).
  struct StageUnitSource {
    std::function<absl::StatusOr<Tensor>(int unit)> acquire;
    std::function<absl::Status(int unit)> finish;
    std::function<absl::StatusOr<Tensor>(const DeviceContext& ctx, int unit)> gradient;
    std::function<absl::Status(const DeviceContext& ctx, int unit)> gradient_done;
  };
  void SetStageUnitSource(StageUnitSource source) { unit_source_ = std::move(source); }
  // Chunk c's units [first, last) of the whole model, in model order.
  std::pair<int, int> ChunkUnits(int c) const {
    return {chunk_ranges_[c].first_unit, chunk_ranges_[c].last_unit};
  }
  // The selected micro-batch's forward through the stage: the embedding of tokens() on the
  // first stage, the stage's blocks, and on the last the final norm and the loss over
  // targets() (options as ForwardLoss; with write_grad the projection's backward too, as
  // HeadLoss). On the last stage with write_grad its StageBackward must follow before the next
  // StageForward (the head's gradient scratch holds one micro-batch; every schedule does so).
  absl::Status StageForward(const DeviceContext& ctx, const LossOptions& options);
  // The selected micro-batch's backward through the stage, parameter gradients += into
  // unit_grads(); the first stage's embedding backward reads tokens(), which must hold this
  // micro-batch's tokens again.
  absl::Status StageBackward(const DeviceContext& ctx);

 private:
  // Where InitializeLora / SetLoraFromWhole write unit u's (of layout_) adapters.
  float* LoraTarget(int u, const std::vector<Tensor>* into) const;
  enum class Recompute : uint8_t { kNone, kFull, kSelective };
  struct BlockActs {
    Tensor ln1, ln1_mean, ln1_rstd, qkv, atty, att_lse, res2, ln2, ln2_mean, ln2_rstd, fch, fch_act;
    std::vector<Tensor> lora_h;  // per LoraSite: (BT, r) scale · dropout(x) · Aᵀ
    Recompute recompute = Recompute::kNone;
  };
  struct LoraScratch {
    Tensor out, dout, dh, dinp, dropped, norm_sink;
  };
  // The base linear `weight` (+ `bias`) of block i and, with LoRA, its adapters:
  // out = inp · Wᵀ + b + Σ_sites scale · (dropout(inp) · Aᵀ) · Bᵀ into the sites' columns.
  absl::Status BlockLinearForward(const DeviceContext& ctx, int i, const Tensor& params,
                                  const char* weight, const char* bias, const Tensor& inp,
                                  const Tensor& out);
  // Its backward: dinp = dout · W (+ the adapters' input gradients); a trainable base adds
  // dweight/dbias into `grads`, the adapters add dA, dB into the block's adapter gradients.
  absl::Status BlockLinearBackward(const DeviceContext& ctx, int i, const Tensor& params,
                                   const Tensor& grads, const char* weight, const char* bias,
                                   const Tensor& dout, const Tensor& inp, const Tensor& dinp);
  // Where a norm's weight/bias gradient goes: its view in `grads`, or for a frozen unit the
  // sink (which nothing reads).
  Tensor NormGrad(const UnitLayout& unit, const Tensor& grads, const char* name) const;
  uint64_t LoraSiteSeed(int block, size_t site) const;
  // LoraDropout's arguments for `site` of `block` applied to inp → out: the site's seed, and on
  // a tensor-parallel rank's row-parallel site the rank's columns of the logical input.
  LoraDropoutArgs LoraDropoutOf(int block, size_t site, const Tensor& inp,
                                const Tensor& out) const;
  // Elements [begin, end) of matrix p's initial values (N(0, init_std), residual projections
  // scaled) to out[0, end − begin).
  void FillInitialMatrix(uint64_t seed, const UnitLayout& unit, const ParamSpec& p, int64_t begin,
                         int64_t end, float* out) const;
  struct GradScratch {
    Tensor residual, ln, qkv, atty, fch, fch_act;
  };

  Transformer() = default;
  // The stage a pipelined model binds (BindStage); null: the whole model.
  struct ChunkRange {
    int first_unit = 0, last_unit = 0, in_flight = 1;
  };
  struct StageSpec {
    std::vector<ChunkRange> chunks;  // in model order
    ModelLayout layout;              // RankModelLayout: the stage's units, the head's wte copy
  };
  static const char* BlockFieldName(Tensor BlockActs::*f);
  static absl::StatusOr<Transformer> BindImpl(const zerotrain::ModelConfig& config,
                                              const Arenas& state, const Arenas& work,
                                              int64_t batch, int64_t seq_len,
                                              TensorParallelGroup tp, const StageSpec* stage);
  // Activation buffers with a leading in-flight dimension (a pipeline stage's), and where
  // SelectMicroBatch puts the slot's view: a block's field, a residual index, or a head field.
  struct SlotBinding {
    int chunk = 0;
    int block = -1;
    Tensor BlockActs::*block_field = nullptr;
    int lora_site = -1;  // with `block`: the block's adapter h of that site (BlockActs::lora_h)
    int residual = -1;
    Tensor Transformer::*field = nullptr;
    Tensor base;
    std::vector<int64_t> shape;  // one slot's
  };
  // Slot `slot` of a buffer whose first dimension is the in-flight micro-batches.
  static absl::StatusOr<Tensor> SlotView(const SlotBinding& b, int slot);
  // A view of tensor `name` of unit `unit` inside that unit's flat buffer `flat`; empty if
  // the family has no such tensor.
  Tensor View(const UnitLayout& unit, const Tensor& flat, const char* name) const;
  absl::Status ForwardToHead(const DeviceContext& ctx);
  // The output projection: the head's own, or the embedding's wte when tied.
  Tensor HeadWeight(const Tensor& params, const Tensor& embedding_params) const;
  // The forward of block i up to the MLP activation, or all of it with `write_output`.
  absl::Status BlockForwardImpl(const DeviceContext& ctx, int i, const Tensor& params,
                                bool write_output);
  absl::Status AttentionCore(const DeviceContext& ctx, const BlockActs& a);
  absl::Status MlpActivation(const DeviceContext& ctx, const BlockActs& a);

  // Sums `t` over the tensor-parallel group (nothing at size 1).
  absl::Status TpAllReduce(const Tensor& t, const std::string& label);
  // Sequence parallelism (worker/model/transformer_sequence_parallel.cc): the rows this rank
  // holds of the B·T token rows, and the collectives between them and the whole sequence.
  bool sequence_parallel() const { return tp_.size > 1 && tp_.sequence_parallel; }
  // The (B·T / t, C) head of the gather buffer: a reduce-scatter's landing place.
  Tensor SequenceShardScratch() const;
  // shard (B·T / t, C) from every rank → the gather buffer (B·T, C), which it returns.
  absl::StatusOr<Tensor> GatherSequence(const Tensor& shard, const std::string& label);
  // full (B·T, C) partial sums on every rank → shard (B·T / t, C), this rank's rows summed.
  // `full` is scratch afterwards.
  absl::Status ScatterSequence(const Tensor& full, const Tensor& shard, const std::string& label);
  // Where a column-parallel linear reads its input from: `normed` whole (t = 1 or without
  // sequence parallelism), else the gather buffer holding the group's shards of it.
  absl::StatusOr<Tensor> ColumnParallelInput(const Tensor& normed, const std::string& label);
  // After a column-parallel linear's backward wrote this rank's partial dL/d(input) into
  // grad_.ln (whole rows): the gradient the norm's backward reads — grad_.ln summed over the
  // group in place, or with sequence parallelism this rank's rows summed (the shard scratch).
  absl::StatusOr<Tensor> ColumnParallelInputGrad(const std::string& label);
  // A row-parallel linear's output buffer: `out` (t = 1, or all-reduced in place after), or
  // with sequence parallelism the gather buffer (reduce-scattered into `out` after).
  Tensor RowParallelOutput(const Tensor& out) const;
  // Sums the row-parallel partial products (in RowParallelOutput(out)) into `out`: in place
  // (all-reduce), or this rank's rows (reduce-scatter).
  absl::Status ReduceRowParallelOutput(const Tensor& out, const std::string& label);
  // dL/d(row-parallel output) over every row: grad_.residual, or with sequence parallelism
  // the group's shards of it gathered.
  absl::StatusOr<Tensor> RowParallelOutputGrad(const std::string& label);
  Tensor sequence_full_;  // (B·T, C) the gather buffer, sequence parallelism only
  // The vocabulary-parallel head's loss for rows [r0, r1) whose logits are in `logits`.
  absl::Status ParallelCrossEntropy(const DeviceContext& ctx, const Tensor& logits,
                                    const Tensor& targets, int64_t r0, int64_t r1,
                                    const LossOptions& options);
  // One group's split of the logits' columns for the parallel cross-entropy: this rank's
  // columns [vocab_begin, vocab_begin + valid) of `size` ranks' and its place, the
  // collectives, the row statistics' buffers (at least size · rows and rows · 2 f32).
  struct VocabColumns {
    int size = 1, rank = 0;
    int64_t vocab_begin = 0, valid = 0;
    std::function<absl::Status(const Tensor& in, const Tensor& out, const std::string& label)>
        all_gather;
    std::function<absl::Status(const Tensor& data, const std::string& label)> all_reduce;
    Tensor maxes, sums;
  };
  // The three passes of the parallel cross-entropy over `logits` (rows, columns), the losses
  // of its rows into `losses`.
  static absl::Status SplitCrossEntropy(const DeviceContext& ctx, const VocabColumns& columns,
                                        const Tensor& logits, const Tensor& targets,
                                        const Tensor& losses, const LossOptions& options);
  // The vocabulary-sharded embedding (transformer_vocab_shard.cc): the rank's rows of wte and
  // of wpe in its shard `shard` of the embedding's flat buffer (either may have no rows).
  struct VocabRows {
    Tensor wte, wpe;
    int64_t vocab_begin = 0, position_begin = 0;
  };
  VocabRows VocabRowsOf(const Tensor& shard) const;
  // The group's (G·B, T) packed positions gathered into vocab_positions_, or empty (a model
  // without learned positions, or unpacked rows: each row's index is its position).
  absl::StatusOr<Tensor> GatherVocabPositions();
  absl::Status VocabShardedEmbeddingForward(const DeviceContext& ctx, const Tensor& shard);
  absl::Status VocabShardedEmbeddingBackward(const DeviceContext& ctx, const Tensor& grad_shard);
  absl::Status VocabShardedHeadLoss(const DeviceContext& ctx, const Tensor& shard,
                                    const Tensor& grad_shard, const LossOptions& options);
  VocabShardGroup vocab_;
  // (G·B, T) i32 each: the group's tokens, targets and positions (empty unless packed);
  // (G·B·T, C): its rows (embedding partial sums, then the final norm's outputs) and their
  // gradients' partial sums (f32); the cross-entropy's statistics and the group's losses;
  // (B·T, C) f32 with 16-bit activations: the partials' sum before its one rounding.
  Tensor vocab_tokens_, vocab_targets_, vocab_positions_, vocab_rows_, vocab_row_grads_;
  Tensor vocab_head_grad_;
  Tensor vocab_maxes_, vocab_sums_, vocab_losses_;
  // InitializeUnitRange's values of the rank's slice of tensor `whole` (of the one-rank model's
  // `whole_unit`): the whole tensor's stream, the rank's slice kept, local elements
  // [begin, end).
  void FillInitialSlice(uint64_t seed, const UnitLayout& whole_unit, const ParamSpec& whole,
                        int64_t begin, int64_t end, float* out) const;

  zerotrain::ModelConfig config_;
  ModelLayout layout_;
  ModelLayout whole_layout_;  // the one-rank model's
  TensorParallelGroup tp_;
  int64_t vocab_begin_ = 0, vocab_valid_ = 0;  // this rank's vocabulary rows
  Tensor ce_maxes_, ce_sums_;                  // the parallel cross-entropy's row statistics
  std::vector<std::vector<std::pair<int64_t, int64_t>>> kv_ranges_;  // per block
  bool gpt2_ = true;
  // H_, Hkv_, F_, V_ are this rank's shares under tensor parallelism.
  int64_t B_ = 0, T_ = 0, C_ = 0, H_ = 0, Hkv_ = 0, D_ = 0, F_ = 0, V_ = 0;

  Tensor doc_starts_, positions_;  // SetDocuments', empty when unpacked
  std::vector<Tensor> params_, grads_;
  std::vector<Tensor> lora_params_, lora_grads_;
  // One quantized base weight: `nf4` for base_dtype NF4, `int8` for INT8 (the other empty).
  struct QuantizedWeightBuffers {
    std::string name;
    Nf4Tensor nf4;
    Int8Weight int8;
  };
  std::vector<std::vector<QuantizedWeightBuffers>> quantized_;  // per unit
  // Unit u's quantized weights as views at `base` (byte `base_offset` of the unit's quantized
  // bytes; pieces outside the span are not touched).
  std::vector<QuantizedWeightBuffers> QuantizedViews(int u, uint8_t* base, int64_t base_offset,
                                                     Device device) const;
  std::vector<Tensor> qbase_shards_;  // per unit, stage 3: "<unit>.qbase"
  // One quantized weight in host memory: its pieces, bytes [lo, hi) of its unit's quantized
  // bytes (QuantizedBytesOf), held as f32 words so every piece is aligned.
  struct StagedQuantizedWeight {
    std::vector<float> words;
    int64_t lo = 0, hi = 0;
    QuantizedWeightBuffers views;  // into `words`, on the host
    const uint8_t* bytes() const { return reinterpret_cast<const uint8_t*>(words.data()); }
  };
  // Quantizes `values` (host f32, ctx the host's) into staging laid out as unit u's quantized
  // bytes are; `slice`: a tensor-parallel rank's share of the whole weight `values`, else null.
  absl::StatusOr<StagedQuantizedWeight> QuantizeIntoStaging(const DeviceContext& ctx, int u,
                                                            std::string_view name,
                                                            const Tensor& values,
                                                            const TensorParallelSlice* slice) const;
  // QuantizeBaseWeight at stage 3, into `shard` (the rank's bytes of unit u's quantized bytes):
  // copied up with `upload` when given (the shard is device memory), else written in place.
  absl::Status QuantizeIntoShard(const DeviceContext& ctx, int u, std::string_view name,
                                 const Tensor& values, const Tensor& shard,
                                 const TensorParallelSlice* slice, const HostUpload* upload);
  int qbase_rank_ = 0;
  HostUpload upload_;
  LoraScratch lora_;
  uint64_t lora_seed_ = 0;
  std::vector<Tensor> residual_;  // L + 1 of (B·T, C)
  std::vector<BlockActs> blocks_;
  Tensor lnf_, lnf_mean_, lnf_rstd_, losses_;
  Tensor tokens_, targets_, logits_;
  GradScratch grad_;
  bool pipelined_ = false;
  // A stage's own units and buffers (the members above stay indexed by the whole model's).
  ModelLayout stage_layout_;
  std::vector<Tensor> stage_params_, stage_grads_, stage_lora_, stage_lora_grads_;
  std::vector<ChunkRange> chunk_ranges_;  // one (the whole model) unpipelined
  std::vector<Tensor> compute_params_;    // SetStageComputeParams', by whole-model unit
  const Tensor& ComputeParams(int u) const {
    return compute_params_.empty() ? params_[u] : compute_params_[u];
  }
  StageUnitSource unit_source_;
  // Unit u's parameters for one use of StageForward / StageBackward, and the end of that use.
  absl::StatusOr<Tensor> AcquireStageUnit(int u) const {
    if (unit_source_.acquire) return unit_source_.acquire(u);
    return ComputeParams(u);
  }
  absl::Status FinishStageUnit(int u) const {
    return unit_source_.finish ? unit_source_.finish(u) : absl::OkStatus();
  }
  // Unit u's gradient buffer for this micro-batch (StageUnitSource::gradient, else the bound
  // trainable buffer), and the end of its writes.
  absl::StatusOr<Tensor> StageGradient(const DeviceContext& ctx, int u) const {
    if (unit_source_.gradient) return unit_source_.gradient(ctx, u);
    return layout_.lora && u > 0 && u < static_cast<int>(layout_.units.size()) - 1
               ? lora_grads_[u]
               : grads_[u];
  }
  absl::Status StageGradientDone(const DeviceContext& ctx, int u) const {
    return unit_source_.gradient_done ? unit_source_.gradient_done(ctx, u) : absl::OkStatus();
  }
  Tensor head_grad_;  // the last stage's head gradient, from its StageForward to StageBackward
  std::vector<int> held_units_;
  int first_unit_ = 0, last_unit_ = 0;  // the selected chunk's
  std::vector<SlotBinding> slots_;
  bool head_backward_due_ =
      false;  // last stage: StageForward with write_grad ran, its backward not
};

}  // namespace zt
