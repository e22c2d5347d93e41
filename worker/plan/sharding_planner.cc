#include "worker/plan/sharding_planner.h"

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "kernels/dtype.h"
#include "worker/model/param_layout.h"
#include "worker/plan/memory_plan.h"

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

int64_t CommBytesPerStep(const zerotrain::JobSpec& job, const ModelLayout& layout, int stage) {
  const ShardGeometry geometry = GeometryOf(job, 0);
  const int N = geometry.world_size, G = geometry.group_size, R = geometry.groups();
  if (N <= 1) return 0;
  const int64_t p = ElementBytes(job.precision().param_dtype());
  const int64_t g = ElementBytes(job.precision().grad_dtype());
  if (stage == 0) {
    return 2 * (N - 1) * layout.total_numel * g / N;
  }
  int64_t padded = 0;
  for (const UnitLayout& u : layout.units) padded += PaddedUnitNumel(u.numel, G);
  const int64_t group_share = (G - 1) * padded / G;  // one ring pass over the group
  int64_t bytes = group_share * g;                   // gradient reduce-scatter
  if (stage <= 2) {
    bytes += group_share * p;  // the updated parameters, gathered after the optimizer step
  } else {
    const int64_t passes = job.parallel().reshard_after_forward() ? 2 : 1;
    bytes += job.train().grad_accum_steps() * passes * group_share * p;
  }
  if (R > 1) bytes += 2 * (R - 1) * (padded / G) * g / R;
  return bytes;
}

// Bytes of the plan that live in the device's memory: on a CPU device everything, on a CUDA
// device all but the host's pinned pool and NVMe.
int64_t DeviceBytes(const zerotrain::JobSpec& job, const MemoryPlan& plan) {
  int64_t bytes = plan.TotalBytes();
  if (job.resources().device() == zerotrain::ResourceConfig::CUDA) {
    bytes -= plan.CategoryBytes(MemoryCategory::kPinnedHost);
    bytes -= plan.CategoryBytes(MemoryCategory::kNvme);
  }
  return bytes;
}

std::string Gib(int64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / static_cast<double>(1LL << 30));
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
  const bool stage_pinned = job.parallel().has_zero_stage();
  const bool checkpointing_pinned =
      job.memory().activation_checkpointing() != Ckpt::CHECKPOINTING_UNSPECIFIED;
  std::vector<int> stages = {0, 1, 2, 3};
  if (stage_pinned) stages = {job.parallel().zero_stage()};
  std::vector<Ckpt::ActivationCheckpointing> policies = {Ckpt::NONE, Ckpt::SELECTIVE, Ckpt::FULL};
  if (checkpointing_pinned) policies = {job.memory().activation_checkpointing()};

  zerotrain::ShardingPlan plan;
  plan.set_world_size(std::max(1, job.parallel().world_size()));
  plan.set_device_memory_bytes(options.device_memory_bytes);
  plan.set_safety_margin(options.safety_margin);
  if (stage_pinned) plan.add_pinned("parallel.zero_stage");
  if (checkpointing_pinned) plan.add_pinned("memory.activation_checkpointing");

  const ModelLayout layout = BuildModelLayout(job.model());
  const ForwardFlops flops = FlopsOf(job, layout);
  const double allowed =
      static_cast<double>(options.device_memory_bytes) * (1.0 - options.safety_margin);
  const double fp32_all_reduce = 2.0 * 4.0 * static_cast<double>(layout.total_numel);
  std::vector<zerotrain::PlanCandidate> candidates;
  for (const int stage : stages) {
    for (const Ckpt::ActivationCheckpointing policy : policies) {
      zerotrain::JobSpec candidate_job = job;
      candidate_job.mutable_parallel()->set_zero_stage(stage);
      candidate_job.mutable_memory()->set_activation_checkpointing(policy);
      zerotrain::PlanCandidate c;
      c.set_zero_stage(stage);
      c.set_activation_checkpointing(policy);
      c.set_peak_bytes_per_rank(DeviceBytes(candidate_job, PlanMemory(candidate_job, 0)));
      c.set_comm_bytes_per_step(CommBytesPerStep(candidate_job, layout, stage));
      c.set_recompute_fraction(RecomputeFraction(candidate_job, flops, policy));
      c.set_cost(c.recompute_fraction() +
                 (fp32_all_reduce > 0
                      ? kCommCostPerStepOfCompute * static_cast<double>(c.comm_bytes_per_step()) /
                            fp32_all_reduce
                      : 0.0));
      c.set_fits(static_cast<double>(c.peak_bytes_per_rank()) <= allowed);
      if (!c.fits()) {
        c.set_rejected_because(absl::StrFormat(
            "needs %s (%d bytes) per rank, devices have %s (%d bytes) with %g%% kept free",
            Gib(c.peak_bytes_per_rank()), c.peak_bytes_per_rank(), Gib(options.device_memory_bytes),
            options.device_memory_bytes, options.safety_margin * 100.0));
      }
      candidates.push_back(std::move(c));
    }
  }
  auto key = [](const zerotrain::PlanCandidate& c) {
    return std::make_tuple(c.cost(), c.zero_stage(), RecomputeRank(c.activation_checkpointing()));
  };
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](const auto& a, const auto& b) { return key(a) < key(b); });
  const auto cheapest_fit =
      std::find_if(candidates.begin(), candidates.end(), [](const auto& c) { return c.fits(); });
  if (cheapest_fit != candidates.end()) {
    *plan.mutable_chosen() = *cheapest_fit;
  } else {
    *plan.mutable_chosen() =
        *std::min_element(candidates.begin(), candidates.end(), [&](const auto& a, const auto& b) {
          return std::make_tuple(a.peak_bytes_per_rank(), key(a)) <
                 std::make_tuple(b.peak_bytes_per_rank(), key(b));
        });
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
  return job;
}

}  // namespace zt
