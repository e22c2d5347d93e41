// The linear layers LoRA may adapt, by their Hugging Face module names, and where each sits in
// this engine's fused block weights. Header-only: job validation (which links no model code),
// the parameter layout and PEFT export read the same table.
//
// LLAMA's q/k/v and gate/up projections are row ranges of the fused attn.qkv.weight and
// mlp.fc.weight; each gets its own adapter (as PEFT gives each nn.Linear its own) writing its
// own columns of the fused output. GPT-2's "c_proj" names two modules (attn.c_proj and
// mlp.c_proj); PEFT's suffix match adapts both, and so does this table.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "proto/job.pb.h"

namespace zt {

// Which rows of the fused base weight a module covers.
enum class LoraRows : uint8_t { kAll, kQ, kK, kV, kGate, kUp };

struct LoraTarget {
  std::string_view module;  // the name users write in model.lora.target_modules: "q_proj"
  std::string_view weight;  // the block tensor it adapts: "attn.qkv.weight"
  LoraRows rows;
  std::string_view hf_path;  // the module's path inside a Hugging Face block: "self_attn.q_proj"
};

inline constexpr LoraTarget kLlamaLoraTargets[] = {
    {"q_proj", "attn.qkv.weight", LoraRows::kQ, "self_attn.q_proj"},
    {"k_proj", "attn.qkv.weight", LoraRows::kK, "self_attn.k_proj"},
    {"v_proj", "attn.qkv.weight", LoraRows::kV, "self_attn.v_proj"},
    {"o_proj", "attn.proj.weight", LoraRows::kAll, "self_attn.o_proj"},
    {"gate_proj", "mlp.fc.weight", LoraRows::kGate, "mlp.gate_proj"},
    {"up_proj", "mlp.fc.weight", LoraRows::kUp, "mlp.up_proj"},
    {"down_proj", "mlp.proj.weight", LoraRows::kAll, "mlp.down_proj"},
};
inline constexpr LoraTarget kGpt2LoraTargets[] = {
    {"c_attn", "attn.qkv.weight", LoraRows::kAll, "attn.c_attn"},
    {"c_proj", "attn.proj.weight", LoraRows::kAll, "attn.c_proj"},
    {"c_fc", "mlp.fc.weight", LoraRows::kAll, "mlp.c_fc"},
    {"c_proj", "mlp.proj.weight", LoraRows::kAll, "mlp.c_proj"},
};

// The table of `family`; empty for FAMILY_UNSPECIFIED.
inline std::span<const LoraTarget> LoraTargets(zerotrain::ModelConfig::Family family) {
  switch (family) {
    case zerotrain::ModelConfig::LLAMA:
      return kLlamaLoraTargets;
    case zerotrain::ModelConfig::GPT2:
      return kGpt2LoraTargets;
    default:
      return {};
  }
}

// The module names a family accepts, in table order, each once: "q_proj k_proj …".
inline std::string LoraModuleNames(zerotrain::ModelConfig::Family family) {
  const std::span<const LoraTarget> table = LoraTargets(family);
  std::string out;
  for (size_t i = 0; i < table.size(); ++i) {
    bool seen = false;
    for (size_t j = 0; j < i; ++j) seen |= table[j].module == table[i].module;
    if (seen) continue;
    if (!out.empty()) out += ' ';
    out += table[i].module;
  }
  return out;
}

}  // namespace zt
