// The Hugging Face names, shapes and destinations the checkpoint tests expect, written out
// independently of worker/checkpoint/hf_interop.cc so that the tests check it rather than
// repeat it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/job.pb.h"
#include "worker/model/param_layout.h"

namespace zt::testing_util {

// One tensor of a Hugging Face file and, written out independently of the implementation,
// where its element [a, b] must land: row (row0 + a, column b) of the unit parameter, or
// (row0 + b, a) when the file stores the transpose (GPT-2 Conv1D).
struct HfSource {
  std::string name;
  std::vector<int64_t> shape;
  std::string unit;
  std::string param;
  int64_t row0 = 0;
  bool transposed = false;
};

inline std::vector<HfSource> Gpt2Sources(const zerotrain::ModelConfig& m,
                                         const std::string& prefix) {
  const int64_t C = m.d_model(), F = m.d_ff(), V = m.vocab_size(), P = m.max_seq_len();
  std::vector<HfSource> s = {{prefix + "wte.weight", {V, C}, "embedding", "wte"},
                             {prefix + "wpe.weight", {P, C}, "embedding", "wpe"}};
  for (int i = 0; i < m.n_layer(); ++i) {
    const std::string h = absl::StrCat(prefix, "h.", i, "."), b = absl::StrCat("block.", i);
    s.push_back({h + "ln_1.weight", {C}, b, "ln1.weight"});
    s.push_back({h + "ln_1.bias", {C}, b, "ln1.bias"});
    s.push_back({h + "attn.c_attn.weight", {C, 3 * C}, b, "attn.qkv.weight", 0, true});
    s.push_back({h + "attn.c_attn.bias", {3 * C}, b, "attn.qkv.bias"});
    s.push_back({h + "attn.c_proj.weight", {C, C}, b, "attn.proj.weight", 0, true});
    s.push_back({h + "attn.c_proj.bias", {C}, b, "attn.proj.bias"});
    s.push_back({h + "ln_2.weight", {C}, b, "ln2.weight"});
    s.push_back({h + "ln_2.bias", {C}, b, "ln2.bias"});
    s.push_back({h + "mlp.c_fc.weight", {C, F}, b, "mlp.fc.weight", 0, true});
    s.push_back({h + "mlp.c_fc.bias", {F}, b, "mlp.fc.bias"});
    s.push_back({h + "mlp.c_proj.weight", {F, C}, b, "mlp.proj.weight", 0, true});
    s.push_back({h + "mlp.c_proj.bias", {C}, b, "mlp.proj.bias"});
  }
  s.push_back({prefix + "ln_f.weight", {C}, "head", "ln_f.weight"});
  s.push_back({prefix + "ln_f.bias", {C}, "head", "ln_f.bias"});
  if (!m.tie_embeddings()) s.push_back({"lm_head.weight", {V, C}, "head", "lm_head.weight"});
  return s;
}

inline std::vector<HfSource> LlamaSources(const zerotrain::ModelConfig& m) {
  const int64_t C = m.d_model(), F = m.d_ff(), V = m.vocab_size();
  const int64_t D = C / m.n_head(), HD = m.n_head() * D, KD = m.n_kv_head() * D;
  std::vector<HfSource> s = {{"model.embed_tokens.weight", {V, C}, "embedding", "wte"}};
  for (int i = 0; i < m.n_layer(); ++i) {
    const std::string l = absl::StrCat("model.layers.", i, "."), b = absl::StrCat("block.", i);
    s.push_back({l + "input_layernorm.weight", {C}, b, "ln1.weight"});
    s.push_back({l + "self_attn.q_proj.weight", {HD, C}, b, "attn.qkv.weight", 0});
    s.push_back({l + "self_attn.k_proj.weight", {KD, C}, b, "attn.qkv.weight", HD});
    s.push_back({l + "self_attn.v_proj.weight", {KD, C}, b, "attn.qkv.weight", HD + KD});
    s.push_back({l + "self_attn.o_proj.weight", {C, HD}, b, "attn.proj.weight"});
    s.push_back({l + "post_attention_layernorm.weight", {C}, b, "ln2.weight"});
    s.push_back({l + "mlp.gate_proj.weight", {F, C}, b, "mlp.fc.weight", 0});
    s.push_back({l + "mlp.up_proj.weight", {F, C}, b, "mlp.fc.weight", F});
    s.push_back({l + "mlp.down_proj.weight", {C, F}, b, "mlp.proj.weight"});
  }
  s.push_back({"model.norm.weight", {C}, "head", "ln_f.weight"});
  if (!m.tie_embeddings()) s.push_back({"lm_head.weight", {V, C}, "head", "lm_head.weight"});
  return s;
}

inline int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The values of HF tensor `s` in the file's row-major order, read from ZeroTrain's buffers
// (`units[u]` is unit u's flat buffer), widened to float64.
inline std::vector<double> HfOrderValues(const ModelLayout& layout, const HfSource& s,
                                         const std::vector<const float*>& units) {
  size_t u = 0;
  while (layout.units[u].name != s.unit) ++u;
  const ParamSpec* p = layout.units[u].Find(s.param);
  const int64_t cols = p->shape.size() == 2 ? p->shape[1] : 1;
  const int64_t a_n = s.shape[0], b_n = s.shape.size() == 2 ? s.shape[1] : 1;
  std::vector<double> v;
  v.reserve(a_n * b_n);
  for (int64_t a = 0; a < a_n; ++a) {
    for (int64_t b = 0; b < b_n; ++b) {
      const int64_t row = s.row0 + (s.transposed ? b : a);
      const int64_t col = s.transposed ? a : b;
      v.push_back(units[u][p->offset + row * cols + col]);
    }
  }
  return v;
}

}  // namespace zt::testing_util
