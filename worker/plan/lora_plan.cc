#include "worker/plan/lora_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/linear.h"
#include "worker/plan/optimizer_state_layout.h"

namespace zt {

std::vector<BufferSpec> LoraStateBuffers(const zerotrain::JobSpec& job, const ModelLayout& layout,
                                         DType grad) {
  std::vector<BufferSpec> out;
  for (const UnitLayout& u : layout.units) {
    if (u.lora.empty()) continue;
    out.push_back({u.name + ".lora", MemoryCategory::kParameters, DType::kF32, {u.lora_numel}});
    out.push_back({u.name + ".lora_grads", MemoryCategory::kGradients, grad, {u.lora_numel}});
    // The optimizer sees the adapters as a unit of their own: the A and B matrices.
    UnitLayout adapters;
    adapters.kind = u.kind;
    adapters.name = u.name + ".lora";
    adapters.numel = u.lora_numel;
    for (const LoraSite& s : u.lora) {
      adapters.params.push_back(s.a);
      adapters.params.push_back(s.b);
    }
    for (const UnitOptimizerState::Buffer& b :
         OptimizerStateFor(job.optimizer(), adapters, FlatRange{}).buffers) {
      out.push_back(
          {adapters.name + "." + b.name, MemoryCategory::kOptimizerState, b.dtype, {b.numel}});
    }
  }
  return out;
}

std::vector<BufferSpec> LoraActivationBuffers(const ModelLayout& layout, int64_t rows,
                                              DType compute) {
  std::vector<BufferSpec> out;
  if (!layout.lora) return out;
  int64_t widest_in = 0, widest_rows = 0;
  for (const UnitLayout& u : layout.units) {
    for (const LoraSite& s : u.lora) {
      out.push_back({absl::StrCat(u.name, ".lora.", s.hf_path),
                     MemoryCategory::kActivations,
                     compute,
                     {rows, layout.lora_rank}});
      widest_in = std::max(widest_in, s.in);
      widest_rows = std::max(widest_rows, s.rows);
    }
  }
  if (widest_in == 0) return out;
  out.push_back({"lora.out", MemoryCategory::kWorkspace, compute, {rows, widest_rows}});
  out.push_back({"lora.dout", MemoryCategory::kWorkspace, compute, {rows, widest_rows}});
  out.push_back({"lora.dh", MemoryCategory::kWorkspace, compute, {rows, layout.lora_rank}});
  out.push_back({"lora.dinp", MemoryCategory::kWorkspace, compute, {rows, widest_in}});
  // A frozen norm's weight (and bias) gradient has nowhere to go: the norm ops always write
  // one, so it lands here and is never read.
  const int64_t C = layout.embedding().params.front().shape[1];
  out.push_back({"lora.norm_grad_sink", MemoryCategory::kWorkspace, DType::kF32, {2 * C}});
  if (layout.lora_dropout > 0) {
    out.push_back({"lora.dropped", MemoryCategory::kWorkspace, compute, {rows, widest_in}});
  }
  return out;
}

int64_t LoraGemmWorkspaceBytes(const ModelLayout& layout, int64_t rows, const DeviceContext& ctx,
                               DType compute, DType grad) {
  int64_t most = 0;
  const LinearDTypes dtypes = LinearDTypes::ForPrecision(compute, DType::kF32, grad);
  for (const UnitLayout& u : layout.units) {
    for (const LoraSite& s : u.lora) {
      // x (rows, in) → h (rows, r) through A, and h → out (rows, out) through B.
      for (const auto& [k, n] :
           {std::pair{s.in, layout.lora_rank}, std::pair{layout.lora_rank, s.rows}}) {
        absl::StatusOr<int64_t> bytes = LinearWorkspaceBytes(ctx, rows, k, n, dtypes);
        // A shape the backend refuses counts 0: its GEMM then fails naming the backend's error.
        if (bytes.ok()) most = std::max(most, *bytes);
      }
    }
  }
  return most;
}

}  // namespace zt
