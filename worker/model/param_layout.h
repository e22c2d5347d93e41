// The parameter layout: the model as a sequence of units, each with one flat buffer.
//
// Units, in order: "embedding", "block.0" … "block.{L-1}", "head" (final norm + output
// projection). Each unit's parameters are laid out back to back in one contiguous flat
// buffer; the layout (name, shape, offset of every tensor) is a pure function of the model
// config, so every rank, checkpoint and tool agrees on it. The unit is the granularity of
// everything that moves memory (gather/release, reduce-scatter, recompute, offload,
// checkpoint ranges).
//
// Names inside a unit (C = d_model, F = d_ff, D = C/H, Q = (H + 2·Hkv)·D):
//   embedding: wte (V, C); GPT2 also wpe (P, C)
//   block.i:   ln1.weight (C) [GPT2: ln1.bias (C)]
//              attn.qkv.weight (Q, C) [GPT2: attn.qkv.bias (Q)]   rows: [q | k | v]
//              attn.proj.weight (C, H·D) [GPT2: attn.proj.bias (C)]
//              ln2.weight (C) [GPT2: ln2.bias (C)]
//              GPT2:  mlp.fc.weight (F, C), mlp.fc.bias (F)
//              LLAMA: mlp.fc.weight (2F, C)   rows: [gate | up]
//              mlp.proj.weight (C, F) [GPT2: mlp.proj.bias (C)]
//   head:      ln_f.weight (C) [GPT2: ln_f.bias (C)]; lm_head.weight (V, C) unless tied
//              (tied: the head reads embedding's wte, and its gradient lands there).
// Linear weights are (out, in), as torch.nn.Linear.
//
// Roles (DESIGN.md, "Unit"): without model.lora every unit's buffer is trainable. With it the
// units' buffers ("<unit>.params") are the frozen base (no gradient, no optimizer state) and
// each block that holds an adapted layer gets a second, trainable flat buffer of its adapters
// ("<unit>.lora"), laid out per LoraSite as lora_A (r, in) then lora_B (rows, r). With
// base_dtype NF4 or INT8 the blocks' four linear weights leave the flat buffer
// (ParamSpec::quantized; the block's role is then kQuantized): each is its own NF4 tensor, or
// its own LLM.int8() codes and row scales (ModelLayout::base_quantization,
// worker/plan/lora_plan.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/nf4.h"
#include "proto/job.pb.h"

namespace zt {

enum class UnitKind : uint8_t { kEmbedding, kBlock, kHead };

// What the optimizer and the sharding engine do with a buffer: a trainable one has gradients
// and optimizer state; a frozen one has neither; a quantized one is frozen and stored in a
// block-quantized format (NF4, INT8).
enum class ParamRole : uint8_t { kTrainable, kFrozen, kQuantized };

// How a LoRA job's quantized base weights (ParamSpec::quantized) are stored: not at all (no
// quantized weights), NF4 with double quantization (kernels/nf4.h), or LLM.int8()'s int8 codes
// with a scale per output row (kernels/int8_linear.h).
enum class BaseQuantization : uint8_t { kNone, kNf4, kInt8 };

struct ParamSpec {
  std::string name;            // "attn.qkv.weight"
  std::vector<int64_t> shape;  // (out, in) for linear weights
  int64_t offset = 0;          // in elements, from the start of the unit's buffer
  int64_t numel = 0;
  bool is_matrix = false;     // a linear layer's weight (weight decay applies by default)
  bool is_embedding = false;  // wte / wpe
  // Stored quantized outside the unit's flat buffer (a LoRA job's base_dtype NF4 or INT8: the
  // blocks' linear weights); `offset` is then -1 and the unit's numel leaves it out.
  bool quantized = false;
  // On a tensor-parallel rank (TensorParallelModelLayout) the one-rank tensor's numel, whose
  // share `shape` is; 0 in a one-rank layout. An NF4 share keeps the whole weight's group
  // scales (kernels/nf4.h, kGroupIndexed).
  int64_t whole_numel = 0;
};

// One adapted linear layer (or part of a fused one) of a block: y[:, row_begin : row_begin +
// rows] += scale · (dropout(x) · Aᵀ) · Bᵀ, where the base weight's rows [row_begin, row_begin +
// rows) are the module's (worker/model/lora_targets.h).
struct LoraSite {
  std::string module;   // "q_proj"
  std::string hf_path;  // "self_attn.q_proj": the module's path inside a Hugging Face block
  std::string weight;   // the base tensor: "attn.qkv.weight"
  int64_t row_begin = 0;
  int64_t rows = 0;  // out
  int64_t in = 0;
  ParamSpec a;  // "<hf_path>.lora_A" (r, in), in the unit's adapter buffer
  ParamSpec b;  // "<hf_path>.lora_B" (rows, r)
};

struct UnitLayout {
  UnitKind kind = UnitKind::kBlock;
  int block_index = -1;  // for blocks, else -1
  std::string name;      // "embedding", "block.3", "head"
  std::vector<ParamSpec> params;
  int64_t numel = 0;
  ParamRole role = ParamRole::kTrainable;  // of `params`' buffer
  // The adapters of the block's adapted layers, in lora_targets.h's table order, and the
  // elements of their trainable buffer; empty without model.lora.
  std::vector<LoraSite> lora;
  int64_t lora_numel = 0;

  bool trainable() const { return role == ParamRole::kTrainable; }
  // Elements of the unit's trainable buffer, the one its gradient, optimizer state and ZeRO
  // shard are of: the flat parameters ("<unit>.params") of a trainable unit, the adapters
  // ("<unit>.lora") of a LoRA unit, 0 for a frozen unit without adapters.
  int64_t trainable_numel() const { return trainable() ? numel : lora_numel; }

  // The tensor called `name`, or nullptr.
  const ParamSpec* Find(const std::string& name) const;
};

struct ModelLayout {
  std::vector<UnitLayout> units;  // embedding, blocks…, head
  // The model's parameters, quantized base weights included (adapters not): what FLOPs per
  // token are counted from.
  int64_t total_numel = 0;
  // The storage of the quantized weights; kNone when no ParamSpec is quantized.
  BaseQuantization base_quantization = BaseQuantization::kNone;
  // base_dtype NF4: how each quantized weight keeps its block absmax values. One rank
  // double-quantizes (the paper's layout); a tensor-parallel share keeps the one-rank weight's
  // 8-bit absmax code of each of its blocks, the one-rank weight's group scales and μ, and per
  // share row the one-rank index of its first block (kGroupIndexed), because the double
  // quantization's 256-block groups run along the whole weight's flat elements and a share's
  // blocks (a row-parallel share's columns above all) fall into other groups than its own
  // 256-block groups would (docs/lora.md, "QLoRA on tensor-parallel ranks").
  Nf4Absmax nf4_absmax = Nf4Absmax::kDoubleQuantized;
  // base_dtype INT8: the outlier threshold of every quantized layer (model.int8_threshold).
  float int8_threshold = 0.0f;
  bool tied_embeddings = false;
  // model.lora: rank r, scale alpha / r and dropout p of every adapter; total adapter elements.
  bool lora = false;
  int64_t lora_rank = 0;
  float lora_scale = 0.0f;
  float lora_dropout = 0.0f;
  int64_t lora_numel = 0;

  const UnitLayout& embedding() const { return units.front(); }
  const UnitLayout& head() const { return units.back(); }
  const UnitLayout& block(int i) const { return units[1 + i]; }
  int n_blocks() const { return static_cast<int>(units.size()) - 2; }
};

// The layout of a validated model config (defaults applied).
ModelLayout BuildModelLayout(const zerotrain::ModelConfig& model);

}  // namespace zt
