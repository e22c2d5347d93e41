#include "worker/plan/memory_plan.h"

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

MemoryPlan PlanMemory(const zerotrain::JobSpec& job) {
  const ModelLayout layout = BuildModelLayout(job.model());
  MemoryPlan plan;
  auto add_per_unit = [&](const char* suffix, MemoryCategory category) {
    for (const UnitLayout& u : layout.units) {
      plan.buffers.push_back({u.name + suffix, category, DType::kF32, {u.numel}});
    }
  };
  add_per_unit(".params", MemoryCategory::kParameters);
  add_per_unit(".grads", MemoryCategory::kGradients);
  for (const UnitLayout& u : layout.units) {
    for (const UnitOptimizerState::Buffer& b : OptimizerStateFor(job.optimizer(), u).buffers) {
      plan.buffers.push_back(
          {u.name + "." + b.name, MemoryCategory::kOptimizerState, b.dtype, {b.numel}});
    }
  }
  const int64_t B = job.train().micro_batch_size(), T = job.data().seq_len();
  for (BufferSpec& b : ActivationTable(job.model(), job.memory(), B, T)) {
    plan.buffers.push_back(std::move(b));
  }
  for (BufferSpec& b :
       WorkspaceTable(job.model(), B, T, /*backward=*/true, JobDeviceContext(job))) {
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
  plan.buffers = ActivationTable(job.model(), shared, batch, seq_len);
  for (BufferSpec& b : WorkspaceTable(job.model(), batch, seq_len, /*backward=*/false, ctx)) {
    plan.buffers.push_back(std::move(b));
  }
  return plan;
}

}  // namespace zt
