#include "worker/model/param_layout.h"

#include "absl/strings/str_cat.h"
#include "kernels/int8_linear.h"
#include "worker/model/lora_targets.h"

namespace zt {
namespace {

class UnitBuilder {
 public:
  UnitBuilder(UnitKind kind, int block_index, std::string name) {
    unit_.kind = kind;
    unit_.block_index = block_index;
    unit_.name = std::move(name);
  }
  UnitBuilder& Add(std::string name, std::vector<int64_t> shape, bool is_matrix = false,
                   bool is_embedding = false) {
    ParamSpec p;
    p.name = std::move(name);
    p.numel = 1;
    for (int64_t s : shape) p.numel *= s;
    p.shape = std::move(shape);
    p.offset = unit_.numel;
    p.is_matrix = is_matrix;
    p.is_embedding = is_embedding;
    unit_.numel += p.numel;
    unit_.params.push_back(std::move(p));
    return *this;
  }
  UnitLayout Build() { return std::move(unit_); }

 private:
  UnitLayout unit_;
};

ParamSpec AdapterSpec(std::string name, int64_t rows, int64_t cols, int64_t offset) {
  return {.name = std::move(name),
          .shape = {rows, cols},
          .offset = offset,
          .numel = rows * cols,
          .is_matrix = true};
}

// The adapters of block `unit` for model.lora's target modules, in table order.
void AddLoraSites(const zerotrain::ModelConfig& m, UnitLayout& unit) {
  const int64_t C = m.d_model(), F = m.d_ff(), r = m.lora().rank();
  const int64_t D = C / m.n_head();
  const int64_t HD = m.n_head() * D, KV = m.n_kv_head() * D;
  for (const LoraTarget& t : LoraTargets(m.family())) {
    bool wanted = false;
    for (const std::string& name : m.lora().target_modules()) wanted |= name == t.module;
    if (!wanted) continue;
    const ParamSpec* base = unit.Find(std::string(t.weight));
    LoraSite site;
    site.module = t.module;
    site.hf_path = t.hf_path;
    site.weight = t.weight;
    site.in = base->shape[1];
    switch (t.rows) {
      case LoraRows::kAll:
        site.rows = base->shape[0];
        break;
      case LoraRows::kQ:
        site.rows = HD;
        break;
      case LoraRows::kK:
        site.row_begin = HD;
        site.rows = KV;
        break;
      case LoraRows::kV:
        site.row_begin = HD + KV;
        site.rows = KV;
        break;
      case LoraRows::kGate:
        site.rows = F;
        break;
      case LoraRows::kUp:
        site.row_begin = F;
        site.rows = F;
        break;
    }
    site.a = AdapterSpec(std::string(t.hf_path) + ".lora_A", r, site.in, unit.lora_numel);
    unit.lora_numel += site.a.numel;
    site.b = AdapterSpec(std::string(t.hf_path) + ".lora_B", site.rows, r, unit.lora_numel);
    unit.lora_numel += site.b.numel;
    unit.lora.push_back(std::move(site));
  }
}

}  // namespace

const ParamSpec* UnitLayout::Find(const std::string& want) const {
  for (const ParamSpec& p : params) {
    if (p.name == want) return &p;
  }
  return nullptr;
}

ModelLayout BuildModelLayout(const zerotrain::ModelConfig& m) {
  const bool gpt2 = m.family() == zerotrain::ModelConfig::GPT2;
  const int64_t C = m.d_model(), V = m.vocab_size(), F = m.d_ff();
  const int64_t D = C / m.n_head();
  const int64_t Q = (m.n_head() + 2 * m.n_kv_head()) * D;
  const int64_t HD = m.n_head() * D;
  constexpr bool kMatrix = true;

  ModelLayout layout;
  layout.tied_embeddings = m.tie_embeddings();

  UnitBuilder emb(UnitKind::kEmbedding, -1, "embedding");
  emb.Add("wte", {V, C}, !kMatrix, /*is_embedding=*/true);
  if (gpt2) emb.Add("wpe", {m.max_seq_len(), C}, !kMatrix, /*is_embedding=*/true);
  layout.units.push_back(emb.Build());

  for (int i = 0; i < m.n_layer(); ++i) {
    UnitBuilder b(UnitKind::kBlock, i, absl::StrCat("block.", i));
    b.Add("ln1.weight", {C});
    if (gpt2) b.Add("ln1.bias", {C});
    b.Add("attn.qkv.weight", {Q, C}, kMatrix);
    if (gpt2) b.Add("attn.qkv.bias", {Q});
    b.Add("attn.proj.weight", {C, HD}, kMatrix);
    if (gpt2) b.Add("attn.proj.bias", {C});
    b.Add("ln2.weight", {C});
    if (gpt2) b.Add("ln2.bias", {C});
    b.Add("mlp.fc.weight", {gpt2 ? F : 2 * F, C}, kMatrix);
    if (gpt2) b.Add("mlp.fc.bias", {F});
    b.Add("mlp.proj.weight", {C, F}, kMatrix);
    if (gpt2) b.Add("mlp.proj.bias", {C});
    layout.units.push_back(b.Build());
  }

  UnitBuilder head(UnitKind::kHead, -1, "head");
  head.Add("ln_f.weight", {C});
  if (gpt2) head.Add("ln_f.bias", {C});
  if (!m.tie_embeddings()) head.Add("lm_head.weight", {V, C}, kMatrix);
  layout.units.push_back(head.Build());

  if (m.has_lora()) {
    layout.lora = true;
    layout.lora_rank = m.lora().rank();
    layout.lora_scale = m.lora().alpha() / static_cast<float>(m.lora().rank());
    layout.lora_dropout = m.lora().dropout();
    if (m.base_dtype() == zerotrain::ModelConfig::NF4) {
      layout.base_quantization = BaseQuantization::kNf4;
    } else if (m.base_dtype() == zerotrain::ModelConfig::INT8) {
      layout.base_quantization = BaseQuantization::kInt8;
      // Job defaults fill the field; a config that skipped them gets the paper's threshold.
      layout.int8_threshold = m.has_int8_threshold() ? m.int8_threshold() : kInt8OutlierThreshold;
    }
    const bool quantized = layout.base_quantization != BaseQuantization::kNone;
    for (UnitLayout& u : layout.units) {
      u.role = ParamRole::kFrozen;
      if (quantized && u.kind == UnitKind::kBlock) {
        // The linear weights leave the flat buffer; the norms (and GPT-2's biases) stay.
        u.role = ParamRole::kQuantized;
        u.numel = 0;
        for (ParamSpec& p : u.params) {
          p.quantized = p.is_matrix;
          p.offset = p.quantized ? -1 : u.numel;
          if (!p.quantized) u.numel += p.numel;
        }
      }
      if (u.kind == UnitKind::kBlock) AddLoraSites(m, u);
      layout.lora_numel += u.lora_numel;
    }
  }
  // A quantized weight is not in its unit's flat buffer (numel) but still a weight of the model.
  for (const UnitLayout& u : layout.units) {
    for (const ParamSpec& p : u.params) layout.total_numel += p.numel;
  }
  return layout;
}

}  // namespace zt
