// The ZeRO / FSDP engine of one rank: which part of the model states the rank holds, and
// the collectives of a step around the model's per-unit forward and backward.
//
// Stages (DESIGN.md, "Shard"; G ranks per shard group, N/G groups replicate each other):
//   0  Replicated. Each unit's gradient is all-reduced over all N ranks as soon as the
//      unit's backward ends (in pieces of at most parallel.bucket_bytes), overlapping the
//      backward of the units before it. Every rank steps every parameter.
//   1  Optimizer state and fp32 master weights sharded. After the backward, each unit's
//      gradient is reduce-scattered in the group (two in flight), the rank steps its own
//      range, and the updated parameters are all-gathered in the group.
//   2  Gradients sharded too: a unit's gradient is reduce-scattered as soon as its backward
//      ends (overlapping the next unit's backward), into the rank's gradient shard; the full
//      gradient lives only in one of two alternating buffers. Then step and all-gather as 1.
//   3  Parameters sharded too (FSDP FULL_SHARD): a unit is all-gathered before its forward
//      and again before its backward, and released after each (PrefetchCoordinator issues the
//      gathers prefetch_units ahead); without reshard_after_forward a unit stays gathered
//      from its forward to its backward. No all-gather after the step: the next forward
//      gathers the updated shards.
// Parameter offload (offload.params CPU, stage 3): the plan keeps each "<unit>.params" shard
// in the pinned host pool instead of the device's arenas. A gather then first copies the host
// shard through the rank's copy engine into the rank's own slot of the unit's gather buffer
// (device memory the plan holds anyway) and all-gathers in place, so the device holds the
// gathered units and nothing else of the parameters; the copy is issued when the prefetch
// coordinator issues the gather, prefetch_units ahead of the use. param_views() are then the
// host shards, which the host optimizer updates in place. With offload.params NVME the shards
// are extents of the node's swap store, owned by the rank's NVMe optimizer (which updates them
// with the states and commits them in its generation): SetSwappedParams gives the engine the
// reads of the committed shards (into pinned ring buffers, on the swap store's copy queue).
// A LoRA job's swapped shards are its frozen base instead, written once and never updated
// (worker/offload/swapped_base.h), and a block's quantized bytes are read beside its parameters
// (SwappedShards::with_quantized).
// The prefetch coordinator announces each gather max(prefetch_units, 1) uses before it issues
// it, and the shard's read is queued then, so it runs while those uses compute; the gather
// then waits for it (or reads it itself when the ring had no buffer free), uploads it into its
// slot and all-gathers in place as above. param_views() then have the shards' dtype and size
// and no memory.
// The gathers a pass issues together at its start (units 0 … prefetch_units, at its first
// Acquire) would find no use before them to hide behind: with offload.params CPU their host
// shards go up ahead instead, at the step's start and between micro-batches
// (ReadFirstGathersAhead), on an upload thread of their own, into the slots the coordinator
// will hand those gathers (PrefetchCoordinator::FirstGatherBuffers); the gather then waits for
// that upload rather than copying. On a CPU rank the copy is a memcpy, so without this it ran
// on the compute thread. Every later gather's host shard goes up one use before the gather is
// issued (PrefetchCoordinator rule 5: while use i computes, use i + prefetch_units + 1's), on
// the same kind of upload thread, into one of the plan's prefetch_units + 1 staging slots
// ("param_upload.<k>": the gather buffer is still another unit's then); the gather waits for
// that upload and all-gathers from the slot, which is free again once the gather has been
// waited for (UploadAhead). A use announced while its unit is still held, or with no slot
// free, uploads at its gather as before. A LoRA job's quantized base ("<block>.qbase") goes up
// with its parameters' shard, in the same upload: into the twin of the gather buffer, or of
// the staging slot ("qbase_upload.<k>"). A pipeline stage that gathers per use
// (reshard_after_forward) does the same over its schedule's pass: its first gathers' shards go
// up at BeginStagePass, the later ones a use ahead into the staging slots; with swapped shards
// (offload.params NVME) BeginStagePass queues the first gathers' reads, one a gather. A stage that
// gathers its units whole for the step uploads each shard at its gather (BeginStep): nothing
// of the step computes before those gathers for an upload to hide behind. With swapped shards
// its reads still go ahead (GatherStageUnits): the first prefetch_units + 1 units' at the
// step's start (ReadFirstGathersAhead, while the gradients are zeroed), each later one as the
// gather prefetch_units + 1 units before it takes its read, so it runs while those gathers
// upload and all-gather.
// Hybrid (G < N): the reduce-scattered shard is then all-reduced across the N/G replicas.
// Gradient accumulation communicates only on a step's last micro-batch: before it, stages
// 0–1 accumulate into their full gradient buffers and stages 2–3 into a full per-unit
// "grad_accum" buffer (the memory plan reserves it only when grad_accum_steps > 1). A
// pipeline stage at ZeRO-3 with reshard_after_forward is the exception (FSDP's rule): it
// reduce-scatters each micro-batch's gradient of a unit as the unit's backward ends, from one
// of two rotating full slots into the rank's shard, which accumulates. So does a stage at
// ZeRO 2 (or 3 keeping its units gathered) with one micro-batch a step, whose one backward of
// a unit is the step's (StageGradientsPerMicroBatch).
//
// The tied embedding: the head's projection reads the embedding's weight and writes its
// gradient, so at stage 3 the embedding stays gathered (in its own buffer) from its forward
// to the head's loss, and at stages 2–3 its full gradient has its own buffer for the backward.
// Nothing after the head's loss reads the embedding's weights, so with one micro-batch a step
// the two rotating gradient slots are the embedding's gather buffer, reused once the loss has
// released it (GradientSlotsInEmbeddingGather, worker/plan/memory_plan.h).
//
// Tensor parallelism (docs/parallelism.md): the engine works on the rank's TP shares of each
// unit (the model's layout) inside its data-parallel group, exactly as above; the model runs
// its own TP collectives, and the engine adds the sum of replicated KV heads' gradients (on the
// last micro-batch, before the data-parallel reduction) and the statistics over the TP group.
//
// Trainable buffers: what the engine reduces, shards, steps and gathers after the step is
// each unit's trainable buffer (UnitLayout::trainable_numel) — its flat parameters, or in a
// LoRA job (model.lora) a block's adapters ("<unit>.lora", gradient "<unit>.lora_grads"):
// the frozen base gets no gradient buffer, no reduction and no optimizer range, and units
// without adapters (embedding, head) take part in the forward and backward only. The
// per-unit vectors below (ranges, views, shard) are indexed as trainable_layout()'s units.
// At stage 3 a LoRA job's frozen base is sharded and gathered per use like any unit's
// parameters, while its adapters are handled as at stage 2: reduce-scattered, stepped per
// range, all-gathered after the step. An NF4 or INT8 base's quantized weights are a block's
// flat quantized bytes ("<unit>.qbase", the rank's shard): gathered (as f32 words) beside the
// block's parameters, into "qbase.gather.<k>" beside "gather.<k>" (or "<unit>.qbase.gathered"
// beside "<unit>.gathered"), waited for and bound to the model (BindQuantizedBase) when the use
// acquires the unit (on a pipeline stage: per use, or for the step in GatherStageUnits). They
// have no gradient and no optimizer range.
//
// Every rank issues the same collectives in the same order (as NCCL and Gloo require); each
// carries a label naming the unit ("block.3 reduce-scatter"), which a timeout repeats with
// the ranks that never arrived.
//
// Not thread-safe: one per rank thread.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "kernels/tensor.h"
#include "proto/job.pb.h"
#include "worker/comm/communicator.h"
#include "worker/comm/device_copy_engine.h"
#include "worker/model/transformer.h"
#include "worker/plan/arena.h"
#include "worker/plan/memory_plan.h"
#include "worker/plan/pipeline_schedule.h"
#include "worker/shard/prefetch_coordinator.h"
#include "worker/shard/unit_registry.h"

namespace zt {

// The communicators of one rank. `shard_group` may be `world` (G = N); `replicas` is null
// when there is one group.
struct ShardComms {
  Communicator* world = nullptr;
  Communicator* shard_group = nullptr;
  Communicator* replicas = nullptr;
  // The rank's tensor-parallel group when tensor_parallel > 1 (the model's all-reduces run on
  // it too): the step's statistics are gathered over it as well.
  Communicator* tensor = nullptr;
};

// What the ranks measured in a step, summed over the job.
struct StepTotals {
  double loss_sum = 0;     // Σ over ranks of each rank's loss
  double grad_sum_sq = 0;  // Σ of squared reduced gradients over the whole model (once)
  bool nonfinite = false;  // any rank saw a non-finite gradient
  int stop_request = 0;    // the strongest stop request of any rank (worker/train/stop_request.h)
};

class ShardingEngine {
 public:
  // `model` and `arenas` (the rank's plan, PlanMemory(job, layout)) must outlive the engine.
  // The engine works inside the rank's data-parallel group: `comms` are that group's
  // (ConnectRank) and its geometry is layout.shard(). `copies`, the rank's copy engine (not
  // owned, outliving the engine), is needed where the plan keeps the parameter shards in the
  // pinned host pool or on NVMe (InvalidArgument without it).
  static absl::StatusOr<std::unique_ptr<ShardingEngine>> Create(
      const zerotrain::JobSpec& job, const ParallelLayout& layout, Transformer* model,
      const Arenas& arenas, ShardComms comms, DeviceCopyEngine* copies = nullptr);

  // Zeroes the gradients a step accumulates into, then gathers a ZeRO-3 pipeline stage's
  // units whole (GatherStageUnits). With swapped shards (offload.params NVME), first queues
  // the reads of the step's first pass's first gathers (ReadFirstGathersAhead), so they run
  // while the gradients are zeroed and the batch is uploaded.
  absl::Status BeginStep(const DeviceContext& ctx);
  // A ZeRO-3 pipeline stage: all-gathers each of its unit shards into the whole buffer its
  // StageForward / StageBackward read (SetStageComputeParams), and waits. Swapped shards
  // (offload.params NVME) are read ahead of their gathers, prefetch_units + 1 units ahead. What
  // BeginStep does first, and a pipelined evaluation between steps (the optimizer stepped the
  // shards since). Nothing for any other model.
  absl::Status GatherStageUnits();
  // A ZeRO-3 pipeline stage with reshard_after_forward (FSDP's per-use gather on a stage):
  // every use of a unit by `ops` (the stage's schedule, PipelineStageOps, or an evaluation's
  // forward-only ops with `training` false) in the order the ops run them becomes one pass of
  // the prefetch coordinator, so each use gathers its unit (prefetch_units uses ahead, across
  // the ops' boundaries) into the pool and frees it after. A forward uses each unit of its
  // chunk in model order, a backward in reverse without the embedding (its backward reads no
  // parameters); in training the head stays gathered from its forward to its backward, which
  // every schedule runs next on the last stage. The model's StageForward / StageBackward take
  // the units through Transformer::SetStageUnitSource. EndStagePass after the ops (also after
  // an error). Nothing for any other model.
  absl::Status BeginStagePass(const std::vector<PipelineOp>& ops, bool training);
  absl::Status EndStagePass();
  // Whether this is such a stage (units gathered per use, not for the whole step).
  bool gathers_stage_per_use() const { return stage_per_use_; }
  // Forward and backward of the micro-batch in model->tokens()/targets(). On a step's last
  // micro-batch (`last`) the gradients are reduced; when this returns they are final in
  // grad_views(). The micro-batch's mean loss goes where options.loss_sum says (usually
  // loss_accumulator()).
  absl::Status ForwardBackward(const DeviceContext& ctx, const Transformer::LossOptions& options,
                               bool last);
  // A pipeline stage (model->pipelined()): the schedule ran the model's StageForward /
  // StageBackward itself, accumulating into the full gradient buffers (".grads" at stages 0–1,
  // ".grad_accum" at 2–3 with micro-batches that accumulate); this starts every unit's
  // reduction and waits for them, as ForwardBackward does after a step's last micro-batch (a
  // tensor-parallel stage's replicated KV heads summed over their ranks first). At stage 3
  // with reshard_after_forward, and at 2–3 with one micro-batch, the schedule reduced each
  // micro-batch already (StageGradientsPerMicroBatch): this waits for those reduce-scatters.
  // `tied`, on the first and the last stage of a model whose embedding is tied to its head (the two
  // stages' communicator), sums the two copies' gradients first, as Megatron's embedding group
  // all-reduce does. The last stage's copy of a tied embedding is left out of the norm statistics
  // (the first stage counts wte; with tensor parallelism each TP rank its shard of it).
  absl::Status ReduceStageGradients(const DeviceContext& ctx, Communicator* tied = nullptr);
  // Forward only (evaluation), gathering units as the forward needs them; the loss as above.
  absl::Status ForwardLoss(const DeviceContext& ctx, const Transformer::LossOptions& options);

  // The trainable buffers as a model layout: the model's own, or LoraAdapterLayout's ("<block>.
  // lora" units) for a LoRA job. What the optimizer is created over.
  const ModelLayout& trainable_layout() const { return trainable_layout_; }
  // Per trainable unit, the range of its elements this rank's optimizer steps (the whole unit
  // at stage 0), and views of its parameters and reduced gradients starting at that range.
  const std::vector<FlatRange>& ranges() const { return ranges_; }
  const std::vector<Tensor>& param_views() const { return param_views_; }
  const std::vector<Tensor>& grad_views() const { return grad_views_; }

  // The step's statistics, kept on the device until one all-gather and one read-back: per
  // rank kScalarSlots f32 slots of "comm.scalars" — loss (an f64 in 2 slots), the squares of
  // its share of the reduced gradients (the rank's shard range, so each element is counted
  // once per group; f64), its overflow flag, its stop request (0 none, 1 stop, 2 checkpoint
  // then stop). The step loop: BeginStatistics; each micro-batch's loss into
  // loss_accumulator(); AccumulateGradientStatistics; the stop request into stop_slot();
  // ExchangeStatistics; read scalars() back; Totals. All ranks get the same bits (combined in
  // rank order), and agree on the stop without a collective of its own.
  static constexpr int kScalarSlots = 6;
  // Zeroes this rank's slots (on the device).
  absl::Status BeginStatistics(const DeviceContext& ctx);
  // With tensor parallelism scalars() holds one block of N ranks' slots per tensor-parallel
  // rank; the loss is the same on every rank of a TP group (the parallel cross-entropy), and
  // each TP rank squares only what NormCountedRanges (worker/model/tensor_parallel_slice.h)
  // gives it, so every element of the model is counted once.
  Tensor loss_accumulator() const { return scalars_.Slice(MySlots(), MySlots() + 2); }
  Tensor stop_slot() const { return scalars_.Slice(MySlots() + 5, MySlots() + 6); }
  // Adds the squares of the rank's gradient share (and, with check_finite, the overflow flag)
  // to its slots, on the device: nothing waits.
  absl::Status AccumulateGradientStatistics(const DeviceContext& ctx, bool check_finite);
  // All-gathers every rank's slots over the data-parallel group (then its blocks over the
  // tensor-parallel group) and waits.
  absl::Status ExchangeStatistics();
  // Every rank's slots, (N · kScalarSlots) f32 on the rank's device.
  const Tensor& scalars() const { return scalars_; }
  // The totals from a host copy of scalars(); each rank's loss is divided by `loss_divisor`
  // (evaluation's number of batches) before it is summed.
  StepTotals Totals(const float* gathered, double loss_divisor) const;
  // Sums n floats element-wise across the shard group, in place, blocking (sharded
  // Adafactor's statistics). `data` is in the rank's communication memory (its device).
  absl::Status SumAcrossShardGroup(float* data, int64_t n);
  // After the optimizer updated param_views(): stages 1–2 (and a LoRA job's adapters at 3)
  // all-gather them.
  absl::Status FinishStep(const DeviceContext& ctx);

  // All-gathers trainable unit u's shard `shard` (shard(u).shard_numel elements, f32) from the
  // shard group into `full` (at least shard(u).padded elements) and waits. A collective of the
  // group; for export and comparing runs, outside the step loop.
  absl::Status AllGatherUnit(int u, const Tensor& shard, const Tensor& full);
  const UnitShard& shard(int u) const { return shards_[u]; }

  // This rank's counters, summed over its communicators.
  CommStats stats() const;
  // Seconds the rank's compute thread has spent blocked waiting for communication: the part
  // of the communicators' time that compute did not hide.
  double waited_seconds() const { return waited_s_; }
  const ShardGeometry& geometry() const { return geometry_; }
  int stage() const { return stage_; }
  // Whether the parameter shards (param_views() at stage 3) are in host memory, or in the swap
  // store (offload.params NVME).
  bool params_on_host() const { return params_on_host_; }
  bool params_swapped() const { return params_swapped_; }
  // Swapped shards (offload.params NVME): where a gather's shard comes from, model unit u's
  // committed "<unit>.params" bytes (and a LoRA block's "<unit>.qbase"). Set before the first pass;
  // a gather without it fails with FailedPrecondition.
  struct SwappedShards {
    // Queues the read of unit u's shard ahead of its gather (PrefetchCoordinator's rule 4),
    // best effort: with no ring buffer free, the gather reads it itself.
    std::function<void(int u)> read_ahead;
    // Calls `use` with unit u's shard in host memory (the oldest read queued for u, waited
    // for, or a read made now), valid during the call; `use`'s status, or the read's error.
    std::function<absl::Status(int u, const std::function<absl::Status(const void*)>& use)>
        with_shard;
    // Waits for the reads no gather took (a pass that ended early) and frees their buffers.
    std::function<void()> drop_read_ahead;
    // A LoRA job's NF4 / INT8 base (worker/offload/swapped_base.h): as with_shard, for unit u's
    // quantized bytes ("<unit>.qbase"), which read_ahead reads beside its parameters.
    std::function<absl::Status(int u, const std::function<absl::Status(const void*)>& use)>
        with_quantized;
  };
  void SetSwappedParams(SwappedShards shards);
  // Queues, through SwappedShards::read_ahead, the shard reads of the gathers a training pass
  // issues at once at its start (the forward's uses 0 … prefetch_units: units 0 … k), which
  // PrefetchCoordinator's rule 4 does not announce; the pass's first Acquire then finds them
  // read. Called where the shards are final until that pass: at BeginStep (after the previous
  // step's commit) and between a step's micro-batches. With host shards (offload.params CPU)
  // it starts their uploads instead, into the slots those gathers will take. On a pipeline
  // stage that gathers its units whole for the step it queues the first prefetch_units + 1
  // units' reads (GatherStageUnits queues the rest); nothing on one gathering per use
  // (BeginStagePass does it for the stage's pass), at other stages, or with the shards on the
  // device.
  void ReadFirstGathersAhead();
  // Called once the backward of a step's last micro-batch has ended, before the step waits for
  // its gradient reductions: the NVMe optimizer queues its first unit's reads there, so they
  // overlap the reductions' tail and the statistics (offload.optimizer NVME).
  void SetBackwardEnded(std::function<void()> hook) { backward_ended_ = std::move(hook); }
  // Called on the compute thread as soon as trainable unit u's reduction of a step's last
  // micro-batch is issued whole (in the backward at stages 0 and 2–3 without replicas; at
  // stage 1 and across replicas in the reductions that follow the backward), with the handles
  // that must finish before grad_views()[u] holds the reduced gradient: ZeRO-Offload's
  // gradient copies to the host start there (worker/optim/gradient_downloads.h).
  using GradientReducedHook = std::function<void(int u, std::vector<CommHandle> after)>;
  void SetGradientReduced(GradientReducedHook hook) { gradient_reduced_ = std::move(hook); }
  // Parameter bytes copied host → device before gathers so far, and the seconds it took.
  int64_t param_upload_bytes() const { return param_upload_bytes_; }
  double param_upload_seconds() const { return param_upload_s_; }
  // offload.params CPU: host-shard uploads a gather found already made — by
  // UploadFirstGathersAhead (a pass's first gathers) or UploadAhead (the later ones, a use
  // before the gather) — and those it made itself when it was issued (any part of it: a LoRA
  // job's quantized base bytes go up with the parameters' shard).
  int64_t param_uploads_ahead() const { return param_uploads_ahead_; }
  int64_t param_uploads_at_gather() const { return param_uploads_at_gather_; }

 private:
  ShardingEngine() = default;
  // The first of this rank's slots in scalars_.
  int64_t MySlots() const {
    return kScalarSlots * (int64_t{tp_rank_} * geometry_.world_size + geometry_.rank);
  }
  // Parameters of unit u for compute: the full buffer (stages 0–2) or its gathered buffer.
  absl::StatusOr<Tensor> Params(int u) const;
  // The full gradient buffer model unit u's backward adds into in this micro-batch (its
  // trainable buffer's; an empty tensor for a frozen unit without one).
  absl::StatusOr<Tensor> GradTarget(const DeviceContext& ctx, int model_unit);
  // Model unit u's backward ended: start its reduction (last micro-batch only).
  absl::Status GradientReady(const DeviceContext& ctx, int model_unit);
  // Zeroes the gradient buffers a step accumulates into (BeginStep).
  absl::Status ZeroStepGradients(const DeviceContext& ctx);
  // Waits for every reduction of the step; stage 1 runs its reduce-scatters here.
  absl::Status FinishReductions(const DeviceContext& ctx);
  absl::Status ReduceAcrossReplicas(const DeviceContext& ctx, int u);  // u: a trainable unit
  // One data-parallel reduction of gradients over `comm`: an all-reduce of `input` in place
  // when `output` is empty, else a reduce-scatter of `input` into `output`. In grad_dtype it
  // is queued on `pending`. With precision.reduce_dtype ≠ grad_dtype (reduce_buffer_ planned)
  // it runs through reduce_buffer_ instead: converted, reduced, waited for and converted back
  // before returning, so the caller sees the same completed result in grad_dtype.
  absl::Status ReduceGradients(const DeviceContext& ctx, Communicator* comm, const Tensor& input,
                               const Tensor& output, const std::string& label,
                               std::vector<CommHandle>* pending);
  std::string Label(int u, const char* what) const;  // u: a trainable unit
  // A pass over the units (stage 3: the uses the prefetch coordinator walks; other stages
  // hold every unit whole and these only hand out its buffer).
  void BeginPass(std::vector<UnitUse> uses);
  absl::StatusOr<Tensor> Acquire(int u);  // the parameters of the next use, unit u
  absl::Status FinishUse();
  absl::Status EndPass();
  // Embedding, blocks and the final norm; returns the head's parameters, still acquired.
  absl::StatusOr<Tensor> ForwardToHead(const DeviceContext& ctx);

  zerotrain::JobSpec job_;
  Transformer* model_ = nullptr;
  ShardComms comms_;
  ShardGeometry geometry_;
  int stage_ = 0;
  int tp_size_ = 1, tp_rank_ = 0;
  bool accumulate_full_ = false;  // stages 2–3 with grad_accum_steps > 1
  bool tied_ = false;
  bool tied_grad_ = false;  // tied, and the embedding trains (not LoRA)
  // The tied embedding split by rows over the shard group (Transformer::vocab_sharded): never
  // gathered; the lookup and the head read the rank's shard, and its gradient shard
  // accumulates the step's micro-batches complete, with no reduce-scatter.
  bool vocab_ = false;
  int64_t bucket_elements_ = 0;

  ModelLayout trainable_layout_;
  std::vector<int> trainable_index_;  // per model unit: its trainable unit, or -1
  // Per model unit: "<u>.params", full (stages 0–2) or the shard (3), what compute reads.
  std::vector<Tensor> params_;
  std::vector<UnitShard> param_shards_;  // per model unit: its parameters' shard (stage 3)
  bool gather_after_step_ = false;       // stages 1–2, and a LoRA job's adapters at 3
  // Per trainable unit (the model's units, or a LoRA job's "<block>.lora" ones):
  std::vector<UnitShard> shards_;
  std::vector<Tensor> trainable_params_;  // "<u>.params" or "<u>.lora"
  std::vector<Tensor> grads_;  // "<u>.grads" / "<u>.lora_grads": full (0–1) or the shard (2–3)
  std::vector<Tensor> grad_accum_;  // "<u>.grad_accum" / "<u>.lora_grad_accum" (accumulate_full_)
  std::vector<Tensor> grad_full_;   // "grad.full.0/1"
  Tensor grad_full_embedding_;      // "grad.full.embedding" (tied)
  // grad_full_ are bytes of "gather.embedding" (GradientSlotsInEmbeddingGather).
  bool slots_in_embedding_ = false;
  // A ZeRO-3 pipeline stage's "<unit>.gathered" buffers, filled by BeginStep.
  std::vector<Tensor> stage_gathered_;
  // With swapped shards, the last of those units whose read is queued for the next
  // GatherStageUnits (−1: none), by ReadFirstGathersAhead or by GatherStageUnits itself.
  int stage_read_through_ = -1;
  // Queues the reads of the stage's units up to `last` (SwappedShards::read_ahead).
  void ReadStageUnitsAhead(int last);
  // A ZeRO-3 pipeline stage with reshard_after_forward: the current stage pass's uses, and per
  // whole-model unit its index among the stage's units (−1: not held).
  bool stage_per_use_ = false;
  std::vector<UnitUse> stage_uses_;
  std::vector<int> local_unit_;
  absl::StatusOr<Tensor> AcquireStageUnit(int whole_unit);
  // Such a stage reduces per use too (StageGradientsPerMicroBatch): a unit's gradient of one
  // micro-batch goes into a "grad.full" slot (GradTarget) and is reduce-scattered into the
  // rank's shard as soon as its backward ends (StageGradientDone); the shards accumulate the
  // step's micro-batches.
  bool stage_grads_per_use_ = false;
  absl::StatusOr<Tensor> StageGradient(const DeviceContext& ctx, int whole_unit);
  absl::Status StageGradientDone(const DeviceContext& ctx, int whole_unit);
  // After the schedule, the sum of a tied wte's two copies in the reduced shards.
  absl::Status SumTiedStageGradient(const DeviceContext& ctx, Communicator* tied);
  // Sums `grads` (one copy of the tied wte's gradient) with the other stage's copy over
  // `tied`, in TiedSumPieceElements pieces (the plan's conversion buffers hold one piece).
  absl::Status AllReduceTied(Communicator* tied, const Tensor& grads);
  std::vector<Tensor> grad_shard_;  // "grad.shard.0/1" (stage 1)
  Tensor reduce_buffer_;            // "grad.reduce" (reduce_dtype ≠ grad_dtype), else empty
  Tensor scalars_;                  // "comm.scalars"
  std::vector<FlatRange> ranges_;
  std::vector<Tensor> param_views_, grad_views_, norm_views_;

  // Stages 2–3 without accumulation: which unit holds each full-gradient slot, and the
  // reduce-scatter that must finish before the slot is reused.
  int next_slot_ = 0;
  std::vector<int> slot_unit_;
  std::vector<Tensor> unit_grad_target_;          // per unit, its buffer this micro-batch
  std::vector<std::vector<CommHandle>> pending_;  // per unit, reductions in flight

  // offload.params CPU: the shards are host memory, uploaded into each gather's own slot.
  bool params_on_host_ = false;
  bool params_swapped_ = false;  // offload.params NVME
  SwappedShards swapped_;
  std::function<void()> backward_ended_;
  GradientReducedHook gradient_reduced_;
  void GradientReduced(int u) {  // u: a trainable unit
    if (gradient_reduced_) gradient_reduced_(u, pending_[u]);
  }
  DeviceCopyEngine* copies_ = nullptr;
  int64_t param_upload_bytes_ = 0;
  double param_upload_s_ = 0;
  int64_t param_uploads_ahead_ = 0;
  int64_t param_uploads_at_gather_ = 0;
  // offload.params CPU, between passes: starts, on an upload thread, the uploads of `units`'
  // host shards (the gathers a pass's first Acquire will issue, in that order) into this
  // rank's slot of the buffers those gathers will take (PrefetchCoordinator::
  // FirstGatherBuffers); the gathers find them there (uploaded_ahead_). For a non-pipelined
  // pass through ReadFirstGathersAhead, for a pipeline stage's pass at BeginStagePass.
  void UploadFirstGathersAhead(const std::vector<int>& units);
  // Waits for the uploads UploadFirstGathersAhead started (if any) and adds their bytes and
  // seconds; their error. Every gather calls it first: no all-gather may write a buffer the
  // upload thread is still copying into.
  absl::Status AwaitUploadsAhead();
  // The gather of model unit u's shard into `full`, from wherever the plan keeps the shard.
  absl::StatusOr<CommHandle> GatherUnit(int u, const Tensor& full);
  // Copies a host shard (`host`, slot's bytes) up into its slot of a gather buffer, after the
  // compute issued before, counting it in the parameter uploads.
  absl::Status UploadIntoSlot(const Tensor& slot, const void* host);
  // Stage 3 with a quantized base, per model unit: its "<unit>.qbase" shard (empty without
  // quantized weights), that shard's geometry in f32 words, and its gather in flight; and per
  // parameter gather buffer (by address), the buffer its quantized bytes gather into.
  std::vector<Tensor> qbase_shards_;
  std::vector<UnitShard> qbase_unit_shards_;
  std::vector<std::vector<CommHandle>> qbase_pending_;
  bool qbase_on_host_ = false;  // offload.params CPU: the "<unit>.qbase" shards are host memory
  bool qbase_swapped_ = false;  // offload.params NVME: ... extents of the swap store
  bool HasQuantizedBase(int u) const {
    return u < static_cast<int>(qbase_unit_shards_.size()) && qbase_unit_shards_[u].padded > 0;
  }
  std::vector<std::pair<const void*, Tensor>> qbase_companion_;
  absl::StatusOr<Tensor> QuantizedCompanion(const Tensor& full) const;

  double waited_s_ = 0;
  int use_ = 0;  // the current pass's next use
  std::unique_ptr<UnitRegistry> registry_;
  std::unique_ptr<PrefetchCoordinator> prefetch_;
  // offload.params CPU, the uploads ahead of a pass's first gathers: per model unit, the
  // device address its shard was put at (null: none), valid until that pass ends; and the
  // upload thread's outcome (bytes, seconds), pending until AwaitUploadsAhead. Last, so the
  // destructor waits for the thread before the members it reads go.
  struct UploadsAhead {
    absl::Status status;
    int64_t bytes = 0;
    double seconds = 0;
  };
  std::vector<const void*> uploaded_ahead_;
  std::vector<const void*> qbase_uploaded_ahead_;  // the same for a quantized base's bytes
  std::future<UploadsAhead> uploads_ahead_;
  // offload.params CPU, the uploads ahead of the later gathers (PrefetchCoordinator rule 5):
  // the plan's staging slots ("param_upload.<k>"), the unit each holds (−1: free) and whether
  // a gather has taken it (then it is free once that unit is no longer gathering); per model
  // unit, the slot of its upload pending until a gather takes it (−1: none) and that upload (a
  // unit may hold a second slot for its next gather while its previous gather still reads the
  // first); and the last upload started, which the next one waits for. Last, for the
  // destructor as above.
  std::vector<Tensor> upload_slots_;
  std::vector<Tensor> qbase_upload_slots_;  // "qbase_upload.<k>": slot k's unit's quantized bytes
  // A quantized base's all-gather that failed when UploadAhead waited for it to free its slot:
  // the next Acquire (or the pass's end) returns it.
  absl::Status qbase_wait_error_;
  std::vector<int> upload_slot_unit_;
  std::vector<bool> upload_slot_taken_;
  std::vector<int> staged_slot_;
  std::vector<std::shared_future<UploadsAhead>> staged_;
  std::shared_future<UploadsAhead> last_upload_;
  // Starts unit u's upload into a free staging slot, on an upload thread (the coordinator's
  // announcement, on the compute thread); nothing when none is free or its shard is already up.
  void UploadAhead(int u);
  // Ends the pass's staged uploads: waits for those no gather took and frees every slot.
  absl::Status AwaitStagedUploads();
};

}  // namespace zt
