#include "worker/plan/memory_plan.h"

#include <algorithm>

#include "worker/model/activation_table.h"
#include "worker/model/param_layout.h"
#include "worker/plan/optimizer_state_layout.h"

namespace zt {

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

int64_t MemoryPlan::CategoryBytes(MemoryCategory c) const {
  int64_t total = 0;
  for (const BufferSpec& b : buffers) {
    if (b.category == c) total += AlignedBytes(b.bytes());
  }
  return total;
}

int64_t MemoryPlan::TotalBytes() const {
  int64_t total = 0;
  for (const BufferSpec& b : buffers) total += AlignedBytes(b.bytes());
  return total;
}

DeviceContext JobDeviceContext(const zerotrain::JobSpec& job) {
  return CpuContext(job.resources().cpu_threads());
}

int64_t PaddedUnitNumel(int64_t unit_numel, int world_size) {
  const int64_t quantum = kShardAlignmentElements * world_size;
  return (unit_numel + quantum - 1) / quantum * quantum;
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

FlatRange ShardRange(int64_t unit_numel, int world_size, int rank) {
  const int64_t padded = PaddedUnitNumel(unit_numel, world_size);
  const int64_t shard = padded / world_size;
  return {.begin = std::min(unit_numel, rank * shard),
          .end = std::min(unit_numel, (rank + 1) * shard)};
}

}  // namespace

MemoryPlan PlanMemory(const zerotrain::JobSpec& job, int rank) {
  const ModelLayout layout = BuildModelLayout(job.model());
  const auto& precision = job.precision();
  const int n = std::max(1, job.parallel().world_size());
  const int stage = job.parallel().zero_stage();
  const DType param_dtype = StorageDType(precision.param_dtype());
  const DType grad_dtype = StorageDType(precision.grad_dtype());
  MemoryPlan plan;
  auto add = [&](std::string name, MemoryCategory category, DType dtype, int64_t numel) {
    plan.buffers.push_back({std::move(name), category, dtype, {numel}});
  };
  int64_t largest_unit = 0;
  for (const UnitLayout& u : layout.units) {
    largest_unit = std::max(largest_unit, PaddedUnitNumel(u.numel, n));
  }
  for (const UnitLayout& u : layout.units) {
    // What stays sharded (ZeRO): 1 the optimizer state (master weights included), 2 also
    // the gradients, 3 also the parameters. Shards are rank's range of the padded unit.
    const FlatRange shard = ShardRange(u.numel, n, rank);
    const int64_t shard_numel = PaddedUnitNumel(u.numel, n) / n;
    add(u.name + ".params", MemoryCategory::kParameters, param_dtype,
        stage >= 3 ? shard_numel : u.numel);
    add(u.name + ".grads", MemoryCategory::kGradients, grad_dtype,
        stage >= 2 ? shard_numel : u.numel);
    if (precision.master_weights()) {
      add(u.name + ".master", MemoryCategory::kOptimizerState, DType::kF32,
          stage >= 1 ? shard_numel : u.numel);
    }
    const FlatRange state_range = stage >= 1 ? shard : FlatRange{};
    for (const UnitOptimizerState::Buffer& b :
         OptimizerStateFor(job.optimizer(), u, state_range).buffers) {
      add(u.name + "." + b.name, MemoryCategory::kOptimizerState, b.dtype, b.numel);
    }
  }
  if (n > 1 && stage >= 3) {
    // The unit being computed and the one prefetched, gathered to full size.
    add("gather.0", MemoryCategory::kParameters, param_dtype, largest_unit);
    add("gather.1", MemoryCategory::kParameters, param_dtype, largest_unit);
  }
  if (n > 1 && stage >= 2) {
    // A unit's full gradient, produced by the backward, before its reduce-scatter.
    add("grad.unit", MemoryCategory::kGradients, grad_dtype, largest_unit);
  }
  const int64_t B = job.train().micro_batch_size(), T = job.data().seq_len();
  const DType compute = StorageDType(precision.compute_dtype());
  for (BufferSpec& b : ActivationTable(job.model(), job.memory(), B, T, compute)) {
    plan.buffers.push_back(std::move(b));
  }
  for (BufferSpec& b :
       WorkspaceTable(job.model(), B, T, /*backward=*/true, JobDeviceContext(job), compute,
                      param_dtype, grad_dtype)) {
    plan.buffers.push_back(std::move(b));
  }
  return plan;
}

MemoryPlan PlanInference(const zerotrain::JobSpec& job, const DeviceContext& ctx, int64_t batch,
                         int64_t seq_len) {
  MemoryPlan plan;
  // A forward-only pass never returns to a block: every block can share one set.
  zerotrain::MemoryConfig shared;
  shared.set_activation_checkpointing(zerotrain::MemoryConfig::FULL);
  const DType compute = StorageDType(job.precision().compute_dtype());
  plan.buffers = ActivationTable(job.model(), shared, batch, seq_len, compute);
  for (BufferSpec& b :
       WorkspaceTable(job.model(), batch, seq_len, /*backward=*/false, ctx, compute,
                      StorageDType(job.precision().param_dtype()))) {
    plan.buffers.push_back(std::move(b));
  }
  return plan;
}

}  // namespace zt
