// The LoRA part of the memory plan (worker/plan/memory_plan.h; docs/lora.md): the trainable
// adapter buffers, their gradients and optimizer state, what the adapters save for the
// backward, and their scratch. PlanMemory adds these to a LoRA job's plan and gives the frozen
// base units no gradient and no optimizer state.
//
// Buffer names (B·T rows, r rank, in/rows the widest adapted layer's sides):
//   parameters:  "<block>.lora"             f32, the block's adapters (UnitLayout::lora_numel;
//                                           padded to the shard quantum at ZeRO stages ≥ 1)
//                "<block>.nf4.<tensor>.codes|absmax|absmax_scale|absmax_offset"  base_dtype
//                NF4: each quantized base weight, double-quantized (kernels/nf4.h); a
//                tensor-parallel share adds ".block_base" i32 (a share row each) and its
//                absmax_scale is the one-rank weight's (kGroupIndexed, ModelLayout::nf4_absmax)
//                "<block>.int8.<tensor>.codes" u8 (out, in) and ".scales" f32 (out)  base_dtype
//                INT8: each quantized base weight, LLM.int8()'s (kernels/int8_linear.h)
//   gradients:   "<block>.lora_grads"       grad_dtype, same size; the rank's shard at stage 2
//                "<block>.lora_grad_accum"  stage 2 with grad_accum_steps > 1, padded
//   pinned host: "<block>.lora.grads.host"  grad_dtype, the rank's reduced shard, copied down
//                in the backward; offload.delayed_update: ".grads.host.1", ".params.host" (f32)
//   optimizer:   "<block>.lora.<state>"     as OptimizerStateFor lays the adapters out (the
//                                           rank's range at stages ≥ 1)
//   activations: "<block>.lora.<hf_path>"   (B·T, r) compute dtype: scale · dropout(x) · Aᵀ
//   workspace:   "lora.out" / "lora.dout"   (B·T, rows) an adapter's output and its gradient
//                "lora.dh" (B·T, r), "lora.dinp" (B·T, in), and with dropout "lora.dropped"
//                (B·T, in), the dropped input (recomputed from its seed in the backward);
//                "lora.norm_grad_sink" (2·C) f32, where the frozen norms' unused weight
//                gradients land
//   stage 3:     "<block>.qbase"            f32 words: the rank's shard of the block's quantized
//                                           bytes (QuantizedUnitBytes, padded to the shard
//                                           quantum), in place of the per-tensor buffers above
//                "qbase.gather.<k>"         one per "gather.<k>": a gathered block's bytes
//                "<block>.qbase.gathered"   without reshard_after_forward, per block
// The adapters are a LoRA unit's trainable buffer (UnitLayout::trainable_numel): ZeRO shards
// their gradients and optimizer state as it shards a trainable unit's; the frozen base's flat
// buffers shard at stage 3 as any unit's parameters (memory_plan.cc), and so do its quantized
// weights: a block's NF4 or INT8 buffers are one flat byte buffer, all-gathered (as f32 words:
// the all-gather copies bits) before each use and released after. Stateless.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "proto/job.pb.h"
#include "worker/model/param_layout.h"
#include "worker/plan/memory_plan.h"

namespace zt {

// "<unit>.nf4.<tensor>.": the name prefix of quantized tensor p's four NF4 buffers.
std::string Nf4BufferPrefix(const UnitLayout& unit, const ParamSpec& p);
// "<unit>.int8.<tensor>.": the name prefix of quantized tensor p's INT8 codes and scales.
std::string Int8BufferPrefix(const UnitLayout& unit, const ParamSpec& p);
// Whether plan buffer `name` holds part of a quantized base weight (NF4 or INT8) below stage
// 3: whole on every rank, saved with the base.
bool IsQuantizedBaseBuffer(const std::string& name);

// A block's quantized buffers laid end to end as one flat byte buffer (stage 3 shards it):
// each buffer at a kBufferAlignment-aligned byte offset, in the block's tensor order.
struct QuantizedPiece {
  std::string name;  // as below stage 3: "<unit>.nf4.<tensor>.codes", ...
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // bytes into the unit's quantized bytes
  int64_t bytes = 0;
};
struct QuantizedUnitBytes {
  std::vector<QuantizedPiece> pieces;
  int64_t bytes = 0;  // the end of the last piece, aligned
  // f32 words that hold `bytes`: the unit's size in the all-gather (which moves f32).
  int64_t words() const { return bytes / 4; }
};
// Unit u's layout (no pieces for a unit without quantized weights).
QuantizedUnitBytes QuantizedBytesOf(const ModelLayout& layout, const UnitLayout& u);
// The kGroupIndexed shape of quantized weight p's NF4 share (its rows of p.shape[1] / 64 blocks,
// out of its one-rank weight of p.whole_numel) when `layout` keeps NF4 shares so
// (TensorParallelModelLayout); empty otherwise.
Nf4ShareShape Nf4ShareShapeOf(const ModelLayout& layout, const ParamSpec& p);
// "<unit>.qbase": the rank's shard of unit u's quantized bytes at stage 3.
std::string QuantizedShardName(const UnitLayout& u);
// Whether a stage-3 plan of `job` shards the quantized base (a LoRA job with an NF4 or INT8
// base at ZeRO stage 3).
bool ShardsQuantizedBase(const zerotrain::JobSpec& job, const ModelLayout& layout);

// The adapters as a model of their own for the optimizer (worker/optim/optimizer.h): one unit
// "<block>.lora" per block with adapters, holding its lora_A/lora_B matrices at their offsets,
// so Optimizer::Create over it finds the "<block>.lora.<state>" buffers this plan holds. Its
// precision must have no master weights (the adapters are f32).
ModelLayout LoraAdapterLayout(const ModelLayout& layout);

// Adapter parameters, gradients and optimizer state of every block of `layout` (empty without
// LoRA). Their dtypes: f32 adapters, gradients in `grad`.
// With model.init_from set, the base's quantized buffers are marked reloaded_at_start.
std::vector<BufferSpec> LoraStateBuffers(const zerotrain::JobSpec& job, const ModelLayout& layout,
                                         DType grad, const ShardGeometry& geometry);

// Activations and scratch of the adapters for `rows` = B·T tokens in `compute`; empty without
// LoRA.
std::vector<BufferSpec> LoraActivationBuffers(const ModelLayout& layout, int64_t rows,
                                              DType compute);

// The most GEMM scratch (bytes) an adapter's forward or backward needs on `ctx` for `rows`
// tokens: 0 without LoRA.
int64_t LoraGemmWorkspaceBytes(const ModelLayout& layout, int64_t rows, const DeviceContext& ctx,
                               DType compute, DType grad);

// What a LoRA job's plan holds, as `zt estimate` shows it: the frozen base (its "<unit>.params"
// in the base's dtype), the adapters, their gradients and optimizer state, and the
// activations (the adapters' included). Bytes as placed in the arenas (aligned).
struct LoraMemoryBreakdown {
  int64_t base_bytes = 0;
  int64_t adapter_bytes = 0;
  int64_t adapter_gradient_bytes = 0;
  int64_t adapter_optimizer_bytes = 0;
  int64_t activation_bytes = 0;
};
LoraMemoryBreakdown LoraBreakdown(const MemoryPlan& plan);

}  // namespace zt
