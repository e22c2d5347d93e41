#include "worker/plan/memory_plan.h"

#include <omp.h>

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/linear.h"
#include "worker/model/activation_table.h"
#include "worker/model/lora_tensor_parallel.h"
#include "worker/model/param_layout.h"
#include "worker/model/tensor_parallel_slice.h"
#include "worker/plan/lora_plan.h"
#include "worker/plan/optimizer_state_layout.h"
#include "worker/plan/parallel_plan.h"

namespace zt {
namespace {

bool OnCuda(const zerotrain::JobSpec& job) {
  return job.resources().device() == zerotrain::ResourceConfig::CUDA;
}

}  // namespace

const char* MemoryCategoryName(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::kParameters:
      return "parameters";
    case MemoryCategory::kGradients:
      return "gradients";
    case MemoryCategory::kOptimizerState:
      return "optimizer";
    case MemoryCategory::kActivations:
      return "activations";
    case MemoryCategory::kWorkspace:
      return "workspace";
    case MemoryCategory::kCommunication:
      return "communication";
    case MemoryCategory::kPinnedHost:
      return "pinned_host";
    case MemoryCategory::kNvme:
      return "nvme";
  }
  return "?";
}

int64_t BufferSpec::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

int64_t PlacedBytes(const BufferSpec& b) {
  if (b.category != MemoryCategory::kNvme) return AlignedBytes(b.bytes());
  return (b.bytes() + kNvmeExtentAlignment - 1) / kNvmeExtentAlignment * kNvmeExtentAlignment;
}

bool IsDeviceCategory(MemoryCategory c) {
  return c != MemoryCategory::kPinnedHost && c != MemoryCategory::kNvme;
}

int64_t MemoryPlan::CategoryBytes(MemoryCategory c) const {
  int64_t total = 0;
  for (const BufferSpec& b : buffers) {
    if (b.category == c) total += PlacedBytes(b);
  }
  return total;
}

int64_t MemoryPlan::TotalBytes() const {
  int64_t total = 0;
  for (const BufferSpec& b : buffers) total += PlacedBytes(b);
  return total;
}

int64_t MemoryPlan::DeviceBytes() const {
  int64_t total = 0;
  for (const BufferSpec& b : buffers) {
    if (IsDeviceCategory(b.category)) total += PlacedBytes(b);
  }
  return total;
}

DeviceContext JobDeviceContext(const zerotrain::JobSpec& job) {
  if (OnCuda(job)) {
    // Only the kind matters for sizing (the workspaces of the CUDA ops); the rank's device
    // ordinal and stream come from its RankDevice.
    DeviceContext ctx;
    ctx.device = Device{.kind = DeviceKind::kCuda, .index = 0};
    ctx.allow_tf32 = job.precision().allow_tf32();
    return ctx;
  }
  const int threads = job.resources().cpu_threads();
  // CPU "devices" share the machine's cores: each rank of the job takes an equal part.
  const int ranks = std::max(1, job.parallel().world_size());
  DeviceContext ctx = CpuContext(threads > 0 ? threads : std::max(1, omp_get_num_procs() / ranks));
  // The CPU GEMMs ignore it; carried so the context says what the job asked for.
  ctx.allow_tf32 = job.precision().allow_tf32();
  return ctx;
}

int64_t PaddedUnitNumel(int64_t unit_numel, int group_size) {
  const int64_t quantum = kShardAlignmentElements * group_size;
  return (unit_numel + quantum - 1) / quantum * quantum;
}

UnitShard ShardOf(int64_t unit_numel, const ShardGeometry& geometry) {
  UnitShard s;
  s.numel = unit_numel;
  s.padded = PaddedUnitNumel(unit_numel, geometry.group_size);
  s.shard_numel = s.padded / geometry.group_size;
  s.offset = geometry.group_rank() * s.shard_numel;
  s.owned = {.begin = std::min(unit_numel, s.offset),
             .end = std::min(unit_numel, s.offset + s.shard_numel)};
  return s;
}

absl::StatusOr<UnitShard> RowAlignedShardOf(int64_t unit_numel, int64_t row_numel,
                                            const ShardGeometry& geometry) {
  if (row_numel <= 0 || unit_numel % row_numel != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("row-aligned shard: row_numel ", row_numel, " must be positive and divide ",
                     "the unit's ", unit_numel, " elements (whole rows only)"));
  }
  const int64_t rows = unit_numel / row_numel;
  // The fewest rows whose elements are a multiple of the alignment.
  const int64_t row_quantum = kShardAlignmentElements / std::gcd(row_numel, kShardAlignmentElements);
  const int64_t rows_each = (rows + geometry.group_size - 1) / geometry.group_size;
  const int64_t rows_per_shard = (rows_each + row_quantum - 1) / row_quantum * row_quantum;
  UnitShard s;
  s.numel = unit_numel;
  s.shard_numel = rows_per_shard * row_numel;
  s.padded = s.shard_numel * geometry.group_size;
  s.offset = geometry.group_rank() * s.shard_numel;
  s.owned = {.begin = std::min(unit_numel, s.offset),
             .end = std::min(unit_numel, s.offset + s.shard_numel)};
  return s;
}

UnitShard ShardOfUnit(const UnitLayout& unit, const ShardGeometry& geometry) {
  if (unit.kind == UnitKind::kEmbedding && geometry.embedding_row_numel > 0) {
    absl::StatusOr<UnitShard> rows =
        RowAlignedShardOf(unit.numel, geometry.embedding_row_numel, geometry);
    // [wte; wpe] is whole rows of d_model elements, so this holds for every valid model.
    if (rows.ok()) return *rows;
  }
  return ShardOf(unit.numel, geometry);
}

namespace {

DType StorageDType(zerotrain::PrecisionConfig::DType d) {
  switch (d) {
    case zerotrain::PrecisionConfig::BF16:
      return DType::kBF16;
    case zerotrain::PrecisionConfig::FP16:
      return DType::kF16;
    default:
      return DType::kF32;
  }
}

// The dtype the gradients' data-parallel collectives carry: reduce_dtype, unset meaning
// grad_dtype (job_defaults.cc sets it so; a plan of an undefaulted job reads the same).
DType ReduceDType(const zerotrain::PrecisionConfig& p) {
  return p.reduce_dtype() == zerotrain::PrecisionConfig::DTYPE_UNSPECIFIED
             ? StorageDType(p.grad_dtype())
             : StorageDType(p.reduce_dtype());
}

// The vocabulary-sharded head's GEMMs (worker/model/transformer_vocab_shard.cc): logits of a
// chunk of the shard group's G·B·T rows over this rank's vocabulary columns, their backward
// (the input gradient's partials, the rows' weight gradient); the last chunk may be shorter.
// 0 on a rank without vocabulary rows (it runs no GEMM).
int64_t VocabHeadGemmWorkspaceBytes(const zerotrain::JobSpec& job, const ShardGeometry& g,
                                    const ModelLayout& layout, const DeviceContext& ctx,
                                    const LinearDTypes& dtypes) {
  const int64_t C = g.embedding_row_numel;
  const UnitShard shard = ShardOfUnit(layout.embedding(), g);
  const int64_t V = layout.embedding().Find("wte")->shape[0];
  const int64_t vl = std::min(shard.owned.end / C, V) - std::min(shard.owned.begin / C, V);
  if (vl <= 0) return 0;
  const int64_t bt = int64_t{job.train().micro_batch_size()} * job.data().seq_len();
  const int64_t rows = g.group_size * bt;
  const int64_t chunk =
      VocabShardChunkRows(LossChunkRows(bt) * V, rows, std::min(V, shard.shard_numel / C));
  int64_t most = 0;
  for (const int64_t m : {chunk, rows % chunk}) {
    if (m == 0) continue;
    absl::StatusOr<int64_t> bytes = LinearWorkspaceBytes(ctx, m, C, vl, dtypes);
    // A shape the backend refuses counts 0: its GEMM then fails naming the backend's error.
    if (bytes.ok()) most = std::max(most, *bytes);
  }
  return most;
}

zerotrain::OffloadConfig::Device OffloadDevice(zerotrain::OffloadConfig::Device d) {
  return d == zerotrain::OffloadConfig::CPU || d == zerotrain::OffloadConfig::NVME
             ? d
             : zerotrain::OffloadConfig::NONE;
}

std::optional<MemoryCategory> OffloadCategory(zerotrain::OffloadConfig::Device d) {
  switch (OffloadDevice(d)) {
    case zerotrain::OffloadConfig::CPU:
      return MemoryCategory::kPinnedHost;
    case zerotrain::OffloadConfig::NVME:
      return MemoryCategory::kNvme;
    default:
      return std::nullopt;
  }
}

// Moves the model states job.offload names off the device (see the header) and adds the ring.
// Parameters move only at stage 3, where "<u>.params" is the rank's shard: below it the
// parameters are whole on every rank, and validation refuses offload.params there. A LoRA
// job's (`lora`) are its frozen base: its "<u>.params" and quantized "<u>.qbase" shards move,
// while the adapters the optimizer steps stay on the device.
void MoveOffloadedStates(const zerotrain::JobSpec& job, bool lora, MemoryPlan& plan) {
  const std::optional<MemoryCategory> optimizer = OffloadCategory(job.offload().optimizer());
  const std::optional<MemoryCategory> params =
      job.parallel().zero_stage() >= 3 ? OffloadCategory(job.offload().params()) : std::nullopt;
  if (!optimizer && !params) return;
  for (BufferSpec& b : plan.buffers) {
    std::optional<MemoryCategory> to;
    if (b.category == MemoryCategory::kOptimizerState) to = optimizer;
    if (b.category == MemoryCategory::kParameters &&
        (b.name.ends_with(".params") || b.name.ends_with(".qbase"))) {
      to = params;
    }
    if (!to) continue;
    b.offloaded_from = b.category;
    b.category = *to;
  }
  // buffer_count is the depth of NVMe's read-ahead and write-behind (DeepSpeed's aio buffer
  // pool). Host-only offload moves one unit at a time through what the host step stages
  // (worker/optim/host_optimizer.h): a unit's parameters going up, unless they live on the host
  // (offload.params CPU: the update writes them in place), then its gradients coming down,
  // unless they came down during the backward into "<unit>.grads.host" (stage ≥ 1, PlanMemory).
  // A LoRA job's swapped shards are its frozen base, read by the gathers alone through a ring
  // of their own (worker/offload/swapped_base.h): the optimizer's ring is what the optimizer's
  // offload alone plans.
  const bool swapped_base = lora && params == MemoryCategory::kNvme;
  const bool nvme = optimizer == MemoryCategory::kNvme ||
                    (params == MemoryCategory::kNvme && !swapped_base);
  int ring = job.offload().buffer_count();
  if (!nvme) {
    const bool host_step = optimizer == MemoryCategory::kPinnedHost;
    const bool stepped_on_host = params == MemoryCategory::kPinnedHost && !lora;
    ring = (host_step && !stepped_on_host ? 1 : 0) +
           (host_step && job.parallel().zero_stage() < 1 ? 1 : 0);
  }
  // The ring goes first in the pinned_host arena, whose region starts on a page: each buffer
  // then starts on one too (buffer_size is a multiple of 4096), as the swap store's O_DIRECT
  // transfers need, whatever else the category holds (offloaded parameter shards).
  std::vector<BufferSpec> ring_buffers;
  for (int k = 0; k < ring; ++k) {
    ring_buffers.push_back({.name = absl::StrCat("offload.ring.", k),
                            .category = MemoryCategory::kPinnedHost,
                            .dtype = DType::kU8,
                            .shape = {job.offload().buffer_size()}});
  }
  for (int k = 0; swapped_base && k < job.offload().buffer_count(); ++k) {
    ring_buffers.push_back({.name = absl::StrCat("offload.base_ring.", k),
                            .category = MemoryCategory::kPinnedHost,
                            .dtype = DType::kU8,
                            .shape = {job.offload().buffer_size()}});
  }
  plan.buffers.insert(plan.buffers.begin(), ring_buffers.begin(), ring_buffers.end());
}

}  // namespace

int64_t LargestOffloadTransferBytes(const zerotrain::JobSpec& job, int rank) {
  const MemoryPlan plan = PlanMemory(job, rank);
  int64_t largest = 0;
  // Parameter shards in the pinned pool (offload.params CPU: "<u>.params", "<u>.qbase") never
  // pass through the ring: a gather uploads them straight from the pool into device memory
  // (ShardingEngine::GatherUnit) and the host step updates them in place.
  bool params_on_host = false;
  for (const BufferSpec& b : plan.buffers) {
    if (!b.offloaded_from) continue;
    if (*b.offloaded_from == MemoryCategory::kParameters &&
        b.category == MemoryCategory::kPinnedHost) {
      params_on_host = true;
      continue;
    }
    largest = std::max(largest, b.bytes());
  }
  if (OffloadCategory(job.offload().optimizer())) {
    // The host step reads each unit's reduced gradient shard and writes back its parameters,
    // unless they live on the host (a LoRA job's there are its frozen base: its adapters,
    // which the step updates, are on the device).
    const ParallelLayout place = ParallelLayout::ForJob(job, rank);
    const ShardGeometry& geometry = place.shard();
    const bool params_go_up = !params_on_host || job.model().has_lora();
    const int64_t widest =
        std::max(DTypeSize(StorageDType(job.precision().grad_dtype())),
                 params_go_up ? DTypeSize(StorageDType(job.precision().param_dtype())) : 0);
    for (const UnitLayout& u : RankModelLayout(job, place).units) {
      largest = std::max(largest, ShardOfUnit(u, geometry).shard_numel * widest);
    }
  }
  return largest;
}

int64_t TiedSumPieceElements(const zerotrain::JobSpec& job, int64_t numel) {
  const DType grad = StorageDType(job.precision().grad_dtype());
  if (grad == DType::kF32 || job.parallel().bucket_bytes() <= 0) return numel;
  return std::min(numel, std::max<int64_t>(1, job.parallel().bucket_bytes() / DTypeSize(grad)));
}

ConversionBufferSizes ConversionBuffers(const zerotrain::JobSpec& job,
                                        const ParallelLayout& layout) {
  ConversionBufferSizes sizes;
  if (const int t = layout.tensor_size(); t > 1) {
    if (StorageDType(job.precision().compute_dtype()) != DType::kF32) {
      sizes.tensor =
          int64_t{job.train().micro_batch_size()} * job.data().seq_len() * job.model().d_model();
    }
    if (job.parallel().sequence_parallel() &&
        StorageDType(job.precision().grad_dtype()) != DType::kF32) {
      // Sequence parallelism sums the norms' 16-bit gradients (C each) over the same group.
      sizes.tensor = std::max<int64_t>(sizes.tensor, job.model().d_model());
    }
    if (StorageDType(job.precision().grad_dtype()) != DType::kF32 && job.model().has_lora()) {
      // LoRA: each column-parallel site's A gradient (r × in) is summed over the group in the
      // gradient dtype (Transformer::ReduceReplicatedKvGrads); h (B·T × r) fits the above.
      for (const UnitLayout& u : RankModelLayout(job, layout).units) {
        for (const LoraSite& site : u.lora) {
          if (!IsRowParallelLoraSite(site)) sizes.tensor = std::max(sizes.tensor, site.a.numel);
        }
      }
    }
    if (StorageDType(job.precision().grad_dtype()) != DType::kF32 && job.model().n_kv_head() < t) {
      const ModelLayout local = RankModelLayout(job, layout);
      for (const UnitLayout& u : local.units) {
        // LoRA: the frozen base has no gradient; a replicated KV head's k_proj / v_proj B
        // gradient is what the head's ranks sum (Transformer::ReduceReplicatedKvGrads).
        for (const LoraSite& site : u.lora) {
          if (IsKvLoraSite(site)) sizes.tensor_kv = std::max(sizes.tensor_kv, site.b.numel);
        }
        if (local.lora || !u.Find("attn.qkv.weight")) continue;
        for (const auto& [begin, end] :
             ReplicatedKvRanges(job.model(), u, t, layout.coordinates().tensor)) {
          sizes.tensor_kv = std::max(sizes.tensor_kv, end - begin);
        }
      }
    }
  }
  // A vocabulary-sharded embedding reduce-scatters the group's (G·B·T, C) rows over the shard
  // group in the compute dtype (the lookup's sums and the head's input gradient), which Gloo
  // widens to f32 as it does 16-bit gradients.
  if (const ShardGeometry& g = layout.shard();
      g.embedding_row_numel > 0 && StorageDType(job.precision().compute_dtype()) != DType::kF32) {
    sizes.gradients = int64_t{g.group_size} * job.train().micro_batch_size() *
                      job.data().seq_len() * job.model().d_model();
  }
  const int64_t vocab_rows = sizes.gradients;
  const bool grad_16bit = StorageDType(job.precision().grad_dtype()) != DType::kF32;
  // The gradients' collectives carry reduce_dtype (GradientReduceElements), the tied sum
  // grad_dtype.
  const bool reduce_16bit = ReduceDType(job.precision()) != DType::kF32;
  if (!grad_16bit && !reduce_16bit) return sizes;
  if (const int p = layout.pipeline_size(); grad_16bit && p > 1 && job.model().tie_embeddings()) {
    const int s = layout.coordinates().pipeline;
    if (s == 0 || s == p - 1) {
      const ModelLayout local = RankModelLayout(job, layout);
      const ParamSpec* wte =
          s == 0 ? local.units.front().Find("wte") : local.units.back().Find("lm_head.weight");
      if (wte != nullptr) sizes.tied = TiedSumPieceElements(job, wte->numel);
    }
  }
  const ShardGeometry& g = layout.shard();
  const int stage = job.parallel().zero_stage();
  // A communicator of one rank reduces nothing, so it converts nothing.
  const bool gradients_reduced = (stage == 0 ? g.world_size : g.group_size) > 1;
  const int64_t bucket =
      job.parallel().bucket_bytes() / DTypeSize(StorageDType(job.precision().grad_dtype()));
  for (const UnitLayout& u : RankModelLayout(job, layout).units) {
    // What is reduced is the unit's trainable buffer (a LoRA unit's adapters).
    const int64_t numel = u.trainable_numel();
    if (numel == 0) continue;
    // A vocabulary-sharded embedding's gradient shard is complete where it is made.
    if (u.kind == UnitKind::kEmbedding && g.embedding_row_numel > 0 && g.groups() == 1) continue;
    const UnitShard shard = u.trainable() ? ShardOfUnit(u, g) : ShardOf(numel, g);
    if (gradients_reduced) {
      const int64_t reduced =
          stage > 0 ? shard.padded : (bucket > 0 ? std::min(bucket, numel) : numel);
      sizes.gradients = std::max(sizes.gradients, reduced);
    }
    if (stage > 0 && g.groups() > 1) sizes.replicas = std::max(sizes.replicas, shard.shard_numel);
  }
  if (!reduce_16bit) {  // the gradients reduce in f32 (converted by the engine): Gloo widens none
    sizes.gradients = vocab_rows;
    sizes.replicas = 0;
  }
  return sizes;
}

int64_t GradientReduceElements(const zerotrain::JobSpec& job, const ParallelLayout& layout) {
  const DType grad = StorageDType(job.precision().grad_dtype());
  if (ReduceDType(job.precision()) == grad) return 0;
  const ShardGeometry& g = layout.shard();
  const int stage = job.parallel().zero_stage();
  const bool reduced = (stage == 0 ? g.world_size : g.group_size) > 1;
  const bool across = stage > 0 && g.groups() > 1;
  const int64_t bucket = job.parallel().bucket_bytes() / DTypeSize(grad);
  int64_t elements = 0;
  for (const UnitLayout& u : RankModelLayout(job, layout).units) {
    const int64_t numel = u.trainable_numel();
    if (numel == 0) continue;
    const UnitShard shard = u.trainable() ? ShardOfUnit(u, g) : ShardOf(numel, g);
    // A vocabulary-sharded embedding's shard is complete where it is made: only the replica
    // groups sum it.
    const bool vocab = u.kind == UnitKind::kEmbedding && g.embedding_row_numel > 0;
    if (reduced && !vocab) {
      elements = std::max(elements, stage > 0 ? shard.padded + shard.shard_numel
                                              : (bucket > 0 ? std::min(bucket, numel) : numel));
    }
    if (across) elements = std::max(elements, shard.shard_numel);
  }
  return elements;
}

bool TensorParallelAdafactor(const zerotrain::JobSpec& job, const ParallelLayout& layout) {
  return job.optimizer().type() == zerotrain::OptimizerConfig::ADAFACTOR &&
         layout.tensor_size() > 1;
}

bool IsCheckpointed(const BufferSpec& b, bool weights_only) {
  if (b.reloaded_at_start) return false;
  if (b.role() == MemoryCategory::kParameters) {
    return b.name.ends_with(".params") || b.name.ends_with(".lora") || b.name.ends_with(".qbase") ||
           IsQuantizedBaseBuffer(b.name);
  }
  return b.role() == MemoryCategory::kOptimizerState &&
         (!weights_only || b.name.ends_with(".master") || b.name.ends_with(".master_low"));
}

bool ShardedAdafactor(const zerotrain::JobSpec& job, const ParallelLayout& layout) {
  return job.optimizer().type() == zerotrain::OptimizerConfig::ADAFACTOR &&
         job.parallel().zero_stage() >= 1 && layout.shard().group_size > 1;
}

bool GradientSlotsInEmbeddingGather(const zerotrain::JobSpec& job, const ModelLayout& layout) {
  const auto& parallel = job.parallel();
  return parallel.zero_stage() == 3 && parallel.reshard_after_forward() &&
         job.train().grad_accum_steps() <= 1 && layout.tied_embeddings && !layout.units.empty() &&
         layout.embedding().trainable_numel() > 0 && !VocabularyShardedEmbedding(job);
}

bool StageGradientsPerMicroBatch(const zerotrain::JobSpec& job) {
  const auto& parallel = job.parallel();
  // At stage 2 (or 3 keeping its units gathered) a stage with one micro-batch a step reduces
  // its one backward of each unit as it ends too, as a ZeRO-2 rank off a pipeline does: there
  // is nothing to accumulate, so no "<u>.grad_accum" to plan.
  return parallel.pipeline_parallel() > 1 && parallel.zero_stage() >= 2 &&
         ((parallel.zero_stage() == 3 && parallel.reshard_after_forward()) ||
          job.train().grad_accum_steps() <= 1);
}

MemoryPlan PlanMemory(const zerotrain::JobSpec& job, int rank) {
  return PlanMemory(job, ParallelLayout::ForJob(job, rank));
}

MemoryPlan PlanMemory(const zerotrain::JobSpec& job, const ParallelLayout& place) {
  const ModelLayout layout = RankModelLayout(job, place);
  const auto& precision = job.precision();
  const auto& parallel = job.parallel();
  const ShardGeometry& geometry = place.shard();
  const int stage = parallel.zero_stage();
  const bool accumulate_full =
      stage >= 2 && job.train().grad_accum_steps() > 1 && !StageGradientsPerMicroBatch(job);
  const DType param_dtype = StorageDType(precision.param_dtype());
  const DType grad_dtype = StorageDType(precision.grad_dtype());
  // The optimizer steps on the host from gradients copied down during the backward
  // (offload.optimizer CPU; validation asks stage ≥ 1). With NVME the ring stages them a unit at
  // a time at the step instead: host memory is what ZeRO-Infinity spends to fit, and a pinned
  // copy of every unit's shard would cost grad_dtype × P / N of it (6 GB for a 3 B model at one
  // rank) to hide a copy its swap traffic dwarfs.
  // The delayed update's host step runs beside the next backward, so it cannot stage that
  // backward's gradients through the ring: with it, NVME keeps the host copies (two banks) too.
  const bool host_step =
      stage >= 1 && (job.offload().optimizer() == zerotrain::OffloadConfig::CPU ||
                     (job.offload().optimizer() == zerotrain::OffloadConfig::NVME &&
                      job.offload().delayed_update().enabled()));
  const bool delayed_update = host_step && job.offload().delayed_update().enabled();
  const bool params_swapped =
      stage >= 3 && job.offload().params() == zerotrain::OffloadConfig::NVME;
  MemoryPlan plan;
  auto add = [&](std::string name, MemoryCategory category, DType dtype, int64_t numel) {
    plan.buffers.push_back({std::move(name), category, dtype, {numel}});
  };
  // Units whose full buffers take turns in shared slots: all but a tied embedding, which the
  // head's projection uses too and so stays resident for the whole step.
  const bool tied = layout.tied_embeddings;
  int64_t largest_rotating = 0, largest_shard = 0, largest_gathered = 0;
  // Gradients are of each unit's trainable buffer (a LoRA unit's adapters); parameters that
  // stage 3 gathers are the whole unit's (a LoRA job's frozen base).
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const UnitShard shard = layout.units[u].trainable()
                                ? ShardOfUnit(layout.units[u], geometry)
                                : ShardOf(layout.units[u].trainable_numel(), geometry);
    largest_shard = std::max(largest_shard, shard.shard_numel);
    if (!(tied && u == 0)) largest_rotating = std::max(largest_rotating, shard.padded);
    if (!(tied && u == 0)) {
      largest_gathered = std::max(largest_gathered, ShardOfUnit(layout.units[u], geometry).padded);
    }
  }
  for (const UnitLayout& u : layout.units) {
    const UnitShard shard = ShardOfUnit(u, geometry);
    const int64_t full = stage == 0 ? u.numel : shard.padded;
    add(u.name + ".params", MemoryCategory::kParameters, param_dtype,
        stage >= 3 ? shard.shard_numel : full);
    const bool reloaded = !u.trainable() && !job.model().init_from().empty();
    plan.buffers.back().reloaded_at_start = reloaded;
    // A vocabulary-sharded embedding is never gathered: its lookup and the head read the shard.
    const bool vocab_embedding = u.kind == UnitKind::kEmbedding && geometry.embedding_row_numel > 0;
    if (stage >= 3 && !parallel.reshard_after_forward() && !vocab_embedding) {
      add(u.name + ".gathered", MemoryCategory::kParameters, param_dtype, shard.padded);
    }
    if (!u.trainable()) {
      // A LoRA job's frozen base: no gradient, no optimizer state (the adapters' are in
      // LoraStateBuffers), and no checkpoint copy when model.init_from reloads it.
      continue;
    }
    add(u.name + ".grads", MemoryCategory::kGradients, grad_dtype,
        stage >= 2 ? shard.shard_numel : full);
    if (accumulate_full && !vocab_embedding) {
      add(u.name + ".grad_accum", MemoryCategory::kGradients, grad_dtype, shard.padded);
    }
    if (host_step) {
      // ZeRO-Offload's overlap: the reduced shard comes down here during the backward
      // (worker/optim/gradient_downloads.h), one buffer a unit, so no copy waits for another.
      add(u.name + ".grads.host", MemoryCategory::kPinnedHost, grad_dtype, shard.shard_numel);
      if (delayed_update) {
        // The delayed update (worker/optim/delayed_host_step.h): step t's host step reads one
        // bank of gradients while step t+1's backward copies into the other, and writes the
        // updated parameter shard here, uploaded only once step t+1's backward has ended.
        // Swapped shards (offload.params NVME) need no such bank: the host step writes them
        // into the swap store's next generation, which the switch commits.
        add(u.name + ".grads.host.1", MemoryCategory::kPinnedHost, grad_dtype, shard.shard_numel);
        if (!params_swapped) {
          add(u.name + ".params.host", MemoryCategory::kPinnedHost, param_dtype, shard.shard_numel);
        }
      }
    }
    if (precision.master_weights()) {
      // A split master keeps only the low halves: the high halves are the bf16 parameters.
      const bool split = precision.split_master_weights();
      add(u.name + (split ? ".master_low" : ".master"), MemoryCategory::kOptimizerState,
          split ? DType::kI16 : DType::kF32, stage >= 1 ? shard.shard_numel : u.numel);
    }
    const FlatRange state_range = stage >= 1 ? shard.owned : FlatRange{};
    for (const UnitOptimizerState::Buffer& b :
         OptimizerStateFor(job.optimizer(), u, state_range).buffers) {
      add(u.name + "." + b.name, MemoryCategory::kOptimizerState, b.dtype, b.numel);
    }
  }
  for (BufferSpec& b : LoraStateBuffers(job, layout, grad_dtype, geometry)) {
    plan.buffers.push_back(b);
  }
  const bool slots_in_embedding = GradientSlotsInEmbeddingGather(job, layout);
  if (stage >= 3 && parallel.reshard_after_forward()) {
    for (int k = 0; k <= parallel.prefetch_units(); ++k) {
      add(absl::StrCat("gather.", k), MemoryCategory::kParameters, param_dtype, largest_gathered);
    }
    if (tied && geometry.embedding_row_numel == 0) {
      int64_t numel = ShardOfUnit(layout.embedding(), geometry).padded;
      if (slots_in_embedding) {
        const int64_t slot_bytes = largest_rotating * DTypeSize(grad_dtype);
        const int64_t both = GradientSlotOffset(1, slot_bytes) + slot_bytes;
        const int64_t size = DTypeSize(param_dtype);
        numel = std::max(numel, (both + size - 1) / size);
      }
      add("gather.embedding", MemoryCategory::kParameters, param_dtype, numel);
    }
  }
  if (stage >= 3 && job.offload().params() == zerotrain::OffloadConfig::CPU &&
      (place.pipeline_size() == 1 || parallel.reshard_after_forward())) {
    // offload.params CPU: the host shards of the gathers after a pass's first ones go up one
    // use before their gather is issued, while the gather buffer they belong in is still
    // another unit's; they wait here. A slot is taken when the upload starts and free once its
    // gather has been waited for: at most prefetch_units + 1 at once (the k gathers in flight
    // and the next upload; ShardingEngine::UploadAhead). A pipeline stage's pass is its
    // schedule's uses (reshard_after_forward), the same rule over the stage's own units; a
    // stage that gathers its units whole for the step (reshard_after_forward false) uploads
    // each shard into its own "<unit>.gathered" buffer and needs none.
    int64_t largest_param_shard = 0;
    for (const UnitLayout& u : layout.units) {
      largest_param_shard = std::max(largest_param_shard, ShardOfUnit(u, geometry).shard_numel);
    }
    for (int k = 0; k <= parallel.prefetch_units(); ++k) {
      add(absl::StrCat("param_upload.", k), MemoryCategory::kParameters, param_dtype,
          largest_param_shard);
    }
    if (ShardsQuantizedBase(job, layout)) {
      // A LoRA job's NF4/INT8 base: each slot's unit's quantized shard ("<block>.qbase", f32
      // words) goes up beside its parameter shard, into the slot's quantized twin.
      int64_t largest_quantized_shard = 0;
      for (const UnitLayout& u : layout.units) {
        const QuantizedUnitBytes quantized = QuantizedBytesOf(layout, u);
        if (quantized.pieces.empty()) continue;
        largest_quantized_shard =
            std::max(largest_quantized_shard, ShardOf(quantized.words(), geometry).shard_numel);
      }
      for (int k = 0; largest_quantized_shard > 0 && k <= parallel.prefetch_units(); ++k) {
        add(absl::StrCat("qbase_upload.", k), MemoryCategory::kParameters, DType::kF32,
            largest_quantized_shard);
      }
    }
  }
  if (stage >= 2 && !accumulate_full) {
    if (!slots_in_embedding) {
      add("grad.full.0", MemoryCategory::kGradients, grad_dtype, largest_rotating);
      add("grad.full.1", MemoryCategory::kGradients, grad_dtype, largest_rotating);
    }
    if (tied && layout.embedding().trainable_numel() > 0 && geometry.embedding_row_numel == 0) {
      add("grad.full.embedding", MemoryCategory::kGradients, grad_dtype,
          ShardOfUnit(layout.embedding(), geometry).padded);
    }
  }
  if (const int64_t reduce = GradientReduceElements(job, place); reduce > 0) {
    add("grad.reduce", MemoryCategory::kCommunication, ReduceDType(precision), reduce);
  }
  if (stage == 1) {
    add("grad.shard.0", MemoryCategory::kCommunication, grad_dtype, largest_shard);
    add("grad.shard.1", MemoryCategory::kCommunication, grad_dtype, largest_shard);
  }
  // One block of 6 slots per data-parallel rank, and one such block per tensor-parallel rank
  // (the step's statistics are gathered over both: ShardingEngine::ExchangeStatistics).
  add("comm.scalars", MemoryCategory::kCommunication, DType::kF32,
      6 * geometry.world_size * place.tensor_size());
  if (const int pp = place.pipeline_size(); pp > 1) {
    // Every stage's block of those (the step's totals: Trainer::ReadStatistics), and every
    // stage's (busy, span) seconds after the rank's own (the bubble: Trainer::PipelineBubble),
    // gathered over the pipeline group where a GPU rank's collectives read: on the device.
    add(kPipelineScalars, MemoryCategory::kCommunication, DType::kF32,
        6 * geometry.world_size * place.tensor_size() * pp);
    add(kPipelineBubble, MemoryCategory::kCommunication, DType::kF32, 2 * (1 + pp));
  }
  const ConversionBufferSizes conversion = ConversionBuffers(job, place);
  // Gloo converts 16-bit data on the host: a GPU rank's (staged) conversion buffers are pinned.
  const MemoryCategory convert_category =
      OnCuda(job) ? MemoryCategory::kPinnedHost : MemoryCategory::kCommunication;
  const std::pair<const char*, int64_t> converted[] = {{"gradients", conversion.gradients},
                                                       {"replicas", conversion.replicas},
                                                       {"tensor", conversion.tensor},
                                                       {"tensor_kv", conversion.tensor_kv},
                                                       {"tied", conversion.tied}};
  for (int k = 0; k < 2; ++k) {
    for (const auto& [which, elements] : converted) {
      if (elements > 0) {
        add(absl::StrCat("comm.convert.", which, ".", k), convert_category, DType::kF32,
            elements);
      }
    }
  }
  if (ShardedAdafactor(job, place) || TensorParallelAdafactor(job, place)) {
    int64_t scratch = 2;
    for (const UnitLayout& u : layout.units) {
      for (const ParamSpec& p : u.params) {
        if (p.shape.size() == 2) scratch = std::max(scratch, p.shape[0] + p.shape[1] + 2);
      }
    }
    // Where the step runs: an offloaded optimizer's host step sums its statistics in host
    // memory (over the host step's own contexts on a GPU rank: worker/shard/host_step_sums.h).
    const bool host_step = job.offload().optimizer() == zerotrain::OffloadConfig::CPU ||
                           job.offload().optimizer() == zerotrain::OffloadConfig::NVME;
    add("optimizer.reduce_scratch",
        host_step ? MemoryCategory::kPinnedHost : MemoryCategory::kCommunication, DType::kF32,
        scratch);
  }
  MoveOffloadedStates(job, layout.lora, plan);
  if (!job.checkpoint().dir().empty() && (job.checkpoint().async() || OnCuda(job))) {
    // The rank's checkpointed state (worker/checkpoint/rank_state.h: parameters and optimizer state),
    // copied at the save point and written from here while training goes on (and on a GPU,
    // where the host cannot read device memory, the page-locked copy every save writes from).
    int64_t staged = 0;
    for (const BufferSpec& b : plan.buffers) {
      if (IsCheckpointed(b, !job.checkpoint().save_optimizer())) {
        staged += AlignedBytes(b.bytes());
      }
    }
    add("checkpoint.staging", MemoryCategory::kPinnedHost, DType::kU8, staged);
  }
  const int64_t B = job.train().micro_batch_size(), T = job.data().seq_len();
  const DType compute = StorageDType(precision.compute_dtype());
  if (geometry.embedding_row_numel > 0) {
    // The vocabulary-sharded embedding (worker/model/transformer_vocab_shard.cc): the shard
    // group's G·B·T token ids, targets and positions, its rows (the lookup's partial sums, then
    // the final norm's outputs, then the lookup's output gradient) and their gradient's
    // partials, and the cross-entropy's row statistics and losses for every row. The
    // partials are f32 (summed in f32 and rounded once, as the one-rank head's GEMM), and with
    // 16-bit activations their sum has an f32 buffer of the rank's rows before its rounding.
    // Positions are gathered only where rows restart (packed, with learned positions).
    const int64_t rows = int64_t{geometry.group_size} * B * T, C = job.model().d_model();
    add("vocab.tokens", MemoryCategory::kWorkspace, DType::kI32, rows);
    add("vocab.targets", MemoryCategory::kWorkspace, DType::kI32, rows);
    if (job.data().packing() && layout.embedding().Find("wpe") != nullptr) {
      add("vocab.positions", MemoryCategory::kWorkspace, DType::kI32, rows);
    }
    add("vocab.rows", MemoryCategory::kWorkspace, compute, rows * C);
    add("vocab.row_grads", MemoryCategory::kWorkspace, DType::kF32, rows * C);
    if (compute != DType::kF32) {
      add("vocab.head_grad", MemoryCategory::kWorkspace, DType::kF32, B * T * C);
    }
    add("vocab.ce_maxes", MemoryCategory::kWorkspace, DType::kF32, geometry.group_size * rows);
    add("vocab.ce_sums", MemoryCategory::kWorkspace, DType::kF32, 2 * rows);
    add("vocab.losses", MemoryCategory::kWorkspace, DType::kF32, rows);
  }
  if (job.data().packing()) {
    // A packed micro-batch's document starts and positions (Trainer::UploadBatch), copied in
    // through the copy engine with its tokens for the attention, RoPE and the position
    // embedding to read on the rank's device: (B, T) i32 each, since a row holds at most T
    // documents (each of at least one token), so the starts' S ≤ T columns fit whatever the
    // shards' longest row.
    add("batch.doc_starts", MemoryCategory::kWorkspace, DType::kI32, B * T);
    add("batch.positions", MemoryCategory::kWorkspace, DType::kI32, B * T);
  }
  for (BufferSpec& b : RankActivationTable(job, place, B, T, compute)) {
    plan.buffers.push_back(std::move(b));
  }
  for (BufferSpec& b : RankWorkspaceTable(job, place, B, T, JobDeviceContext(job), compute,
                                          param_dtype, grad_dtype)) {
    if (b.name == "gemm_workspace") {
      b.shape[0] = std::max(b.shape[0], LoraGemmWorkspaceBytes(layout, B * T, JobDeviceContext(job),
                                                               compute, grad_dtype));
      if (geometry.embedding_row_numel > 0) {
        // The head's input-gradient partials are written in f32 (vocab.row_grads).
        LinearDTypes head = LinearDTypes::ForPrecision(compute, param_dtype, grad_dtype);
        head.dinp = DType::kF32;
        b.shape[0] = std::max(b.shape[0], VocabHeadGemmWorkspaceBytes(job, geometry, layout,
                                                                      JobDeviceContext(job), head));
      }
    }
    plan.buffers.push_back(std::move(b));
  }
  // A pipeline stage keeps each block's adapter activations (h = x·Aᵀ) for the micro-batches
  // its chunk has in flight, as it keeps the block's other saved activations.
  const std::vector<PipelineChunk> chunks =
      place.pipeline_size() > 1 ? PipelineChunksOf(job, place) : std::vector<PipelineChunk>{};
  for (BufferSpec& b : LoraActivationBuffers(layout, B * T, compute)) {
    if (b.category == MemoryCategory::kActivations) {
      for (const PipelineChunk& c : chunks) {
        for (int u = c.first; u < c.last; ++u) {
          if (c.in_flight > 1 && b.name.starts_with(absl::StrCat("block.", u - 1, ".lora."))) {
            b.shape.insert(b.shape.begin(), c.in_flight);
          }
        }
      }
    }
    plan.buffers.push_back(b);
  }
  // A pipeline chunk after the model's first sends dL/d(its input) back from grad.residual,
  // which the next backward overwrites while the send may still be going: each micro-batch
  // slot it keeps in flight sends from a copy of its own (Trainer::RunPipelineSchedule), the
  // residual gradient's size and dtype. Communication buffers, taken from the arena.
  const auto residual_grad =
      std::find_if(plan.buffers.begin(), plan.buffers.end(),
                   [](const BufferSpec& b) { return b.name == "grad.residual"; });
  for (size_t c = 0; c < chunks.size(); ++c) {
    if (chunks[c].first == 0 || residual_grad == plan.buffers.end()) continue;
    const BufferSpec send{.name = PipelineGradSendBuffer(static_cast<int>(c)),
                          .category = MemoryCategory::kCommunication,
                          .dtype = residual_grad->dtype,
                          .shape = {chunks[c].in_flight, residual_grad->numel()}};
    plan.buffers.push_back(send);
  }
  return plan;
}

std::string PipelineGradSendBuffer(int chunk) {
  return absl::StrCat("comm.pipeline.grad_send.", chunk);
}

MemoryPlan PlanInference(const zerotrain::JobSpec& job, const DeviceContext& ctx, int64_t batch,
                         int64_t seq_len) {
  MemoryPlan plan;
  // A forward-only pass never returns to a block: every block can share one set.
  zerotrain::MemoryConfig shared;
  shared.set_activation_checkpointing(zerotrain::MemoryConfig::FULL);
  const DType compute = StorageDType(job.precision().compute_dtype());
  plan.buffers = ActivationTable(job.model(), shared, batch, seq_len, compute);
  for (BufferSpec& b : WorkspaceTable(job.model(), batch, seq_len, /*backward=*/false, ctx, compute,
                                      StorageDType(job.precision().param_dtype()))) {
    plan.buffers.push_back(std::move(b));
  }
  return plan;
}

}  // namespace zt
