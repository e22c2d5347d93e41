// The sharding planner: which ZeRO stage and activation-checkpointing policy a job runs with
// on devices of a given size, chosen from the memory plan (worker/plan/memory_plan.h) — the
// same function the engine allocates from, so a plan that fits is a job that fits.
//
// Candidates are every (zero_stage 0–3) × (activation_checkpointing NONE, SELECTIVE, FULL)
// the job does not pin; a field the job sets is kept as set (EVERY_K only when pinned).
// Offload (offload.optimizer / offload.params, unset: the planner chooses) is considered only
// when no candidate without it fits, one rung at a time, each rung only when none before it
// fits: the optimizer states to the host (CPU), to NVMe, then the parameters too (CPU, then
// NVME, both with the optimizer's), each over the stages it allows (optimizer offload stage
// ≥ 1, parameter offload stage 3). A pinned offload is the only rung. With
// N ranks, G = shard group size, R = N/G replica groups, Ψ the model's parameters (P: padded
// to shards), p / g the bytes of a parameter / gradient element and A = grad_accum_steps,
// each candidate gets
//   peak_bytes_per_rank  the memory plan of rank 0 (no rank plans more: every rank's shard
//                        is the same size and rank 0's owns only real elements, the later
//                        ranks' may own padding), in device memory: its DeviceBytes (all but
//                        the pinned-host and NVMe categories) on CUDA devices and on CPU
//                        devices with a budget of their own (resources.device_memory_bytes);
//                        on a CPU device without one, whose memory is the host's, all but NVMe
//   pinned_host_bytes_per_rank, nvme_bytes_per_rank  the plan's kPinnedHost and kNvme
//   host_transfer_bytes_per_step  with S_u the rank's shard of unit u (ΣS = Σ P_u/G):
//                          optimizer offloaded   ΣS·(g + p): gradient shards down, updated
//                                                parameters up
//                          parameters offloaded  A·passes·ΣS·p, passes 2 with
//                                                reshard_after_forward (else 1): every gather
//                                                reads the shard from the host
//   nvme_transfer_bytes_per_step  optimizer NVME: 2× its states and master on NVMe (read
//                        and written once a step); parameters NVME: A·passes·ΣS·p
//   comm_bytes_per_step  what each rank sends per optimizer step in ring collectives, as
//                        worker/shard/sharding_engine.cc issues them: 0 at one rank;
//                          stage 0    all-reduce of the gradients   2·(N−1)/N·Ψ·r
//                          stage 1–2  reduce-scatter in the group   (G−1)/G·P·r
//                                     + parameter all-gather        (G−1)/G·P·p
//                          stage 3    reduce-scatter                (G−1)/G·P·r
//                                     + A forward all-gathers       (G−1)/G·P·p each
//                                     + A backward all-gathers      (G−1)/G·P_b·p each, only
//                                       with reshard_after_forward; P_b: P less the
//                                       embedding and the head (the embedding's backward
//                                       reads no parameters, the head stays gathered)
//                          stage 3 on a pipeline stage (p > 1; P its units): the
//                                     reduce-scatter + each unit gathered once a step, or
//                                     with reshard_after_forward A times in the forwards and A
//                                     in the backwards but the embedding's and the head's
//                          hybrid (R > 1, stages 1–3) adds the replicas' all-reduce of the
//                                     shard                         2·(R−1)/R·(P/G)·r
//                        r is what a gradient reduction sends an element: the
//                        communicator's width (Gloo, CPU ranks, reduces 16-bit data in f32:
//                        r = 4; NCCL, CUDA ranks, in the dtype: r = g); all-gathers send
//                        their own width (p, or g for a gradient's)
//   recompute_fraction   the extra forward FLOPs of recomputation over one step's FLOPs
//                        (forward 1, backward 2, so a step is 3 forwards): FULL recomputes
//                        every block, SELECTIVE the attention core and activation function
//                        of every block, EVERY_K the blocks 0, k, 2k, …, NONE nothing. FLOPs
//                        of a forward (B micro-batch, T seq_len, C d_model, F d_ff, V vocab):
//                          per block: linears 2·B·T·(the block's matrix parameters),
//                                     attention core 2·2·B·T²·C (QKᵀ and AV, causal mask
//                                     not discounted), activation kActivationFlopsPerElement
//                                     ·B·T·F (norms, residuals and RoPE neglected)
//                          head:      2·B·T·C·V
//   cost                 recompute_fraction + (kCommCostPerStepOfCompute ·
//                        comm_bytes_per_step + kHostTransferCostPerStepOfCompute ·
//                        host_transfer_bytes_per_step + kNvmeTransferCostPerStepOfCompute ·
//                        nvme_transfer_bytes_per_step) / (2·Ψ·4)
// and fits when peak_bytes_per_rank ≤ D · (1 − safety_margin), D the smaller of
// device_memory_bytes and the job's resources.device_memory_bytes (when set); with an
// offload also when pinned_host_bytes_per_rank ≤ host_memory_bytes · (1 − safety_margin)
// (when given), offload.nvme_path is set for NVME, and offload.buffer_size holds the largest
// transfer (LargestOffloadTransferBytes). rejected_because lists every rule a candidate
// breaks. The chosen candidate is the cheapest that fits (ties: the lower stage, then the
// lighter recompute), so a smaller device never gets a choice with a larger peak; the plan's
// reason says why.
//
// Layouts (issue 18). With PlannerOptions::layouts kAll (`zt estimate --plan`) every tensor ×
// pipeline layout (t, p) with t · p dividing the world is searched too, except a
// parallel.tensor_parallel / pipeline_parallel the job sets (pinned); one that breaks a rule of
// worker/job/parallel_validation.h (t not dividing the heads, p above the units, too few
// micro-batches for 1F1B, ...) is listed in rejected_layouts with the rules, not planned. A
// candidate of a layout plans every pipeline stage and reports its largest; its ZeRO state
// divides inside the data-parallel group (world / (t · p) ranks). Its cost adds
//   tensor parallel  per micro-batch and block of the largest stage (⌈L/p⌉ blocks), two
//                    all-reduces of B·T·C activations forward and two backward (Megatron),
//                    and e = 2 more per micro-batch for the vocabulary-parallel embedding's
//                    forward and the head's input gradient (e = 1 with p > 1: one end on the
//                    largest stage at most): A·(4·⌈L/p⌉ + e)·2·(t−1)/t·B·T·C·r; with sequence
//                    parallelism each is a reduce-scatter + an all-gather,
//                    A·(4·⌈L/p⌉ + e)·(t−1)/t·B·T·C·(r + c). c is
//                    the compute dtype's bytes, r what a reduction sends an element: the
//                    communicator's width, which is what the engine sends (Gloo, CPU ranks,
//                    reduces 16-bit data in f32: r = 4; NCCL, CUDA ranks, in the dtype: r = c)
//   sequence parallel adds the backward's regathers of a block's two norm outputs (kept as
//                    shards), A·⌈L/p⌉·2·(t−1)/t·B·T·C·c, and once a step the sum of the
//                    norms' partial gradients over the group, 2·(t−1)/t·N·r_g (r_g: 4 on
//                    Gloo, g on NCCL), N the norm elements of ⌈L/p⌉ blocks and the final norm
//                    (the largest stage's at most)
//   pipeline         each micro-batch's activations forward and gradient backward,
//                    2·A·B·T·C·c, and the bubble (p − 1)/(v·m) (v virtual stages with
//                    INTERLEAVED, else 1; m micro-batches), a fraction of the step's compute
// to comm_bytes_per_step and cost. With kJob (the coordinator's default) only the job's own
// layout is planned: the engine trains no other yet (worker/job/job_validation.h,
// CheckEngineSupport), and admission stays as fast as it was. Ties in cost go to the smaller
// t · p. Thread-safe (pure).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "proto/control.pb.h"
#include "proto/job.pb.h"

namespace zt {

// How much of one step's compute time sending 2·Ψ fp32 bytes per rank (a plain fp32
// all-reduce of the gradients) costs. Assumes ~16k tokens per rank per step at ~160 TFLOP/s
// achieved (6·Ψ FLOPs a token) against ~50 GB/s per rank of links (400 Gb/s InfiniBand),
// with no overlap: (8·Ψ / 50e9) / (6·Ψ·16384 / 160e12) ≈ 0.26. Overlap makes communication
// cheaper than this and small batches dearer; it only ranks candidates against recompute.
inline constexpr double kCommCostPerStepOfCompute = 0.25;

// The same for bytes between a device and its host: a PCIe 4.0 ×16 link (~25 GB/s achieved)
// is half the network's bandwidth per rank above, so twice its cost.
inline constexpr double kHostTransferCostPerStepOfCompute = 0.5;
// And for the swap store's NVMe reads and writes: ~6 GB/s per rank from a data-centre NVMe
// drive shared by a node's ranks, about 8× slower than the network above.
inline constexpr double kNvmeTransferCostPerStepOfCompute = 2.0;

// FLOPs of the MLP activation per element of its output (GELU's tanh form or SiLU·up): small
// next to the GEMMs, counted so SELECTIVE's share is not understated.
inline constexpr double kActivationFlopsPerElement = 8.0;

// Which tensor × pipeline layouts the planner searches (see the header).
enum class LayoutSearch : uint8_t {
  // The job's own parallel.tensor_parallel × pipeline_parallel (1 × 1 when unset).
  kJob,
  // Every layout of the world the job does not pin.
  kAll,
};

struct PlannerOptions {
  // Memory a rank may plan with on the smallest device it may be placed on.
  int64_t device_memory_bytes = 0;
  // Fraction of device memory kept free (allocator slack, CUDA context, fragmentation), in
  // [0, 1); the same fraction of host memory.
  double safety_margin = 0.10;
  // Pinned host memory a rank may plan with (its share of the node's host memory), ≥ 0;
  // 0: not checked.
  int64_t host_memory_bytes = 0;
  LayoutSearch layouts = LayoutSearch::kJob;
};

// `job` is validated with defaults applied, except the fields the planner chooses:
// parallel.zero_stage (unset: the planner chooses), memory.activation_checkpointing
// (CHECKPOINTING_UNSPECIFIED: the planner chooses), parallel.tensor_parallel /
// pipeline_parallel (unset: 1 with kJob, searched with kAll; shard_group_size unset: the
// data-parallel size of each layout) and offload.optimizer / offload.params
// (DEVICE_UNSPECIFIED: the planner chooses) — LoadJobForPlanning / JobForPlanning
// (worker/job/job_loading.h) produce it. Returns the plan with every candidate, cheapest
// first; `chosen.fits` is false when none fits (then `chosen` is the smallest-memory
// candidate and its rejected_because gives the numbers). InvalidArgument naming the option
// when device_memory_bytes ≤ 0, host_memory_bytes < 0 or safety_margin is outside [0, 1).
absl::StatusOr<zerotrain::ShardingPlan> PlanSharding(const zerotrain::JobSpec& job,
                                                     const PlannerOptions& options);

// `job` with the plan's choice written into its unpinned fields (parallel.zero_stage,
// tensor_parallel and pipeline_parallel when unset, memory.activation_checkpointing when
// CHECKPOINTING_UNSPECIFIED, offload.optimizer and offload.params when DEVICE_UNSPECIFIED);
// pinned fields are left as the job set them. Then ApplyJobDefaults fills the rest.
zerotrain::JobSpec WithPlan(zerotrain::JobSpec job, const zerotrain::ShardingPlan& plan);

}  // namespace zt
