#include "worker/checkpoint/hf_interop.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/status_macros.h"
#include "worker/checkpoint/safetensors.h"

namespace zt {
namespace {

using zerotrain::ModelConfig;

constexpr std::string_view kGpt2Prefix = "transformer.";
const std::string kGpt2PrefixStr(kGpt2Prefix);

int64_t Rows(const ParamSpec& p) { return p.shape.empty() ? 1 : p.shape[0]; }
int64_t Cols(const ParamSpec& p) { return p.shape.size() < 2 ? 1 : p.numel / p.shape[0]; }

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

const char* FamilyName(const ModelConfig& m) {
  return m.family() == ModelConfig::GPT2 ? "GPT-2" : "Llama";
}

// Builds the name map of the header comment, checking that it covers every parameter of the
// layout exactly (a layout that was not built from this config fails here, not with a
// scribble past a buffer).
class TableBuilder {
 public:
  explicit TableBuilder(const ModelLayout& layout) : layout_(layout) {}

  void Add(std::string name, std::vector<int64_t> shape, int unit, const std::string& param,
           int64_t row_offset = 0, bool transpose = false) {
    const ParamSpec* p = layout_.units[unit].Find(param);
    if (p == nullptr) {
      problems_.push_back(absl::StrCat(layout_.units[unit].name, " has no ", param));
      return;
    }
    const int64_t out = shape.size() == 2 ? shape[transpose ? 1 : 0] : shape[0];
    const int64_t in = shape.size() == 2 ? shape[transpose ? 0 : 1] : 1;
    if (in != Cols(*p) || row_offset + out > Rows(*p)) {
      problems_.push_back(absl::StrCat(name, " ", ShapeString(shape), " does not fit ",
                                       layout_.units[unit].name, " ", param, " ",
                                       ShapeString(p->shape)));
      return;
    }
    covered_[p] += out;
    table_.push_back({std::move(name), std::move(shape), unit, p, row_offset, transpose});
  }

  absl::StatusOr<std::vector<HfTensor>> Build() {
    for (const UnitLayout& u : layout_.units) {
      for (const ParamSpec& p : u.params) {
        if (covered_[&p] != Rows(p)) {
          problems_.push_back(absl::StrCat(u.name, " ", p.name, " ", ShapeString(p.shape),
                                           " has no Hugging Face counterpart"));
        }
      }
    }
    if (!problems_.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the parameter layout does not match the model config: ",
                       absl::StrJoin(problems_, "; ")));
    }
    return std::move(table_);
  }

 private:
  const ModelLayout& layout_;
  std::vector<HfTensor> table_;
  std::map<const ParamSpec*, int64_t> covered_;
  std::vector<std::string> problems_;
};

}  // namespace

int64_t HfTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t HfTensor::unit_begin() const { return param->offset + row_offset * Cols(*param); }

absl::StatusOr<std::vector<HfTensor>> HuggingFaceTensors(const ModelConfig& m,
                                                         const ModelLayout& layout) {
  const bool gpt2 = m.family() == ModelConfig::GPT2;
  if (!gpt2 && m.family() != ModelConfig::LLAMA) {
    return absl::InvalidArgumentError(
        "model.family must be GPT2 or LLAMA for Hugging Face interop");
  }
  if (m.n_head() <= 0 || m.n_kv_head() <= 0 || m.d_model() % m.n_head() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.n_head (", m.n_head(), ") and model.n_kv_head (", m.n_kv_head(),
                     ") must be ≥ 1 and n_head must divide model.d_model (", m.d_model(), ")"));
  }
  if (gpt2 && m.n_kv_head() != m.n_head()) {
    return absl::InvalidArgumentError(absl::StrCat("GPT2 requires model.n_kv_head (", m.n_kv_head(),
                                                   ") == model.n_head (", m.n_head(), ")"));
  }
  if (layout.n_blocks() != m.n_layer() || layout.tied_embeddings != m.tie_embeddings()) {
    return absl::InvalidArgumentError(
        "the parameter layout does not match the model config (blocks or tying differ)");
  }
  const int64_t C = m.d_model(), F = m.d_ff(), V = m.vocab_size(), P = m.max_seq_len();
  const int64_t D = C / m.n_head();
  const int64_t HD = m.n_head() * D, KD = m.n_kv_head() * D;
  constexpr bool kTransposed = true;
  const int head = static_cast<int>(layout.units.size()) - 1;

  TableBuilder t(layout);
  if (gpt2) {
    const std::string& pre = kGpt2PrefixStr;
    t.Add(pre + "wte.weight", {V, C}, 0, "wte");
    t.Add(pre + "wpe.weight", {P, C}, 0, "wpe");
    for (int i = 0; i < m.n_layer(); ++i) {
      const std::string h = absl::StrCat(pre, "h.", i, ".");
      const int u = 1 + i;
      t.Add(h + "ln_1.weight", {C}, u, "ln1.weight");
      t.Add(h + "ln_1.bias", {C}, u, "ln1.bias");
      t.Add(h + "attn.c_attn.weight", {C, 3 * C}, u, "attn.qkv.weight", 0, kTransposed);
      t.Add(h + "attn.c_attn.bias", {3 * C}, u, "attn.qkv.bias");
      t.Add(h + "attn.c_proj.weight", {C, C}, u, "attn.proj.weight", 0, kTransposed);
      t.Add(h + "attn.c_proj.bias", {C}, u, "attn.proj.bias");
      t.Add(h + "ln_2.weight", {C}, u, "ln2.weight");
      t.Add(h + "ln_2.bias", {C}, u, "ln2.bias");
      t.Add(h + "mlp.c_fc.weight", {C, F}, u, "mlp.fc.weight", 0, kTransposed);
      t.Add(h + "mlp.c_fc.bias", {F}, u, "mlp.fc.bias");
      t.Add(h + "mlp.c_proj.weight", {F, C}, u, "mlp.proj.weight", 0, kTransposed);
      t.Add(h + "mlp.c_proj.bias", {C}, u, "mlp.proj.bias");
    }
    t.Add(pre + "ln_f.weight", {C}, head, "ln_f.weight");
    t.Add(pre + "ln_f.bias", {C}, head, "ln_f.bias");
  } else {
    t.Add("model.embed_tokens.weight", {V, C}, 0, "wte");
    for (int i = 0; i < m.n_layer(); ++i) {
      const std::string l = absl::StrCat("model.layers.", i, ".");
      const int u = 1 + i;
      t.Add(l + "input_layernorm.weight", {C}, u, "ln1.weight");
      t.Add(l + "self_attn.q_proj.weight", {HD, C}, u, "attn.qkv.weight", 0);
      t.Add(l + "self_attn.k_proj.weight", {KD, C}, u, "attn.qkv.weight", HD);
      t.Add(l + "self_attn.v_proj.weight", {KD, C}, u, "attn.qkv.weight", HD + KD);
      t.Add(l + "self_attn.o_proj.weight", {C, HD}, u, "attn.proj.weight");
      t.Add(l + "post_attention_layernorm.weight", {C}, u, "ln2.weight");
      t.Add(l + "mlp.gate_proj.weight", {F, C}, u, "mlp.fc.weight", 0);
      t.Add(l + "mlp.up_proj.weight", {F, C}, u, "mlp.fc.weight", F);
      t.Add(l + "mlp.down_proj.weight", {C, F}, u, "mlp.proj.weight");
    }
    t.Add("model.norm.weight", {C}, head, "ln_f.weight");
  }
  if (!m.tie_embeddings()) t.Add("lm_head.weight", {V, C}, head, "lm_head.weight");
  return t.Build();
}

namespace {

// What a null unit buffer means: an error (export writes every unit), or a unit the caller
// does not hold (a pipeline stage imports its own units only).
enum class NullBuffers { kRefused, kSkipTheUnit };

template <typename T>
absl::Status CheckBuffers(const ModelLayout& layout, const std::vector<T*>& bufs,
                          NullBuffers null = NullBuffers::kRefused) {
  if (bufs.size() != layout.units.size()) {
    return absl::InvalidArgumentError(absl::StrCat("unit_params holds ", bufs.size(),
                                                   " buffers but the layout has ",
                                                   layout.units.size(), " units"));
  }
  for (size_t u = 0; u < bufs.size(); ++u) {
    if (null == NullBuffers::kRefused && bufs[u] == nullptr && layout.units[u].numel > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("unit_params[", u, "] (", layout.units[u].name, ") is null"));
    }
  }
  return absl::OkStatus();
}

bool IsFloat(StDType d) { return d == StDType::kF32 || d == StDType::kF16 || d == StDType::kBF16; }

float ElementAsF32(const uint8_t* data, StDType dtype, int64_t i) {
  if (dtype == StDType::kF32) {
    float f;
    std::memcpy(&f, data + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, data + 2 * i, 2);
  return dtype == StDType::kF16 ? HalfToFloat(h) : Bf16ToFloat(h);
}

// One tensor of the file(s) an import reads.
struct SourceTensor {
  const SafetensorsFile* file = nullptr;
  const SafetensorsTensorInfo* info = nullptr;
};

// Index of the first element where two float tensors of equal numel differ as f32 bit
// patterns, or nullopt when they are equal.
std::optional<int64_t> FirstDifference(const SourceTensor& a, const SourceTensor& b) {
  const uint8_t* pa = a.file->Bytes(*a.info).data();
  const uint8_t* pb = b.file->Bytes(*b.info).data();
  const int64_t n = a.info->numel();
  for (int64_t i = 0; i < n; ++i) {
    if (FloatBits(ElementAsF32(pa, a.info->dtype, i)) !=
        FloatBits(ElementAsF32(pb, b.info->dtype, i))) {
      return i;
    }
  }
  return std::nullopt;
}

// Buffers other transformers versions saved next to the weights; they hold no parameters.
// GPT-2: h.{i}.attn.bias / h.{i}.attn.masked_bias; Llama: the rotary inv_freq of each layer.
bool IsSkippedBuffer(const ModelConfig& m, std::string_view name) {
  const bool gpt2 = m.family() == ModelConfig::GPT2;
  if (gpt2 && name.starts_with(kGpt2Prefix)) name.remove_prefix(kGpt2Prefix.size());
  const std::string_view layer_prefix = gpt2 ? "h." : "model.layers.";
  if (!name.starts_with(layer_prefix)) return false;
  name.remove_prefix(layer_prefix.size());
  int layer = -1;
  const auto [rest, ec] = std::from_chars(name.data(), name.data() + name.size(), layer);
  if (ec != std::errc() || layer < 0 || layer >= m.n_layer()) return false;
  const std::string_view suffix(rest, name.data() + name.size() - rest);
  if (gpt2) return suffix == ".attn.bias" || suffix == ".attn.masked_bias";
  return suffix == ".self_attn.rotary_emb.inv_freq";
}

void TransposeInto(const float* src, int64_t rows, int64_t cols, float* dst) {
  // src is (rows, cols), dst (cols, rows); tiles keep both sides in cache.
  constexpr int64_t kTile = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) dst[c * rows + r] = src[r * cols + c];
      }
    }
  }
}

// The safetensors files of `path`: the file itself, or a Hugging Face model directory's
// model.safetensors or index shards (see the header).
absl::StatusOr<std::vector<std::unique_ptr<SafetensorsFile>>> OpenWeights(const std::string& path) {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) {
    ZT_ASSIGN_OR_RETURN(files.emplace_back(), SafetensorsFile::Open(path));
    return files;
  }
  const std::filesystem::path dir(path);
  if (std::filesystem::exists(dir / kHfWeightsName, ec)) {
    ZT_ASSIGN_OR_RETURN(files.emplace_back(), SafetensorsFile::Open(dir / kHfWeightsName));
    return files;
  }
  const std::string index_path = (dir / kHfIndexName).string();
  if (!std::filesystem::exists(index_path, ec)) {
    return absl::NotFoundError(absl::StrCat(path, ": a Hugging Face model directory needs ",
                                            kHfWeightsName, " or ", kHfIndexName,
                                            "; it has neither"));
  }
  std::ifstream in(index_path);
  const nlohmann::json index = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return absl::DataLossError(
        absl::StrCat(index_path, ": not a JSON object with a \"weight_map\" object"));
  }
  // name -> file, as the index says, and the files in name order.
  std::map<std::string, std::string> weight_map;
  std::map<std::string, size_t> file_index;
  for (const auto& [name, file] : index["weight_map"].items()) {
    const std::string f = file.is_string() ? file.get<std::string>() : std::string();
    if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos) {
      return absl::DataLossError(absl::StrCat(index_path, ": weight_map[\"", name,
                                              "\"] must name a file of the directory, not ",
                                              file.dump()));
    }
    weight_map.emplace(name, f);
    file_index.emplace(f, 0);
  }
  for (auto& [f, i] : file_index) {
    i = files.size();
    ZT_ASSIGN_OR_RETURN(files.emplace_back(), SafetensorsFile::Open(dir / f));
  }
  for (const auto& [f, i] : file_index) {
    for (const SafetensorsTensorInfo& t : files[i]->tensors()) {
      const auto it = weight_map.find(t.name);
      if (it == weight_map.end() || it->second != f) {
        return absl::DataLossError(absl::StrCat(
            index_path, ": shard ", f, " holds tensor \"", t.name, "\", which the index ",
            it == weight_map.end() ? "does not list" : absl::StrCat("maps to ", it->second)));
      }
    }
  }
  for (const auto& [name, f] : weight_map) {
    if (files[file_index[f]]->Find(name) == nullptr) {
      return absl::DataLossError(absl::StrCat(index_path, ": maps tensor \"", name, "\" to ", f,
                                              ", which does not hold it"));
    }
  }
  return files;
}

}  // namespace

absl::Span<const float> HfOrder(const HfTensor& t, absl::Span<const float> unit_range,
                                std::vector<float>* scratch) {
  if (!t.transpose) return unit_range;
  // reserve() first: resize() alone may grow the capacity past the tensor.
  scratch->reserve(unit_range.size());
  scratch->resize(unit_range.size());
  // Ours is (out, in) = (shape[1], shape[0]); HF wants (in, out).
  TransposeInto(unit_range.data(), t.shape[1], t.shape[0], scratch->data());
  return *scratch;
}

std::string HfShardName(int index, int count) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", index, count);
}

namespace {

// The shortest decimal that reads back as `f`, as a double: 1e-5f gives 1e-05, not the
// 9.99999974738e-06 a plain widening would put into config.json.
double ShortestDouble(float f) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, f);
  double d = f;
  std::from_chars(buf, end, d);
  return d;
}

}  // namespace

absl::StatusOr<nlohmann::json> HuggingFaceConfig(const ModelConfig& m, DType dtype) {
  const char* torch_dtype = dtype == DType::kF32    ? "float32"
                            : dtype == DType::kBF16 ? "bfloat16"
                            : dtype == DType::kF16  ? "float16"
                                                    : nullptr;
  if (torch_dtype == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("export dtype ", std::string(DTypeName(dtype)),
                                                   " is not one of f32, f16, bf16"));
  }
  if (m.family() == ModelConfig::GPT2) {
    return nlohmann::json{{"architectures", {"GPT2LMHeadModel"}},
                          {"model_type", "gpt2"},
                          {"vocab_size", m.vocab_size()},
                          {"n_embd", m.d_model()},
                          {"n_layer", m.n_layer()},
                          {"n_head", m.n_head()},
                          {"n_inner", m.d_ff()},
                          {"n_positions", m.max_seq_len()},
                          {"n_ctx", m.max_seq_len()},
                          {"activation_function", "gelu_new"},
                          {"layer_norm_epsilon", ShortestDouble(m.norm_eps())},
                          {"tie_word_embeddings", m.tie_embeddings()},
                          {"torch_dtype", torch_dtype}};
  }
  if (m.family() == ModelConfig::LLAMA) {
    return nlohmann::json{{"architectures", {"LlamaForCausalLM"}},
                          {"model_type", "llama"},
                          {"vocab_size", m.vocab_size()},
                          {"hidden_size", m.d_model()},
                          {"intermediate_size", m.d_ff()},
                          {"num_hidden_layers", m.n_layer()},
                          {"num_attention_heads", m.n_head()},
                          {"num_key_value_heads", m.n_kv_head()},
                          {"max_position_embeddings", m.max_seq_len()},
                          {"hidden_act", "silu"},
                          {"rms_norm_eps", ShortestDouble(m.norm_eps())},
                          {"rope_theta", ShortestDouble(m.rope_theta())},
                          {"attention_bias", false},
                          {"tie_word_embeddings", m.tie_embeddings()},
                          {"torch_dtype", torch_dtype}};
  }
  return absl::InvalidArgumentError(
      "model.family must be GPT2 or LLAMA for a Hugging Face config.json");
}

namespace {

// The file(s) of an import matched against the name map: source[i] is table[i]'s tensor.
struct MatchedWeights {
  std::vector<HfTensor> table;
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::vector<SourceTensor> source;
};

// Opens `path` and checks every tensor against the config (the problems ImportHuggingFace's
// header lists, all at once), touching no destination.
absl::StatusOr<MatchedWeights> MatchHuggingFace(const std::string& path, const ModelConfig& config,
                                                const ModelLayout& layout) {
  ZT_ASSIGN_OR_RETURN(std::vector<HfTensor> table, HuggingFaceTensors(config, layout));
  ZT_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<SafetensorsFile>> files, OpenWeights(path));

  std::unordered_map<std::string_view, size_t> by_name;
  for (size_t i = 0; i < table.size(); ++i) by_name.emplace(table[i].name, i);
  const bool gpt2 = config.family() == ModelConfig::GPT2;
  const std::vector<int64_t> vc = {config.vocab_size(), config.d_model()};

  // matched: the file tensor that names table entry i; source: the same once its shape and
  // dtype are right.
  std::vector<SourceTensor> matched(table.size());
  std::vector<SourceTensor> source(table.size());
  SourceTensor tied_head;
  std::vector<std::string> problems;
  auto check_float = [&](const SafetensorsTensorInfo& t) {
    if (IsFloat(t.dtype)) return true;
    problems.push_back(absl::StrCat("tensor \"", t.name, "\" has dtype ", StDTypeName(t.dtype),
                                    "; expected F32, F16 or BF16"));
    return false;
  };
  for (const std::unique_ptr<SafetensorsFile>& file : files) {
    for (const SafetensorsTensorInfo& t : file->tensors()) {
      if (IsSkippedBuffer(config, t.name)) continue;
      auto it = by_name.find(t.name);
      if (it == by_name.end() && gpt2 && !t.name.starts_with(kGpt2Prefix) &&
          t.name != "lm_head.weight") {
        it = by_name.find(kGpt2PrefixStr + t.name);
      }
      if (it == by_name.end()) {
        if (config.tie_embeddings() && t.name == "lm_head.weight") {
          if (t.shape != vc) {
            problems.push_back(absl::StrCat("tensor \"lm_head.weight\" has shape ",
                                            ShapeString(t.shape), "; expected ", ShapeString(vc)));
          } else if (check_float(t)) {
            tied_head = {file.get(), &t};
          }
          continue;
        }
        problems.push_back(absl::StrCat("unknown tensor \"", t.name, "\" ", ShapeString(t.shape)));
        continue;
      }
      const HfTensor& want = table[it->second];
      if (matched[it->second].info != nullptr) {
        problems.push_back(absl::StrCat("tensor \"", want.name, "\" is given twice (as \"",
                                        matched[it->second].info->name, "\" and \"", t.name,
                                        "\")"));
        continue;
      }
      matched[it->second] = {file.get(), &t};
      if (t.shape != want.shape) {
        problems.push_back(absl::StrCat("tensor \"", t.name, "\" has shape ", ShapeString(t.shape),
                                        "; expected ", ShapeString(want.shape)));
        continue;
      }
      if (!check_float(t)) continue;
      source[it->second] = {file.get(), &t};
    }
  }
  for (size_t i = 0; i < table.size(); ++i) {
    // A tensor that was present with a wrong shape or dtype is already reported as such.
    if (matched[i].info == nullptr) {
      problems.push_back(absl::StrCat("missing tensor \"", table[i].name, "\" (expected shape ",
                                      ShapeString(table[i].shape), ")"));
    }
  }
  // Entry 0 is the token embedding in both families.
  if (tied_head.info != nullptr && source[0].info != nullptr) {
    if (const std::optional<int64_t> k = FirstDifference(source[0], tied_head)) {
      problems.push_back(absl::StrCat(
          "tensor \"lm_head.weight\" differs from \"", source[0].info->name,
          "\" (first at element ", *k,
          ") but model.tie_embeddings is true; untie the model to load a separate head"));
    }
  }
  if (!problems.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": does not match the ", FamilyName(config), " model config (n_layer ",
        config.n_layer(), ", d_model ", config.d_model(), ", n_head ", config.n_head(),
        ", n_kv_head ", config.n_kv_head(), ", d_ff ", config.d_ff(), ", vocab_size ",
        config.vocab_size(), ", tie_embeddings ", config.tie_embeddings() ? "true" : "false", "); ",
        problems.size(), " problem(s):\n  ", absl::StrJoin(problems, "\n  ")));
  }

  return MatchedWeights{std::move(table), std::move(files), std::move(source)};
}

}  // namespace

absl::Status ImportHuggingFace(const std::string& path, const ModelConfig& config,
                               const ModelLayout& layout, const std::vector<float*>& unit_params) {
  ZT_RETURN_IF_ERROR(CheckBuffers(layout, unit_params, NullBuffers::kSkipTheUnit));
  ZT_ASSIGN_OR_RETURN(const MatchedWeights matched, MatchHuggingFace(path, config, layout));
  const std::vector<HfTensor>& table = matched.table;
  const std::vector<SourceTensor>& source = matched.source;
  std::vector<float> scratch;
  for (size_t i = 0; i < table.size(); ++i) {
    const HfTensor& t = table[i];
    if (t.param->quantized) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": ", t.name,
          " goes to a quantized (NF4/INT8) weight, which ImportHuggingFace cannot fill; "
          "use StreamHuggingFace"));
    }
    if (unit_params[t.unit] == nullptr) continue;  // a unit the caller does not hold
    float* dst = unit_params[t.unit] + t.unit_begin();
    const int64_t n = t.numel();
    const SafetensorsFile& file = *source[i].file;
    // Copied out tensor by tensor; the mapped pages go once read, so the file's pages do not
    // add to the resident set beside the buffers.
    if (!t.transpose) {
      ZT_RETURN_IF_ERROR(file.ReadAsF32(*source[i].info, absl::MakeSpan(dst, n)));
      file.Release(*source[i].info);
      continue;
    }
    scratch.resize(n);
    ZT_RETURN_IF_ERROR(file.ReadAsF32(*source[i].info, absl::MakeSpan(scratch)));
    file.Release(*source[i].info);
    TransposeInto(scratch.data(), t.shape[0], t.shape[1], dst);
  }
  return absl::OkStatus();
}

absl::StatusOr<DType> HuggingFaceWeightsDType(const std::string& path, const ModelConfig& config,
                                              const ModelLayout& layout) {
  ZT_ASSIGN_OR_RETURN(const MatchedWeights matched, MatchHuggingFace(path, config, layout));
  for (size_t i = 0; i < matched.table.size(); ++i) {
    if (!matched.table[i].param->is_matrix) continue;
    switch (matched.source[i].info->dtype) {
      case StDType::kBF16:
        return DType::kBF16;
      case StDType::kF16:
        return DType::kF16;
      default:
        return DType::kF32;  // MatchHuggingFace admits float dtypes only
    }
  }
  return DType::kF32;
}

absl::Status StreamHuggingFace(const std::string& path, const ModelConfig& config,
                               const ModelLayout& layout, const HfTensorSink& sink,
                               int64_t piece_elements,
                               const std::function<bool(const HfTensor&)>& wanted) {
  ZT_ASSIGN_OR_RETURN(const MatchedWeights matched, MatchHuggingFace(path, config, layout));
  // A piece's f32 values (a transposed GPT-2 weight whole, with its transpose).
  std::vector<float> values, transposed;
  for (size_t i = 0; i < matched.table.size(); ++i) {
    const HfTensor& t = matched.table[i];
    if (wanted && !wanted(t)) continue;
    const SafetensorsFile& file = *matched.source[i].file;
    const SafetensorsTensorInfo& info = *matched.source[i].info;
    const absl::Span<const uint8_t> bytes = file.Bytes(info);
    const int64_t elem = StDTypeSize(info.dtype);
    const int64_t n = t.numel(), cols = t.shape.size() == 2 ? t.shape[1] : 1;
    // Whole rows of the HF tensor per piece (a transposed one is read whole: its rows are our
    // columns).
    const int64_t rows_per_piece =
        t.transpose ? t.shape[0] : std::max<int64_t>(1, piece_elements / cols);
    for (int64_t r0 = 0; r0 * cols < n; r0 += rows_per_piece) {
      const int64_t begin = r0 * cols, stop = std::min(n, (r0 + rows_per_piece) * cols);
      values.resize(stop - begin);
      const uint8_t* src = bytes.data() + begin * elem;
      for (int64_t k = 0; k < stop - begin; ++k) values[k] = ElementAsF32(src, info.dtype, k);
      // The mapped pages were copied out: drop them, or the resident set grows to the file.
      file.Release(bytes.subspan(begin * elem, (stop - begin) * elem));
      absl::Span<const float> ours = values;
      if (t.transpose) {
        transposed.resize(values.size());
        TransposeInto(values.data(), t.shape[0], t.shape[1], transposed.data());
        ours = transposed;
      }
      if (absl::Status s = sink(t, t.transpose ? 0 : r0, ours); !s.ok()) {
        return absl::Status(
            s.code(), absl::StrCat(file.path(), ": tensor \"", info.name, "\": ", s.message()));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ExportHuggingFace(const std::string& path, const ModelConfig& config,
                               const ModelLayout& layout,
                               const std::vector<const float*>& unit_params, DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": export dtype ", std::string(DTypeName(dtype)), " is not one of f32, f16, bf16"));
  }
  ZT_RETURN_IF_ERROR(CheckBuffers(layout, unit_params));
  ZT_ASSIGN_OR_RETURN(const std::vector<HfTensor> table, HuggingFaceTensors(config, layout));

  std::vector<SafetensorsTensorSpec> specs;
  specs.reserve(table.size());
  for (const HfTensor& t : table) specs.push_back({t.name, ToStDType(dtype), t.shape});
  ZT_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> writer,
                      SafetensorsWriter::Create(path, std::move(specs), {{"format", "pt"}}));

  std::vector<float> scratch;
  for (const HfTensor& t : table) {
    const absl::Span<const float> unit_range(unit_params[t.unit] + t.unit_begin(), t.numel());
    ZT_RETURN_IF_ERROR(writer->WriteF32(t.name, HfOrder(t, unit_range, &scratch)));
  }
  return writer->Finish();
}

}  // namespace zt
