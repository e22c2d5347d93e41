// The memory plan: every buffer a rank allocates, computed from the job before the first step.
//
// The plan is data (llm.c-style): a pure function walks the model config and fills a table of
// named buffer specs, each in one category. The engine then takes one allocation per category
// (an Arena) and carves it by walking the same table, so nothing is allocated inside the step
// loop and the plan's totals are the engine's memory, byte for byte. `zt estimate` and the
// coordinator's planner answer from the same function.
//
// Buffer names (B micro-batch, T seq_len, C d_model, Q qkv width, F d_ff, V vocab):
//   parameters:  "<unit>.params"                       each unit's flat f32 buffer
//   gradients:   "<unit>.grads"                        same size, fp32 accumulation
//   optimizer:   "<unit>.<state>" as worker/plan/optimizer_state_layout.h lays them out
//                (AdamW's adam_m/adam_v, 8-bit codes and absmax, Adafactor's statistics)
//   activations: "residual.<i>" (B·T, C) for i in 0..L  the residual stream between units
//                "block.<i>.<name>"                     what block i saves for backward
//                "head.<name>"                          what the head saves
//   workspace:   "tokens", "targets" (B·T) i32, "logits" (B·T, V) (overwritten by its
//                gradient), "gemm_workspace" u8 (the GEMM scratch the rank's DeviceContext
//                points at), and the backward's reusable gradient scratch "grad.<name>"
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "kernels/dtype.h"
#include "proto/job.pb.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/optimizer_state_layout.h"

namespace zt {

enum class MemoryCategory : uint8_t {
  kParameters,
  kGradients,
  kOptimizerState,
  kActivations,
  kWorkspace,
  kCommunication,
  kPinnedHost,
  kNvme,
};
inline constexpr int kMemoryCategoryCount = 8;

// "parameters", "gradients", "optimizer", "activations", "workspace", "communication",
// "pinned_host", "nvme": the keys of `zt estimate --json` and of the metrics.
const char* MemoryCategoryName(MemoryCategory c);

struct BufferSpec {
  std::string name;
  MemoryCategory category = MemoryCategory::kWorkspace;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  // Set when the offload tier keeps the buffer off the device (`category` is then kPinnedHost
  // or kNvme): what it holds, kParameters or kOptimizerState, so a checkpoint still saves it.
  std::optional<MemoryCategory> offloaded_from;
  // A LoRA job's frozen base when model.init_from names it: every start (resume included)
  // loads it from there, so a checkpoint does not hold it (IsCheckpointed).
  bool reloaded_at_start = false;

  int64_t numel() const;
  int64_t bytes() const { return numel() * DTypeSize(dtype); }
  // What the buffer holds, wherever it lives.
  MemoryCategory role() const { return offloaded_from.value_or(category); }
};

// Every buffer starts on this boundary inside its arena (a cache line; AVX-512 loads).
inline constexpr int64_t kBufferAlignment = 64;
// An NVMe buffer is an extent of the swap store: it starts on and pads to O_DIRECT's unit
// (offload/README.md).
inline constexpr int64_t kNvmeExtentAlignment = 4096;

inline int64_t AlignedBytes(int64_t bytes) {
  return (bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
}
// The bytes `b` takes where it lives: AlignedBytes in an arena, a whole number of 4096-byte
// pages in the swap store.
int64_t PlacedBytes(const BufferSpec& b);

struct MemoryPlan {
  std::vector<BufferSpec> buffers;

  // Bytes an arena (or, for kNvme, the swap store) of this category holds: the sum of its
  // buffers' PlacedBytes.
  int64_t CategoryBytes(MemoryCategory c) const;
  int64_t TotalBytes() const;
  // The device's share: every category but kPinnedHost and kNvme (the offload tier's).
  int64_t DeviceBytes() const;
};

// Where the plan's bytes live, the three tiers `zt estimate` shows.
bool IsDeviceCategory(MemoryCategory c);

// The context a training rank of `job` runs its ops on (CPU, resources.cpu_threads threads;
// 0: the machine's cores divided among the job's ranks; for resources.device CUDA, a CUDA
// context whose stream and ordinal the rank's RankDevice fills in),
// without its workspace: the plan sizes that for this context, the engine points it at the
// plan's "gemm_workspace". The trainer and the plan both take it from here, so they agree.
// A CUDA job's plan also puts Gloo's 16-bit conversion buffers in pinned host memory and
// holds "checkpoint.staging" for every save (the host cannot read device memory).
DeviceContext JobDeviceContext(const zerotrain::JobSpec& job);

// Elements a unit's flat buffer is padded to so that it splits into G equal, aligned shards.
inline constexpr int64_t kShardAlignmentElements = 64;
int64_t PaddedUnitNumel(int64_t unit_numel, int group_size);

// One rank's share of one unit (DESIGN.md, "Shard"): the unit's buffer padded to `padded`
// splits into G shards of `shard_numel`; this rank's starts at `offset`. `owned` is the part
// of it that holds real elements (the last shards may be partly or wholly padding).
struct UnitShard {
  int64_t numel = 0;
  int64_t padded = 0;
  int64_t shard_numel = 0;
  int64_t offset = 0;
  FlatRange owned;
};
UnitShard ShardOf(int64_t unit_numel, const ShardGeometry& geometry);

// The row-aligned shard of a unit read as a matrix of `row_numel`-element rows (the tied
// embedding's [wte; wpe] as (V + P) x C when VocabularyShardedEmbedding): each of the G ranks
// owns ceil(rows / G) whole rows, that count rounded up so a shard is a multiple of
// kShardAlignmentElements elements. It is still G equal, contiguous, aligned shards of one
// padded flat buffer, so it is a UnitShard like ShardOf's (checkpoints keep storing logical
// ranges); only its padding differs. `owned` starts and ends on row boundaries, so a rank's
// owned rows are [owned.begin / row_numel, owned.end / row_numel). InvalidArgument when
// `row_numel` is not positive or does not divide `unit_numel`.
absl::StatusOr<UnitShard> RowAlignedShardOf(int64_t unit_numel, int64_t row_numel,
                                            const ShardGeometry& geometry);

// The shard of a model unit's flat parameter buffer: RowAlignedShardOf for the embedding when
// the geometry splits it by rows (ShardGeometry::embedding_row_numel), else ShardOf. Every
// place that shards, stores or reads a unit's parameters, gradients or optimizer states by
// rank asks this, so the plan, the engine, checkpoints and resharding agree.
UnitShard ShardOfUnit(const UnitLayout& unit, const ShardGeometry& geometry);

// The plan of the training rank at `layout` of `job` (defaults applied, validated), for the
// context JobDeviceContext(job). Precision decides the dtypes (parameters in param_dtype, fp32
// master weights when master_weights, gradients in grad_dtype, activations in
// compute_dtype); zero_stage S divides the model states over the shard group (inside the
// rank's data-parallel group, layout.shard()) as ZeRO does. With tensor or pipeline
// parallelism the units are the rank's stage at their tensor-parallel shares, and the
// activations and workspace the rank's (worker/plan/parallel_plan.h: RankModelLayout,
// RankActivationTable, RankWorkspaceTable).
// Per unit u (n elements, P padded, s = P/G its shard):
//   "<u>.params"       S ≤ 2: P (n at S = 0), S = 3: s
//   "<u>.grads"        S ≤ 1: P (n at S = 0), accumulated over micro-batches and reduced in
//                      place; S ≥ 2: s, the rank's reduced shard
//   "<u>.grad_accum"   S ≥ 2 with grad_accum_steps > 1: P — the full gradient accumulates
//                      across micro-batches and is reduce-scattered once, on the last (not
//                      on a pipeline stage that reduces per micro-batch:
//                      StageGradientsPerMicroBatch)
//   "<u>.master", optimizer states: the rank's range at S ≥ 1, the unit at S = 0
//                      ("<u>.master_low", i16, with split_master_weights: the high halves
//                      are the bf16 "<u>.params")
// and per rank:
//   "grad.full.0/1"    S ≥ 2, one micro-batch per step (or a pipeline stage at S = 3 with
//                      reshard_after_forward, any micro-batches): two full gradients of the
//                      largest unit, alternating, so one unit's reduce-scatter overlaps the next
//                      unit's backward; "grad.full.embedding" (P of the embedding) when
//                      the embedding is tied to the head, whose backward starts it
//   "grad.shard.0/1"   S = 1: the reduce-scatter's output, two in flight, copied into the
//                      rank's range of "<u>.grads"
//   "gather.<k>"       S = 3 with reshard_after_forward: prefetch_units + 1 gathered units of
//                      the largest size, reused in turn; "gather.embedding" when tied (the
//                      head's loss needs the embedding's weights: it stays gathered from the
//                      forward's lookup to the head's loss), which then also holds the two
//                      "grad.full" slots (GradientSlotsInEmbeddingGather)
//   "<u>.gathered"     S = 3 without reshard_after_forward: every unit, gathered from its
//                      forward to its backward
//   "comm.scalars"     6·N·tp f32: each rank's loss, gradient norm and overflow flag, gathered
//                      once per step
//   "comm.pipeline.grad_send.<c>"  a pipeline rank's chunk c (PipelineChunksOf order) that
//                      does not hold the embedding: [in_flight, numel of "grad.residual"] in
//                      its dtype, one copy per micro-batch slot of the gradient it sends back
//                      to the previous stage (the send outlives the next backward, which
//                      overwrites "grad.residual"). Activations go out of and come into the
//                      planned "residual.<i>" slots and gradients into "grad.residual": no
//                      other pipeline send or receive buffer exists
//   "checkpoint.staging"  checkpoint.async (pinned_host): the checkpointed buffers, each
//                      aligned, copied at a save point and written in the background
//   "optimizer.reduce_scratch"  sharded or tensor-parallel Adafactor (ShardedAdafactor,
//                      TensorParallelAdafactor): the whole-tensor statistics summed across
//                      the group, rows + cols + 2 f32 of the rank's largest matrix
//                      (communication; pinned_host where offload.optimizer puts the step on
//                      the host)
// The offload tier (job.offload, DeepSpeed's ZeRO-Offload / ZeRO-Infinity) moves buffers off
// the device, keeping their names (offloaded_from says what they hold):
//   offload.optimizer CPU / NVME  "<u>.master" and every optimizer state of the unit
//                      → kPinnedHost / kNvme
//   offload.params CPU / NVME     (stage 3) the rank's "<u>.params" shard → kPinnedHost /
//                      kNvme; the gather buffers stay on the device
//   "offload.ring.<k>" either offloaded, k < offload.buffer_count: buffer_size bytes each
//                      (kPinnedHost, first in the plan so each starts on a page), the ring
//                      gradients go down and updated parameters come up through, and swap
//                      reads and writes are staged in
//   "offload.base_ring.<k>"  a LoRA job's offload.params NVME (its frozen base swapped),
//                      k < offload.buffer_count: buffer_size bytes each (kPinnedHost, after the
//                      optimizer's ring), the ring the gathers' base shard reads go through
//                      (worker/offload/swapped_base.h); the optimizer's ring is then the one
//                      its own offload plans
//   "<u>.grads.host"   offload.optimizer CPU (S ≥ 1): s in grad_dtype, kPinnedHost,
//                      the rank's reduced gradient shard copied down during the backward
//                      (worker/optim/gradient_downloads.h); the host step reads it there
MemoryPlan PlanMemory(const zerotrain::JobSpec& job, const ParallelLayout& layout);
// The name of chunk `chunk`'s "comm.pipeline.grad_send.<c>" (above).
std::string PipelineGradSendBuffer(int chunk);
// A pipeline stage's gathered statistics and bubble timings (communication, f32).
inline constexpr char kPipelineScalars[] = "comm.pipeline.scalars";
inline constexpr char kPipelineBubble[] = "comm.pipeline.bubble";

// ZeRO-3 with reshard_after_forward, a tied embedding that trains and one micro-batch a step:
// the gathered embedding is read last by the head's loss, at the top of the backward, and the
// two rotating gradient slots are first written after it, by the head's and the blocks'
// backward. So the slots are not buffers of their own: slot k is the bytes
// [k·stride, k·stride + numel·size(grad_dtype)) of "gather.embedding" (stride the slot's bytes,
// aligned), which is as large as the gathered embedding or the two slots, whichever is more.
// The sharding engine releases the embedding after the head's loss and only then hands a
// slot out. GPT-2 1.5B at 8 ranks: 2.37 → 2.29 bytes a parameter of model states.
bool GradientSlotsInEmbeddingGather(const zerotrain::JobSpec& job, const ModelLayout& layout);
// A pipeline stage at ZeRO-3 with reshard_after_forward (FSDP's per-use gather on a stage)
// also reduces per use: each micro-batch's backward of a unit writes its gradient into one of
// the two "grad.full" slots, and the unit is reduce-scattered at once into the rank's
// "<u>.grads" shard, which accumulates the micro-batches (ShardingEngine). So the stage plans
// no "<u>.grad_accum": a full gradient per unit held through the schedule is what FSDP's
// sharding of gradients exists to avoid. Without reshard_after_forward (and at stage 2) a
// stage accumulates into "<u>.grad_accum" and reduces once after the schedule, unless a step
// has one micro-batch: nothing accumulates then, and such a stage reduces each unit as its
// backward ends too (true for it as well), into the "grad.full" slots.
bool StageGradientsPerMicroBatch(const zerotrain::JobSpec& job);
// Where slot k starts in "gather.embedding", in bytes, for slots of `slot_bytes` each.
inline int64_t GradientSlotOffset(int k, int64_t slot_bytes) {
  return k * AlignedBytes(slot_bytes);
}
// The same for rank `rank`: ParallelLayout::ForJob(job, rank).
MemoryPlan PlanMemory(const zerotrain::JobSpec& job, int rank = 0);

// The largest single transfer through the offload ring of rank `rank`'s plan: an offloaded
// buffer swapped whole, or, with the optimizer offloaded, a unit's gradient shard going down
// or its parameter shard coming up. 0 without offload. offload.buffer_size must hold it.
int64_t LargestOffloadTransferBytes(const zerotrain::JobSpec& job, int rank = 0);

// The f32 conversion buffers (two of each size) through which the communicators reduce
// 16-bit gradients, in elements: those of the communicator that reduces the gradients (stage
// 0: the world's all-reduce of one bucket; stages 1–3: the shard group's reduce-scatter of one
// padded unit) and of the replica communicator's all-reduce of one shard (hybrid). Zero when
// the gradients are fp32, and for a communicator of one rank (it reduces nothing). The plan holds
// them as "comm.convert.gradients.0/1" and "comm.convert.replicas.0/1".
// Tensor parallelism adds those of the TP group's communicator ("comm.convert.tensor.0/1"):
// with a 16-bit compute dtype its all-reduces of activations and their gradients (B·T·C: the
// embedding, each row-parallel output, each column-parallel input's gradient) reduce in that
// dtype (Gloo adds in f32 and rounds once); the parallel cross-entropy's statistics are f32 and
// convert nothing. And those of the replicated KV heads' communicator ("comm.convert.tensor_kv.
// 0/1"): with 16-bit gradients, the largest replicated KV range of a block's gradient.
struct ConversionBufferSizes {
  int64_t gradients = 0;
  int64_t replicas = 0;
  int64_t tensor = 0;
  int64_t tensor_kv = 0;
  // A pipeline's tied-embedding communicator ("comm.convert.tied.0/1", first and last stage):
  // with 16-bit gradients, one piece of the rank's share of wte, whose two copies' gradients
  // it sums piece by piece (TiedSumPieceElements).
  int64_t tied = 0;
};
ConversionBufferSizes ConversionBuffers(const zerotrain::JobSpec& job,
                                        const ParallelLayout& layout);

// Elements of "grad.reduce" (communication, in precision.reduce_dtype): the buffer a rank's
// data-parallel gradient reductions go through when reduce_dtype differs from grad_dtype
// (ShardingEngine converts into it, reduces, converts back). One reduction's worth, of the
// largest: an all-reduce bucket at ZeRO 0 (parallel.bucket_bytes in grad_dtype, or the unit),
// a unit's padded gradient and its shard at 1–3 (the reduce-scatter's input and output), a
// shard across the replica groups (hybrid sharding). 0 when the dtypes match or no reduction
// has more than one rank (a group of one reduces nothing, so converts nothing).
int64_t GradientReduceElements(const zerotrain::JobSpec& job, const ParallelLayout& layout);

// Elements of the tied wte's gradient (`numel` on this rank) that one all-reduce of a
// pipeline's tied communicator sums. With 16-bit gradients at most parallel.bucket_bytes'
// worth: Gloo widens each piece to f32 in the "comm.convert.tied" buffers, so the piece sizes
// them (the whole share cost GPT-2 1.5B's tied stages two 0.30 GiB buffers). With f32
// gradients, or bucket_bytes 0, the whole share (f32 converts nothing). Two ranks' sum is the
// same in any order, so the pieces change no bit.
int64_t TiedSumPieceElements(const zerotrain::JobSpec& job, int64_t numel);

// Whether a checkpoint holds buffer `b`: the model states — "<unit>.params" and every
// optimizer-state buffer (master weights included), or with `weights_only` (checkpoint.
// save_optimizer false) the parameters and master weights alone. The rest is rebuilt every
// step. A LoRA job's parameters are its adapters ("<unit>.lora") and its frozen base
// ("<unit>.params", NF4's "<unit>.nf4.*", INT8's "<unit>.int8.*", at stage 3 the rank's shard
// of the quantized bytes "<unit>.qbase"); the base is held only when it
// was generated from train.seed, not when model.init_from reloads it
// (BufferSpec::reloaded_at_start).
bool IsCheckpointed(const BufferSpec& b, bool weights_only = false);

// Adafactor over ZeRO shards of a group of more than one rank: its factored statistics are
// summed across the group (kernels/adafactor.h, AdafactorArgs::Shard).
bool ShardedAdafactor(const zerotrain::JobSpec& job, const ParallelLayout& layout);

// Adafactor under tensor parallelism: a split tensor's factored statistics are summed across
// the tensor-parallel group (worker/optim/optimizer.h, Optimizer::TensorSplit).
bool TensorParallelAdafactor(const zerotrain::JobSpec& job, const ParallelLayout& layout);

// Forward-only buffers (activations and workspace, no parameters or states) for `batch`
// sequences of `seq_len` tokens, the GEMM scratch sized for `ctx`: text generation after
// training plans its own.
MemoryPlan PlanInference(const zerotrain::JobSpec& job, const DeviceContext& ctx, int64_t batch,
                         int64_t seq_len);

}  // namespace zt
