#include "worker/plan/lora_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/int8_linear.h"
#include "kernels/linear.h"
#include "kernels/nf4.h"
#include "kernels/nf4_linear.h"
#include "worker/plan/memory_plan.h"
#include "worker/plan/optimizer_state_layout.h"

namespace zt {

std::string Nf4BufferPrefix(const UnitLayout& unit, const ParamSpec& p) {
  return absl::StrCat(unit.name, ".nf4.", p.name, ".");
}

std::string Int8BufferPrefix(const UnitLayout& unit, const ParamSpec& p) {
  return absl::StrCat(unit.name, ".int8.", p.name, ".");
}

bool IsQuantizedBaseBuffer(const std::string& name) {
  return name.find(".nf4.") != std::string::npos || name.find(".int8.") != std::string::npos;
}

Nf4ShareShape Nf4ShareShapeOf(const ModelLayout& layout, const ParamSpec& p) {
  if (layout.nf4_absmax != Nf4Absmax::kGroupIndexed || p.shape.size() != 2) return {};
  return {.row_blocks = p.shape[1] / kNf4Block,
          .whole_numel = p.whole_numel > 0 ? p.whole_numel : p.numel};
}

namespace {

// Quantized weight p's buffers as they are planned below stage 3.
std::vector<BufferSpec> QuantizedBuffersOf(const ModelLayout& layout, const UnitLayout& u,
                                           const ParamSpec& p) {
  if (layout.base_quantization == BaseQuantization::kInt8) {
    // One int8 code per weight and one f32 absmax per output row.
    const std::string prefix = Int8BufferPrefix(u, p);
    return {
        BufferSpec{
            prefix + "codes", MemoryCategory::kParameters, DType::kU8, {p.shape[0], p.shape[1]}},
        BufferSpec{prefix + "scales", MemoryCategory::kParameters, DType::kF32, {p.shape[0]}}};
  }
  const Nf4Layout nf4 = Nf4LayoutFor(p.numel, layout.nf4_absmax, Nf4ShareShapeOf(layout, p));
  const std::string prefix = Nf4BufferPrefix(u, p);
  if (layout.nf4_absmax == Nf4Absmax::kF32) {
    return {BufferSpec{prefix + "codes", MemoryCategory::kParameters, DType::kU8, {nf4.code_bytes}},
            BufferSpec{prefix + "absmax", MemoryCategory::kParameters, DType::kF32, {nf4.blocks}}};
  }
  std::vector<BufferSpec> out = {
      BufferSpec{prefix + "codes", MemoryCategory::kParameters, DType::kU8, {nf4.code_bytes}},
      BufferSpec{prefix + "absmax", MemoryCategory::kParameters, DType::kU8, {nf4.blocks}},
      BufferSpec{
          prefix + "absmax_scale", MemoryCategory::kParameters, DType::kF32, {nf4.absmax_groups}},
      BufferSpec{prefix + "absmax_offset", MemoryCategory::kParameters, DType::kF32, {1}}};
  if (layout.nf4_absmax == Nf4Absmax::kGroupIndexed) {
    // A tensor-parallel share: the one-rank index of each share row's first block.
    out.push_back(
        BufferSpec{prefix + "block_base", MemoryCategory::kParameters, DType::kI32, {nf4.rows}});
  }
  return out;
}

}  // namespace

QuantizedUnitBytes QuantizedBytesOf(const ModelLayout& layout, const UnitLayout& u) {
  QuantizedUnitBytes out;
  for (const ParamSpec& p : u.params) {
    if (!p.quantized) continue;
    for (const BufferSpec& b : QuantizedBuffersOf(layout, u, p)) {
      const int64_t bytes = b.numel() * DTypeSize(b.dtype);
      out.pieces.push_back({.name = b.name,
                            .dtype = b.dtype,
                            .shape = b.shape,
                            .offset = out.bytes,
                            .bytes = bytes});
      out.bytes += AlignedBytes(bytes);
    }
  }
  return out;
}

std::string QuantizedShardName(const UnitLayout& u) { return u.name + ".qbase"; }

bool ShardsQuantizedBase(const zerotrain::JobSpec& job, const ModelLayout& layout) {
  return layout.base_quantization != BaseQuantization::kNone && job.parallel().zero_stage() >= 3;
}

ModelLayout LoraAdapterLayout(const ModelLayout& layout) {
  ModelLayout out;
  for (const UnitLayout& u : layout.units) {
    if (u.lora.empty()) continue;
    UnitLayout adapters;
    adapters.kind = u.kind;
    adapters.block_index = u.block_index;
    adapters.name = u.name + ".lora";
    adapters.numel = u.lora_numel;
    for (const LoraSite& s : u.lora) {
      adapters.params.push_back(s.a);
      adapters.params.push_back(s.b);
    }
    out.total_numel += adapters.numel;
    out.units.push_back(std::move(adapters));
  }
  return out;
}

std::vector<BufferSpec> LoraStateBuffers(const zerotrain::JobSpec& job, const ModelLayout& layout,
                                         DType grad, const ShardGeometry& geometry) {
  std::vector<BufferSpec> out;
  const int stage = job.parallel().zero_stage();
  const bool accumulate_full =
      stage >= 2 && job.train().grad_accum_steps() > 1 && !StageGradientsPerMicroBatch(job);
  // The host step's gradients come down during the backward (offload.optimizer CPU, and NVME
  // with the delayed update), as PlanMemory plans them for a full unit.
  const bool delayed_update = job.offload().delayed_update().enabled();
  const bool host_step =
      stage >= 1 &&
      (job.offload().optimizer() == zerotrain::OffloadConfig::CPU ||
       (job.offload().optimizer() == zerotrain::OffloadConfig::NVME && delayed_update));
  // A model loaded from model.init_from reloads its frozen base there at every start: the
  // checkpoints leave it out (docs/lora.md, "Checkpoints").
  const bool base_reloaded = !job.model().init_from().empty();
  const bool sharded = ShardsQuantizedBase(job, layout);
  int64_t largest_gathered = 0;  // f32 words of the largest block's padded quantized bytes
  for (const UnitLayout& u : layout.units) {
    const QuantizedUnitBytes quantized = QuantizedBytesOf(layout, u);
    if (sharded && !quantized.pieces.empty()) {
      const UnitShard shard = ShardOf(quantized.words(), geometry);
      out.push_back(
          {QuantizedShardName(u), MemoryCategory::kParameters, DType::kF32, {shard.shard_numel}});
      out.back().reloaded_at_start = base_reloaded;
      largest_gathered = std::max(largest_gathered, shard.padded);
      if (!job.parallel().reshard_after_forward()) {
        out.push_back({QuantizedShardName(u) + ".gathered",
                       MemoryCategory::kParameters,
                       DType::kF32,
                       {shard.padded}});
      }
    } else if (!sharded) {
      for (const ParamSpec& p : u.params) {
        if (!p.quantized) continue;
        for (BufferSpec& b : QuantizedBuffersOf(layout, u, p)) {
          b.reloaded_at_start = base_reloaded;
          out.push_back(std::move(b));
        }
      }
    }
    if (u.lora.empty()) continue;
    // As a trainable unit's parameters and gradients (memory_plan.cc): whole at stage 0,
    // padded to the shard quantum where a stage reduce-scatters or all-gathers them, the
    // gradient only the rank's shard at stage 2 (its full gradient lives in "grad.full.*").
    const UnitShard shard = ShardOf(u.lora_numel, geometry);
    const int64_t full = stage == 0 ? u.lora_numel : shard.padded;
    out.push_back({u.name + ".lora", MemoryCategory::kParameters, DType::kF32, {full}});
    out.push_back({u.name + ".lora_grads",
                   MemoryCategory::kGradients,
                   grad,
                   {stage >= 2 ? shard.shard_numel : full}});
    if (accumulate_full) {
      out.push_back(
          {u.name + ".lora_grad_accum", MemoryCategory::kGradients, grad, {shard.padded}});
    }
    if (host_step) {
      // ZeRO-Offload's overlap, as for a full unit (memory_plan.cc): the adapters' reduced
      // shard comes down here during the backward ("<trainable unit>.grads.host").
      out.push_back(
          {u.name + ".lora.grads.host", MemoryCategory::kPinnedHost, grad, {shard.shard_numel}});
      if (delayed_update) {
        // The delayed update (worker/optim/delayed_host_step.h), as for a full unit: a second
        // bank the next backward copies into while the host step reads this one, and the
        // adapters' updated shard (f32, as "<block>.lora"), uploaded once that backward has
        // ended. The adapters are never swapped, so there is always such a bank.
        out.push_back({u.name + ".lora.grads.host.1",
                       MemoryCategory::kPinnedHost,
                       grad,
                       {shard.shard_numel}});
        out.push_back({u.name + ".lora.params.host",
                       MemoryCategory::kPinnedHost,
                       DType::kF32,
                       {shard.shard_numel}});
      }
    }
  }
  if (largest_gathered > 0 && job.parallel().reshard_after_forward()) {
    // Beside each "gather.<k>" slot: the quantized bytes of the unit gathered into it.
    for (int k = 0; k <= job.parallel().prefetch_units(); ++k) {
      out.push_back({absl::StrCat("qbase.gather.", k),
                     MemoryCategory::kParameters,
                     DType::kF32,
                     {largest_gathered}});
    }
  }
  for (const UnitLayout& adapters : LoraAdapterLayout(layout).units) {
    const FlatRange range = stage >= 1 ? ShardOf(adapters.numel, geometry).owned : FlatRange{};
    for (const UnitOptimizerState::Buffer& b :
         OptimizerStateFor(job.optimizer(), adapters, range).buffers) {
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
  if (widest_in > 0) {
    out.push_back({"lora.out", MemoryCategory::kWorkspace, compute, {rows, widest_rows}});
    out.push_back({"lora.dout", MemoryCategory::kWorkspace, compute, {rows, widest_rows}});
    out.push_back({"lora.dh", MemoryCategory::kWorkspace, compute, {rows, layout.lora_rank}});
    out.push_back({"lora.dinp", MemoryCategory::kWorkspace, compute, {rows, widest_in}});
    if (layout.lora_dropout > 0) {
      out.push_back({"lora.dropped", MemoryCategory::kWorkspace, compute, {rows, widest_in}});
    }
  }
  // A frozen norm's weight (and bias) gradient has nowhere to go: the norm ops always write
  // one, so it lands here and is never read. Its width is d_model, read from a block's (or
  // the head's) first norm, whichever units a pipeline stage holds; a stage of the embedding
  // alone has no norm.
  int64_t C = 0;
  for (const UnitLayout& u : layout.units) {
    for (const char* norm : {"ln1.weight", "ln_f.weight"}) {
      if (const ParamSpec* p = u.Find(norm); p != nullptr && C == 0) C = p->shape[0];
    }
  }
  if (C > 0) {
    out.push_back({"lora.norm_grad_sink", MemoryCategory::kWorkspace, DType::kF32, {2 * C}});
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
    for (const ParamSpec& p : u.params) {
      if (!p.quantized) continue;
      if (layout.base_quantization == BaseQuantization::kInt8) {
        // The forward's int8 activations, their scales and outlier columns; the backward none.
        most = std::max(most, Int8LinearWorkspaceBytes(rows, p.shape[1]));
        continue;
      }
      absl::StatusOr<int64_t> bytes =
          Nf4LinearWorkspaceBytes(ctx, rows, p.shape[1], p.shape[0], dtypes);
      if (bytes.ok()) most = std::max(most, *bytes);
    }
  }
  return most;
}

LoraMemoryBreakdown LoraBreakdown(const MemoryPlan& plan) {
  LoraMemoryBreakdown out;
  for (const BufferSpec& b : plan.buffers) {
    const int64_t bytes = PlacedBytes(b);
    const MemoryCategory role = b.role();
    if (role == MemoryCategory::kParameters &&
        (b.name.ends_with(".params") || b.name.ends_with(".qbase") ||
         IsQuantizedBaseBuffer(b.name))) {
      out.base_bytes += bytes;
    }
    if (role == MemoryCategory::kParameters && b.name.ends_with(".lora"))
      out.adapter_bytes += bytes;
    if (role == MemoryCategory::kGradients && b.name.ends_with(".lora_grads")) {
      out.adapter_gradient_bytes += bytes;
    }
    if (role == MemoryCategory::kOptimizerState && b.name.find(".lora.") != std::string::npos) {
      out.adapter_optimizer_bytes += bytes;
    }
    if (role == MemoryCategory::kActivations) out.activation_bytes += bytes;
  }
  return out;
}

}  // namespace zt
