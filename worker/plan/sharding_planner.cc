#include "worker/plan/sharding_planner.h"

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/dtype.h"
#include "worker/job/parallel_validation.h"
#include "worker/model/activation_table.h"
#include "worker/model/param_layout.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/memory_plan.h"
#include "worker/plan/parallel_plan.h"

namespace zt {
namespace {

using Ckpt = zerotrain::MemoryConfig;

int64_t ElementBytes(zerotrain::PrecisionConfig::DType d) {
  switch (d) {
    case zerotrain::PrecisionConfig::BF16:
    case zerotrain::PrecisionConfig::FP16:
      return 2;
    default:
      return 4;
  }
}

std::string PolicyName(Ckpt::ActivationCheckpointing c) {
  return Ckpt::ActivationCheckpointing_Name(c);
}

// Ties in cost go to the lighter recompute: the order a reader expects in the table.
int RecomputeRank(Ckpt::ActivationCheckpointing c) {
  switch (c) {
    case Ckpt::NONE:
      return 0;
    case Ckpt::SELECTIVE:
      return 1;
    case Ckpt::EVERY_K:
      return 2;
    default:
      return 3;
  }
}

// Forward FLOPs of one micro-batch, split as the recompute policies need them (see the
// header for the formula).
struct ForwardFlops {
  double block_total = 0;  // one block: linears + attention core + activation
  double block_core = 0;   // one block: attention core + activation (SELECTIVE's)
  double all = 0;          // every block and the head
};

ForwardFlops FlopsOf(const zerotrain::JobSpec& job, const ModelLayout& layout) {
  const zerotrain::ModelConfig& m = job.model();
  const double B = job.train().micro_batch_size(), T = job.data().seq_len();
  const double C = m.d_model(), F = m.d_ff(), V = m.vocab_size();
  double block_matrix_params = 0;
  if (layout.n_blocks() > 0) {
    for (const ParamSpec& p : layout.block(0).params) {
      if (p.is_matrix) block_matrix_params += static_cast<double>(p.numel);
    }
  }
  ForwardFlops f;
  const double attention_core = 2.0 * 2.0 * B * T * T * C;
  const double activation = kActivationFlopsPerElement * B * T * F;
  f.block_core = attention_core + activation;
  f.block_total = 2.0 * B * T * block_matrix_params + f.block_core;
  f.all = layout.n_blocks() * f.block_total + 2.0 * B * T * C * V;
  return f;
}

double RecomputeFraction(const zerotrain::JobSpec& job, const ForwardFlops& f,
                         Ckpt::ActivationCheckpointing policy) {
  const int L = job.model().n_layer();
  double recomputed = 0;
  switch (policy) {
    case Ckpt::FULL:
      recomputed = L * f.block_total;
      break;
    case Ckpt::SELECTIVE:
      recomputed = L * f.block_core;
      break;
    case Ckpt::EVERY_K: {
      const int k = std::max(1, job.memory().checkpoint_every_k());
      recomputed = ((L + k - 1) / k) * f.block_total;  // blocks 0, k, 2k, … below L
      break;
    }
    default:
      break;
  }
  return f.all > 0 ? recomputed / (3.0 * f.all) : 0.0;
}

// What one training micro-batch of a vocabulary-sharded embedding sends a rank
// (worker/model/transformer_vocab_shard.cc), as its communicator counts it: the group's token
// ids and targets gathered (and packed positions, with learned ones); the lookup's sums
// reduce-scattered ((G − 1)·B·T·C in the compute dtype: widened to f32 by Gloo, CPU ranks;
// in the dtype by NCCL, CUDA ranks) and the head's f32 input-gradient partials
// ((G − 1)·B·T·C·4); the final norm's outputs and the lookup's output gradient gathered
// ((G − 1)·B·T·C each, in the compute dtype); and per pass of the head's rows, their maxima
// gathered and their two sums all-reduced.
int64_t VocabShardedBytesPerMicroBatch(const zerotrain::JobSpec& job, const ModelLayout& layout) {
  const ShardGeometry geometry = ParallelLayout::ForJob(job, 0).shard();
  const int64_t G = geometry.group_size;
  const int64_t BT = int64_t{job.train().micro_batch_size()} * job.data().seq_len();
  const int64_t C = job.model().d_model();
  const int64_t a = ElementBytes(job.precision().compute_dtype());
  const int64_t reduced = job.resources().device() == zerotrain::ResourceConfig::CUDA ? a : 4;
  const int64_t V = layout.embedding().Find("wte")->shape[0];
  const bool positions = job.data().packing() && layout.embedding().Find("wpe") != nullptr;
  const int64_t ids = positions ? 3 : 2;  // tokens, targets (, positions)
  int64_t bytes =
      ids * (G - 1) * BT * 4 + (G - 1) * BT * C * (reduced + 4) + 2 * (G - 1) * BT * C * a;
  const int64_t rows = G * BT;
  const int64_t rows_per_rank =
      ShardOfUnit(layout.embedding(), geometry).shard_numel / geometry.embedding_row_numel;
  const int64_t chunk =
      VocabShardChunkRows(LossChunkRows(BT) * V, rows, std::min(V, rows_per_rank));
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    bytes += (G - 1) * n * 4 + 2 * (G - 1) * (2 * n) * 4 / G;
  }
  return bytes;
}

int64_t CommBytesPerStep(const zerotrain::JobSpec& job, const ModelLayout& layout, int stage) {
  const ShardGeometry geometry = ParallelLayout::ForJob(job, 0).shard();
  const int N = geometry.world_size, G = geometry.group_size, R = geometry.groups();
  if (N <= 1) return 0;
  const int64_t p = ElementBytes(job.precision().param_dtype());
  const int64_t g = ElementBytes(job.precision().grad_dtype());
  // What a gradient reduction sends an element is the communicator's width, not the
  // gradient's: Gloo (CPU ranks) widens 16-bit data to f32 and reduces in f32
  // (GlooCommunicator::AllReduce / ReduceScatter), NCCL (CUDA ranks) reduces in the dtype. An
  // all-gather moves the data's own bytes on both.
  const int64_t r = job.resources().device() == zerotrain::ResourceConfig::CUDA ? g : int64_t{4};
  if (stage == 0) {
    return 2 * (N - 1) * layout.total_numel * r / N;
  }
  int64_t padded = 0;
  for (const UnitLayout& u : layout.units) padded += ShardOfUnit(u, geometry).padded;
  // A vocabulary-sharded embedding is neither gathered nor reduce-scattered (its gradient shard
  // is complete where it is made); its micro-batches' collectives are counted below.
  const bool vocab = geometry.embedding_row_numel > 0 && stage == 3;
  const int64_t vocab_padded = vocab ? ShardOfUnit(layout.embedding(), geometry).padded : 0;
  const int64_t group_share = (G - 1) * (padded - vocab_padded) / G;  // one ring pass
  int64_t bytes = group_share * r;                                    // gradient reduce-scatter
  // A pipeline stage that reduces per micro-batch (StageGradientsPerMicroBatch, at `stage`)
  // gathers its tied unit's reduced gradient once a step to sum the wte's two copies.
  const bool stage_reduces_per_use = job.parallel().pipeline_parallel() > 1 && stage >= 2 &&
                                     ((stage == 3 && job.parallel().reshard_after_forward()) ||
                                      job.train().grad_accum_steps() <= 1);
  if (stage_reduces_per_use && job.model().tie_embeddings()) {
    for (const UnitLayout& u : layout.units) {
      const bool copy = u.kind == UnitKind::kEmbedding ||
                        (u.kind == UnitKind::kHead && u.Find("lm_head.weight") != nullptr);
      if (copy) bytes += (G - 1) * ShardOfUnit(u, geometry).padded / G * g;
    }
  }
  if (stage <= 2) {
    bytes += group_share * p;  // the updated parameters, gathered after the optimizer step
  } else if (job.parallel().pipeline_parallel() > 1) {
    // A pipeline stage (`layout`: its units): kept gathered for the step, each unit once; per
    // use, m times in the forwards and m in the backwards but the embedding's (no parameters)
    // and the head's (kept from its forward) — ShardingEngine::BeginStagePass.
    const int64_t m = job.train().grad_accum_steps();
    int64_t gathered = 0;
    for (const UnitLayout& u : layout.units) {
      const int64_t uses = !job.parallel().reshard_after_forward()
                               ? 1
                               : m * (2 - (u.kind == UnitKind::kEmbedding) -
                                      (u.kind == UnitKind::kHead));
      gathered += uses * ShardOfUnit(u, geometry).padded;
    }
    bytes += (G - 1) * gathered / G * p;
    if (job.parallel().reshard_after_forward()) {
      // ... and reduces per use (StageGradientsPerMicroBatch): every micro-batch's gradients
      // reduce-scattered, not the step's once (the tied unit's gather: above).
      bytes += (m - 1) * group_share * r;
    }
  } else {
    // Each micro-batch's pass (ShardingEngine::ForwardBackward) gathers every unit for its
    // forward and, with reshard_after_forward, the blocks again for their backward; the
    // embedding's backward reads no parameters (a tied one stays gathered to the head's loss)
    // and the head stays gathered from its forward to its backward, so those two once.
    int64_t gathered = 0;
    for (const UnitLayout& u : layout.units) {
      if (vocab && u.kind == UnitKind::kEmbedding) continue;
      const bool once = !job.parallel().reshard_after_forward() || u.kind == UnitKind::kEmbedding ||
                        u.kind == UnitKind::kHead;
      gathered += (once ? 1 : 2) * ShardOfUnit(u, geometry).padded;
    }
    bytes += job.train().grad_accum_steps() * ((G - 1) * gathered / G) * p;
    if (vocab)
      bytes += job.train().grad_accum_steps() * VocabShardedBytesPerMicroBatch(job, layout);
  }
  if (R > 1) bytes += 2 * (R - 1) * (padded / G) * r / R;  // the replicas' all-reduce
  return bytes;
}

// The norm weights (and biases) of `blocks` blocks and the final norm: what sequence
// parallelism sums over the tensor-parallel group once a step (every rank's norms saw only its
// token rows).
int64_t SequenceParallelNormElements(const zerotrain::ModelConfig& model, int64_t blocks) {
  const ModelLayout layout = BuildModelLayout(model);
  const auto norms = [](const UnitLayout& unit) {
    int64_t n = 0;
    for (const ParamSpec& p : unit.params) {
      if (p.name.starts_with("ln")) n += p.numel;  // ln1, ln2, ln_f: weights and biases
    }
    return n;
  };
  return blocks * norms(layout.block(0)) + norms(layout.head());
}

// Tensor- and pipeline-parallel bytes a rank sends per step, and the pipeline's bubble (the
// header's formulas).
struct ModelParallelCost {
  int64_t comm_bytes = 0;
  double bubble = 0;
};

ModelParallelCost ModelParallelCostOf(const zerotrain::JobSpec& job) {
  const zerotrain::ParallelConfig& parallel = job.parallel();
  const int64_t t = std::max(1, parallel.tensor_parallel());
  const int64_t p = std::max(1, parallel.pipeline_parallel());
  const int64_t A = job.train().grad_accum_steps();
  const int64_t elements =
      int64_t{job.train().micro_batch_size()} * job.data().seq_len() * job.model().d_model();
  const int64_t compute = ElementBytes(job.precision().compute_dtype());
  const int64_t activation = elements * compute;
  // What a reduction sends per element of 16-bit data is the communicator's width, not the
  // data's: Gloo (CPU ranks) widens 16-bit data to f32 and reduces in f32 (4 bytes an element,
  // GlooCommunicator::AllReduce / ReduceScatter), NCCL (CUDA ranks) reduces in the dtype. An
  // all-gather moves the data's own bytes on both.
  const bool native_16bit = job.resources().device() == zerotrain::ResourceConfig::CUDA;
  const int64_t reduced = native_16bit ? compute : 4;
  const int64_t reduced_grad = native_16bit ? ElementBytes(job.precision().grad_dtype()) : 4;
  ModelParallelCost cost;
  if (t > 1) {
    const int64_t blocks = (job.model().n_layer() + p - 1) / p;
    // Four all-reduces a block and micro-batch (attention's and the MLP's, forward and
    // backward), and the vocabulary-parallel ends' one each: the embedding's forward sum and
    // the head's input gradient in the backward, both on one stage without a pipeline and one
    // of them on the largest stage's rank at most with one (the first stage or the last).
    const int64_t reductions = A * (blocks * 4 + (p == 1 ? 2 : 1));
    if (!parallel.sequence_parallel()) {
      // Ring all-reduces, 2 (t − 1)/t of the activations each.
      cost.comm_bytes += reductions * 2 * (t - 1) * elements * reduced / t;
    } else {
      // Each all-reduce becomes a reduce-scatter and an all-gather, (t − 1)/t each; the
      // backward also gathers each of a block's two norm outputs again (they are kept as
      // shards), and once a step the norms' partial gradients are summed over the group.
      cost.comm_bytes += reductions * (t - 1) * elements * (reduced + compute) / t;
      cost.comm_bytes += A * blocks * 2 * (t - 1) * activation / t;
      cost.comm_bytes +=
          2 * (t - 1) * SequenceParallelNormElements(job.model(), blocks) * reduced_grad / t;
    }
  }
  if (p > 1) {
    const int v = parallel.pipeline_schedule() == zerotrain::ParallelConfig::INTERLEAVED
                      ? std::max(1, parallel.virtual_stages())
                      : 1;
    // The busiest rank's stage links. A rank holds v chunks; each sends its micro-batches'
    // activations forward and their gradients back, but the model's first chunk (on the first
    // stage) sends no gradient and its last (on the last stage) no activation. So the first
    // and last stage send 2v − 1 micro-batch tensors each per micro-batch, a middle one 2v.
    int64_t ends = (2 * v - 1) * A * activation;
    const int64_t middle = p > 2 ? 2 * v * A * activation : 0;
    if (job.model().tie_embeddings() && !job.model().has_lora()) {
      // The first stage's wte and the last stage's head copy sum their gradients once a step:
      // an all-reduce of two ranks sends the rank's vocabulary share once, ⌈V/t⌉·C.
      const int64_t rows = (job.model().vocab_size() + t - 1) / t;
      ends += rows * job.model().d_model() * reduced_grad;
    }
    cost.comm_bytes += std::max(ends, middle);
    cost.bubble = static_cast<double>(p - 1) /
                  (static_cast<double>(v) * std::max(1, parallel.micro_batches()));
  }
  return cost;
}

struct LayoutChoice {
  int tensor = 1;
  int pipeline = 1;
};

// `job` at layout `l`: its shard group the data-parallel size unless the job sets one.
zerotrain::JobSpec AtLayout(const zerotrain::JobSpec& job, const LayoutChoice& l) {
  zerotrain::JobSpec at = job;
  at.mutable_parallel()->set_tensor_parallel(l.tensor);
  at.mutable_parallel()->set_pipeline_parallel(l.pipeline);
  if (!job.parallel().has_shard_group_size()) {
    const int world = std::max(1, job.parallel().world_size());
    at.mutable_parallel()->set_shard_group_size(world / (l.tensor * l.pipeline));
  }
  return at;
}

// The layouts to plan (the header's rules); the others go to plan->rejected_layouts.
std::vector<LayoutChoice> LayoutsToPlan(const zerotrain::JobSpec& job, LayoutSearch search,
                                        zerotrain::ShardingPlan* plan) {
  const zerotrain::ParallelConfig& parallel = job.parallel();
  const bool tp_pinned = parallel.has_tensor_parallel();
  const bool pp_pinned = parallel.has_pipeline_parallel();
  const LayoutChoice own{.tensor = tp_pinned ? parallel.tensor_parallel() : 1,
                         .pipeline = pp_pinned ? parallel.pipeline_parallel() : 1};
  if (search == LayoutSearch::kJob) return {own};
  const int world = std::max(1, parallel.world_size());
  std::vector<LayoutChoice> out;
  for (int t = 1; t <= world; ++t) {
    if (world % t != 0 || (tp_pinned && t != own.tensor)) continue;
    for (int p = 1; p <= world / t; ++p) {
      if ((world / t) % p != 0 || (pp_pinned && p != own.pipeline)) continue;
      const LayoutChoice l{.tensor = t, .pipeline = p};
      const std::vector<std::string> broken = ParallelViolations(AtLayout(job, l));
      if (broken.empty()) {
        out.push_back(l);
      } else {
        plan->add_rejected_layouts(absl::StrFormat("tensor_parallel %d × pipeline_parallel %d: %s",
                                                   t, p, absl::StrJoin(broken, "; ")));
      }
    }
  }
  return out;
}

// Bytes of the plan that live in the device's memory (see the header).
int64_t DeviceBytes(const zerotrain::JobSpec& job, const MemoryPlan& plan) {
  const bool own_budget = job.resources().device() == zerotrain::ResourceConfig::CUDA ||
                          job.resources().device_memory_bytes() > 0;
  if (own_budget) return plan.DeviceBytes();
  return plan.TotalBytes() - plan.CategoryBytes(MemoryCategory::kNvme);
}

std::string Gib(int64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / static_cast<double>(1LL << 30));
}

using Offload = zerotrain::OffloadConfig;

struct OffloadChoice {
  Offload::Device optimizer = Offload::NONE;
  Offload::Device params = Offload::NONE;
};

bool Moved(Offload::Device d) { return d == Offload::CPU || d == Offload::NVME; }

// The offloads the planner tries, in order, each only when none before it fits: none, then
// the optimizer states to the host, then to NVMe, then the parameters too (host, then NVMe).
// A field the job pins keeps its value; a pinned combination outside the ladder is tried
// alone.
std::vector<OffloadChoice> OffloadLadder(const zerotrain::JobSpec& job) {
  const std::vector<OffloadChoice> ladder = {{Offload::NONE, Offload::NONE},
                                             {Offload::CPU, Offload::NONE},
                                             {Offload::NVME, Offload::NONE},
                                             {Offload::CPU, Offload::CPU},
                                             {Offload::NVME, Offload::NVME}};
  const Offload::Device optimizer = job.offload().optimizer();
  const Offload::Device params = job.offload().params();
  std::vector<OffloadChoice> tried;
  for (const OffloadChoice& c : ladder) {
    if (optimizer != Offload::DEVICE_UNSPECIFIED && c.optimizer != optimizer) continue;
    if (params != Offload::DEVICE_UNSPECIFIED && c.params != params) continue;
    tried.push_back(c);
  }
  if (tried.empty()) tried.push_back({.optimizer = optimizer, .params = params});
  return tried;
}

bool StageAllows(int stage, const OffloadChoice& offload) {
  if (Moved(offload.optimizer) && stage < 1) return false;
  if (Moved(offload.params) && stage != 3) return false;
  return true;
}

struct Transfers {
  int64_t host = 0;
  int64_t nvme = 0;
};

// Bytes a rank moves per step for its offload (the header's formula).
Transfers OffloadTransfers(const zerotrain::JobSpec& job, const ModelLayout& layout,
                           const MemoryPlan& plan) {
  Transfers t;
  const OffloadChoice offload{job.offload().optimizer(), job.offload().params()};
  const ShardGeometry geometry = ParallelLayout::ForJob(job, 0).shard();
  int64_t shards = 0;
  for (const UnitLayout& u : layout.units) shards += ShardOfUnit(u, geometry).shard_numel;
  const int64_t p = ElementBytes(job.precision().param_dtype());
  const int64_t g = ElementBytes(job.precision().grad_dtype());
  if (Moved(offload.optimizer)) t.host += shards * (g + p);
  if (offload.optimizer == Offload::NVME) {
    for (const BufferSpec& b : plan.buffers) {
      if (b.category == MemoryCategory::kNvme && b.role() == MemoryCategory::kOptimizerState) {
        t.nvme += 2 * PlacedBytes(b);
      }
    }
  }
  if (Moved(offload.params)) {
    const int64_t passes = job.parallel().reshard_after_forward() ? 2 : 1;
    const int64_t gathered = job.train().grad_accum_steps() * passes * shards * p;
    t.host += gathered;
    if (offload.params == Offload::NVME) t.nvme += gathered;
  }
  return t;
}

std::string DeviceLabel(Offload::Device d) { return Offload::Device_Name(d); }

std::string OffloadLabel(const zerotrain::PlanCandidate& c) {
  return absl::StrFormat("offload.optimizer %s, offload.params %s",
                         DeviceLabel(c.offload_optimizer()), DeviceLabel(c.offload_params()));
}

}  // namespace

absl::StatusOr<zerotrain::ShardingPlan> PlanSharding(const zerotrain::JobSpec& job,
                                                     const PlannerOptions& options) {
  if (options.device_memory_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("device_memory_bytes: must be > 0 (got %d)", options.device_memory_bytes));
  }
  if (!(options.safety_margin >= 0.0 && options.safety_margin < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("safety_margin: must be in [0, 1) (got %g)", options.safety_margin));
  }
  if (options.host_memory_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("host_memory_bytes: must be >= 0 (got %d)", options.host_memory_bytes));
  }
  const bool stage_pinned = job.parallel().has_zero_stage();
  const bool checkpointing_pinned =
      job.memory().activation_checkpointing() != Ckpt::CHECKPOINTING_UNSPECIFIED;
  std::vector<int> stages = {0, 1, 2, 3};
  if (stage_pinned) stages = {job.parallel().zero_stage()};
  std::vector<Ckpt::ActivationCheckpointing> policies = {Ckpt::NONE, Ckpt::SELECTIVE, Ckpt::FULL};
  if (checkpointing_pinned) policies = {job.memory().activation_checkpointing()};

  // The job's own budget for its devices caps the device it is placed on.
  const int64_t device_memory =
      job.resources().device_memory_bytes() > 0
          ? std::min(options.device_memory_bytes, job.resources().device_memory_bytes())
          : options.device_memory_bytes;
  zerotrain::ShardingPlan plan;
  plan.set_world_size(std::max(1, job.parallel().world_size()));
  plan.set_device_memory_bytes(device_memory);
  plan.set_safety_margin(options.safety_margin);
  if (stage_pinned) plan.add_pinned("parallel.zero_stage");
  if (checkpointing_pinned) plan.add_pinned("memory.activation_checkpointing");
  if (job.offload().optimizer() != Offload::DEVICE_UNSPECIFIED) {
    plan.add_pinned("offload.optimizer");
  }
  if (job.offload().params() != Offload::DEVICE_UNSPECIFIED) plan.add_pinned("offload.params");
  if (job.parallel().has_tensor_parallel()) plan.add_pinned("parallel.tensor_parallel");
  if (job.parallel().has_pipeline_parallel()) plan.add_pinned("parallel.pipeline_parallel");
  const std::vector<LayoutChoice> layouts = LayoutsToPlan(job, options.layouts, &plan);
  if (layouts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no tensor × pipeline layout of ", plan.world_size(),
        " ranks fits the job's rules: ", absl::StrJoin(plan.rejected_layouts(), "\n")));
  }

  const ModelLayout layout = BuildModelLayout(job.model());
  const ForwardFlops flops = FlopsOf(job, layout);
  const double keep = 1.0 - options.safety_margin;
  const double allowed = static_cast<double>(device_memory) * keep;
  const double host_allowed = static_cast<double>(options.host_memory_bytes) * keep;
  const double fp32_all_reduce = 2.0 * 4.0 * static_cast<double>(layout.total_numel);
  auto relative = [&](int64_t bytes) {
    return fp32_all_reduce > 0 ? static_cast<double>(bytes) / fp32_all_reduce : 0.0;
  };

  auto evaluate = [&](const LayoutChoice& at, int stage, Ckpt::ActivationCheckpointing policy,
                      const OffloadChoice& offload) {
    zerotrain::JobSpec candidate_job = AtLayout(job, at);
    candidate_job.mutable_parallel()->set_zero_stage(stage);
    candidate_job.mutable_memory()->set_activation_checkpointing(policy);
    candidate_job.mutable_offload()->set_optimizer(offload.optimizer);
    candidate_job.mutable_offload()->set_params(offload.params);
    // Every pipeline stage's first rank (the tensor and data ranks of a stage plan alike);
    // the candidate is its largest stage.
    const ParallelLayout first = ParallelLayout::ForJob(candidate_job, 0);
    MemoryPlan memory = PlanMemory(candidate_job, first);
    int64_t peak = DeviceBytes(candidate_job, memory);
    int64_t pinned = memory.CategoryBytes(MemoryCategory::kPinnedHost);
    int64_t nvme = memory.CategoryBytes(MemoryCategory::kNvme);
    for (int p = 1; p < at.pipeline; ++p) {
      const ParallelLayout place = ParallelLayout::ForJob(
          candidate_job, first.RankAt({.tensor = 0, .data = 0, .pipeline = p}));
      const MemoryPlan stage_memory = PlanMemory(candidate_job, place);
      peak = std::max(peak, DeviceBytes(candidate_job, stage_memory));
      pinned = std::max(pinned, stage_memory.CategoryBytes(MemoryCategory::kPinnedHost));
      nvme = std::max(nvme, stage_memory.CategoryBytes(MemoryCategory::kNvme));
    }
    // The whole model's layout serves t = p = 1 (the coordinator's every candidate) uncopied.
    std::optional<ModelLayout> split;
    const ModelLayout& rank_units = at.tensor * at.pipeline == 1
                                        ? layout
                                        : split.emplace(RankModelLayout(candidate_job, first));
    const Transfers transfers = OffloadTransfers(candidate_job, rank_units, memory);
    const ModelParallelCost model_parallel = ModelParallelCostOf(candidate_job);
    zerotrain::PlanCandidate c;
    c.set_zero_stage(stage);
    c.set_activation_checkpointing(policy);
    c.set_offload_optimizer(offload.optimizer);
    c.set_offload_params(offload.params);
    c.set_tensor_parallel(at.tensor);
    c.set_pipeline_parallel(at.pipeline);
    c.set_peak_bytes_per_rank(peak);
    c.set_pinned_host_bytes_per_rank(pinned);
    c.set_nvme_bytes_per_rank(nvme);
    c.set_host_transfer_bytes_per_step(transfers.host);
    c.set_nvme_transfer_bytes_per_step(transfers.nvme);
    c.set_comm_bytes_per_step(CommBytesPerStep(candidate_job, rank_units, stage) +
                              model_parallel.comm_bytes);
    c.set_recompute_fraction(RecomputeFraction(candidate_job, flops, policy));
    c.set_bubble_fraction(model_parallel.bubble);
    c.set_cost(c.recompute_fraction() + c.bubble_fraction() +
               kCommCostPerStepOfCompute * relative(c.comm_bytes_per_step()) +
               kHostTransferCostPerStepOfCompute * relative(transfers.host) +
               kNvmeTransferCostPerStepOfCompute * relative(transfers.nvme));
    std::vector<std::string> why;
    if (static_cast<double>(c.peak_bytes_per_rank()) > allowed) {
      why.push_back(absl::StrFormat(
          "needs %s (%d bytes) per rank, devices have %s (%d bytes) with %g%% kept free",
          Gib(c.peak_bytes_per_rank()), c.peak_bytes_per_rank(), Gib(device_memory), device_memory,
          options.safety_margin * 100.0));
    }
    if (options.host_memory_bytes > 0 &&
        static_cast<double>(c.pinned_host_bytes_per_rank()) > host_allowed) {
      why.push_back(absl::StrFormat(
          "needs %s (%d bytes) of pinned host memory per rank, hosts have %s (%d bytes) per "
          "rank with %g%% kept free",
          Gib(c.pinned_host_bytes_per_rank()), c.pinned_host_bytes_per_rank(),
          Gib(options.host_memory_bytes), options.host_memory_bytes,
          options.safety_margin * 100.0));
    }
    if ((offload.optimizer == Offload::NVME || offload.params == Offload::NVME) &&
        job.offload().nvme_path().empty()) {
      why.push_back("offloading to NVME needs offload.nvme_path, which the job does not set");
    }
    if (Moved(offload.optimizer) || Moved(offload.params)) {
      const int64_t transfer = LargestOffloadTransferBytes(candidate_job, 0);
      if (transfer > job.offload().buffer_size()) {
        why.push_back(absl::StrFormat(
            "offload.buffer_size %d is smaller than its largest transfer, %d bytes (one unit's "
            "shard)",
            job.offload().buffer_size(), transfer));
      }
    }
    c.set_fits(why.empty());
    c.set_rejected_because(absl::StrJoin(why, "; "));
    return c;
  };

  auto key = [](const zerotrain::PlanCandidate& c) {
    return std::make_tuple(c.cost(), c.tensor_parallel() * c.pipeline_parallel(), c.zero_stage(),
                           RecomputeRank(c.activation_checkpointing()));
  };
  std::vector<zerotrain::PlanCandidate> candidates;
  const std::vector<OffloadChoice> ladder = OffloadLadder(job);
  // The smallest candidate without offload, for the reason an offload was chosen.
  std::optional<zerotrain::PlanCandidate> smallest_without;
  for (const OffloadChoice& offload : ladder) {
    std::vector<zerotrain::PlanCandidate> level;
    for (const LayoutChoice& at : layouts) {
      for (const int stage : stages) {
        if (!StageAllows(stage, offload)) continue;
        for (const Ckpt::ActivationCheckpointing policy : policies) {
          level.push_back(evaluate(at, stage, policy, offload));
        }
      }
    }
    if (!Moved(offload.optimizer) && !Moved(offload.params)) {
      for (const zerotrain::PlanCandidate& c : level) {
        if (!smallest_without ||
            c.peak_bytes_per_rank() < smallest_without->peak_bytes_per_rank()) {
          smallest_without = c;
        }
      }
    }
    const bool any_fits =
        std::any_of(level.begin(), level.end(), [](const auto& c) { return c.fits(); });
    for (zerotrain::PlanCandidate& c : level) candidates.push_back(std::move(c));
    if (any_fits) break;
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](const auto& a, const auto& b) { return key(a) < key(b); });
  const auto cheapest_fit =
      std::find_if(candidates.begin(), candidates.end(), [](const auto& c) { return c.fits(); });
  if (cheapest_fit != candidates.end()) {
    const zerotrain::PlanCandidate& chosen = *cheapest_fit;
    *plan.mutable_chosen() = chosen;
    if (!Moved(chosen.offload_optimizer()) && !Moved(chosen.offload_params())) {
      plan.set_reason("the cheapest candidate that fits; no offload needed");
    } else {
      const std::string without =
          smallest_without ? absl::StrFormat(
                                 "no candidate without offload fits (the smallest, stage %d with "
                                 "%s, needs %s on the device)",
                                 smallest_without->zero_stage(),
                                 PolicyName(smallest_without->activation_checkpointing()),
                                 Gib(smallest_without->peak_bytes_per_rank()))
                           : std::string("the job pins its offload");
      plan.set_reason(absl::StrFormat(
          "%s; %s is the first offload that fits: the cheapest, stage %d with %s, needs %s on "
          "the device, %s of pinned host memory and %s of NVMe per rank",
          without, OffloadLabel(chosen), chosen.zero_stage(),
          PolicyName(chosen.activation_checkpointing()), Gib(chosen.peak_bytes_per_rank()),
          Gib(chosen.pinned_host_bytes_per_rank()), Gib(chosen.nvme_bytes_per_rank())));
    }
  } else {
    *plan.mutable_chosen() =
        *std::min_element(candidates.begin(), candidates.end(), [&](const auto& a, const auto& b) {
          return std::make_tuple(a.peak_bytes_per_rank(), key(a)) <
                 std::make_tuple(b.peak_bytes_per_rank(), key(b));
        });
    plan.set_reason(absl::StrFormat(
        "nothing fits, offload included; the smallest (stage %d with "
        "%s, %s): %s",
        plan.chosen().zero_stage(), PolicyName(plan.chosen().activation_checkpointing()),
        OffloadLabel(plan.chosen()), plan.chosen().rejected_because()));
  }
  for (zerotrain::PlanCandidate& c : candidates) *plan.add_candidates() = std::move(c);
  return plan;
}

zerotrain::JobSpec WithPlan(zerotrain::JobSpec job, const zerotrain::ShardingPlan& plan) {
  if (!job.parallel().has_zero_stage()) {
    job.mutable_parallel()->set_zero_stage(plan.chosen().zero_stage());
  }
  if (job.memory().activation_checkpointing() == Ckpt::CHECKPOINTING_UNSPECIFIED) {
    job.mutable_memory()->set_activation_checkpointing(plan.chosen().activation_checkpointing());
  }
  // A plan from before layouts were planned names none: 1, what the job ran with then.
  if (!job.parallel().has_tensor_parallel()) {
    job.mutable_parallel()->set_tensor_parallel(std::max(1, plan.chosen().tensor_parallel()));
  }
  if (!job.parallel().has_pipeline_parallel()) {
    job.mutable_parallel()->set_pipeline_parallel(std::max(1, plan.chosen().pipeline_parallel()));
  }
  // A plan made before offload was planned names none: NONE, what the job ran with then.
  auto chosen = [](Offload::Device d) {
    return d == Offload::DEVICE_UNSPECIFIED ? Offload::NONE : d;
  };
  if (job.offload().optimizer() == Offload::DEVICE_UNSPECIFIED) {
    job.mutable_offload()->set_optimizer(chosen(plan.chosen().offload_optimizer()));
  }
  if (job.offload().params() == Offload::DEVICE_UNSPECIFIED) {
    job.mutable_offload()->set_params(chosen(plan.chosen().offload_params()));
  }
  return job;
}

}  // namespace zt
