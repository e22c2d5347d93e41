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
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"

namespace zt {

enum class UnitKind : uint8_t { kEmbedding, kBlock, kHead };

struct ParamSpec {
  std::string name;            // "attn.qkv.weight"
  std::vector<int64_t> shape;  // (out, in) for linear weights
  int64_t offset = 0;          // in elements, from the start of the unit's buffer
  int64_t numel = 0;
  bool is_matrix = false;      // a linear layer's weight (weight decay applies by default)
  bool is_embedding = false;   // wte / wpe
};

struct UnitLayout {
  UnitKind kind = UnitKind::kBlock;
  int block_index = -1;  // for blocks, else -1
  std::string name;      // "embedding", "block.3", "head"
  std::vector<ParamSpec> params;
  int64_t numel = 0;

  // The tensor called `name`, or nullptr.
  const ParamSpec* Find(const std::string& name) const;
};

struct ModelLayout {
  std::vector<UnitLayout> units;  // embedding, blocks…, head
  int64_t total_numel = 0;
  bool tied_embeddings = false;

  const UnitLayout& embedding() const { return units.front(); }
  const UnitLayout& head() const { return units.back(); }
  const UnitLayout& block(int i) const { return units[1 + i]; }
  int n_blocks() const { return static_cast<int>(units.size()) - 2; }
};

// The layout of a validated model config (defaults applied).
ModelLayout BuildModelLayout(const zerotrain::ModelConfig& model);

}  // namespace zt
