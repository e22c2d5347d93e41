// worker/checkpoint/peft_adapter: the adapter directory PEFT reads — tensor names and shapes
// as get_peft_model_state_dict writes them, adapter_config.json's fields as PEFT's LoraConfig
// documents them — and a bit-exact round trip; a config that does not match the job is refused.
#include "worker/checkpoint/peft_adapter.h"

#include <filesystem>
#include <fstream>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/hf_interop.h"
#include "worker/checkpoint/safetensors.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAreArray;
using zerotrain::ModelConfig;

ModelConfig LoraModel(ModelConfig::Family family, std::vector<std::string> modules) {
  ModelConfig m;
  m.set_family(family);
  m.set_n_layer(2);
  m.set_n_head(4);
  m.set_n_kv_head(family == ModelConfig::GPT2 ? 4 : 2);
  m.set_d_model(32);
  m.set_d_ff(64);
  m.set_vocab_size(50);
  m.set_max_seq_len(16);
  m.set_tie_embeddings(family == ModelConfig::GPT2);
  m.set_base_dtype(ModelConfig::FP32);
  m.mutable_lora()->set_rank(4);
  m.mutable_lora()->set_alpha(16);
  m.mutable_lora()->set_dropout(0.05f);
  for (const std::string& s : modules) m.mutable_lora()->add_target_modules(s);
  return m;
}

struct Adapters {
  std::vector<std::vector<float>> storage;
  std::vector<Tensor> views;
};

Adapters MakeAdapters(const ModelLayout& layout, uint32_t seed) {
  Adapters a;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (const UnitLayout& u : layout.units) {
    a.storage.emplace_back(u.lora_numel);
    for (float& x : a.storage.back()) x = seed == 0 ? 0.0f : normal(rng);
  }
  for (auto& s : a.storage) {
    a.views.push_back(s.empty() ? Tensor()
                                : Tensor(s.data(), DType::kF32, {static_cast<int64_t>(s.size())}));
  }
  return a;
}

std::string TempDir(const std::string& name) {
  const std::string dir = std::string(::testing::TempDir()) + "/peft_" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(PeftAdapterTest, LlamaNamesShapesAndConfigArePefts) {
  const ModelConfig m = LoraModel(ModelConfig::LLAMA, {"q_proj", "v_proj", "down_proj"});
  const ModelLayout layout = BuildModelLayout(m);
  const Adapters a = MakeAdapters(layout, 1);
  const std::string dir = TempDir("llama");
  ASSERT_TRUE(WritePeftAdapter(m, layout, a.views, dir, {.base_model_name_or_path = "/base"}).ok());

  std::vector<std::string> want;
  for (int i = 0; i < 2; ++i) {
    for (const char* path : {"self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"}) {
      for (const char* ab : {"lora_A", "lora_B"}) {
        want.push_back(
            absl::StrCat("base_model.model.model.layers.", i, ".", path, ".", ab, ".weight"));
      }
    }
  }
  auto file = SafetensorsFile::Open(dir + "/adapter_model.safetensors").value();
  std::vector<std::string> names;
  for (const SafetensorsTensorInfo& t : file->tensors()) names.push_back(t.name);
  EXPECT_THAT(names, UnorderedElementsAreArray(want));
  // lora_A (r, in), lora_B (out, r): v_proj's out is n_kv_head · head size = 2 · 8.
  EXPECT_EQ(file->Find("base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight")->shape,
            (std::vector<int64_t>{4, 32}));
  EXPECT_EQ(file->Find("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight")->shape,
            (std::vector<int64_t>{16, 4}));
  EXPECT_EQ(file->Find("base_model.model.model.layers.0.mlp.down_proj.lora_A.weight")->shape,
            (std::vector<int64_t>{4, 64}));
  EXPECT_EQ(file->metadata().at("format"), "pt");

  std::ifstream in(dir + "/adapter_config.json");
  const nlohmann::json config = nlohmann::json::parse(in);
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["task_type"], "CAUSAL_LM");
  EXPECT_EQ(config["r"], 4);
  EXPECT_EQ(config["lora_alpha"], 16.0);
  EXPECT_NEAR(config["lora_dropout"].get<double>(), 0.05, 1e-7);  // the job's float, widened
  EXPECT_EQ(config["target_modules"], nlohmann::json({"q_proj", "v_proj", "down_proj"}));
  EXPECT_EQ(config["bias"], "none");
  EXPECT_EQ(config["fan_in_fan_out"], false);
  EXPECT_EQ(config["base_model_name_or_path"], "/base");
  EXPECT_EQ(config["use_rslora"], false);  // the scale is alpha / r, not alpha / sqrt(r)
}

TEST(PeftAdapterTest, GptTwoAdaptsBothCProjAndSaysFanInFanOut) {
  const ModelConfig m = LoraModel(ModelConfig::GPT2, {"c_attn", "c_proj"});
  const ModelLayout layout = BuildModelLayout(m);
  const Adapters a = MakeAdapters(layout, 2);
  const std::string dir = TempDir("gpt2");
  ASSERT_TRUE(WritePeftAdapter(m, layout, a.views, dir).ok());
  auto file = SafetensorsFile::Open(dir + "/adapter_model.safetensors").value();
  EXPECT_EQ(file->tensors().size(), 2u * 3u * 2u);  // 2 blocks × (c_attn, attn and mlp c_proj)
  EXPECT_NE(file->Find("base_model.model.transformer.h.0.attn.c_attn.lora_B.weight"), nullptr);
  EXPECT_EQ(file->Find("base_model.model.transformer.h.0.attn.c_attn.lora_B.weight")->shape,
            (std::vector<int64_t>{96, 4}));
  EXPECT_NE(file->Find("base_model.model.transformer.h.1.mlp.c_proj.lora_A.weight"), nullptr);
  EXPECT_EQ(file->Find("base_model.model.transformer.h.1.mlp.c_proj.lora_A.weight")->shape,
            (std::vector<int64_t>{4, 64}));
  std::ifstream in(dir + "/adapter_config.json");
  const nlohmann::json config = nlohmann::json::parse(in);
  EXPECT_EQ(config["fan_in_fan_out"], true);
  EXPECT_TRUE(config["base_model_name_or_path"].is_null());
}

TEST(PeftAdapterTest, ReadsBackBitForBit) {
  for (const ModelConfig::Family family : {ModelConfig::LLAMA, ModelConfig::GPT2}) {
    const ModelConfig m =
        LoraModel(family, family == ModelConfig::GPT2
                              ? std::vector<std::string>{"c_attn", "c_proj", "c_fc"}
                              : std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj",
                                                         "gate_proj", "up_proj", "down_proj"});
    const ModelLayout layout = BuildModelLayout(m);
    const Adapters written = MakeAdapters(layout, 3);
    const std::string dir = TempDir(absl::StrCat("round_trip_", family));
    ASSERT_TRUE(WritePeftAdapter(m, layout, written.views, dir).ok());
    Adapters read = MakeAdapters(layout, 0);
    const absl::Status s = ReadPeftAdapter(m, layout, dir, read.views);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(read.storage, written.storage) << family;
  }
}

TEST(PeftAdapterTest, AConfigOfAnotherAdapterIsRefusedNamingTheField) {
  const ModelConfig m = LoraModel(ModelConfig::LLAMA, {"q_proj", "v_proj"});
  const ModelLayout layout = BuildModelLayout(m);
  const std::string dir = TempDir("mismatch");
  ASSERT_TRUE(WritePeftAdapter(m, layout, MakeAdapters(layout, 4).views, dir).ok());

  ModelConfig other_rank = m;
  other_rank.mutable_lora()->set_rank(8);
  const ModelLayout other_layout = BuildModelLayout(other_rank);
  absl::Status s =
      ReadPeftAdapter(other_rank, other_layout, dir, MakeAdapters(other_layout, 0).views);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("adapter_config.json: r is 4 but the job's model.lora has "
                                     "rank 8"));

  ModelConfig other_targets = m;
  other_targets.mutable_lora()->add_target_modules("o_proj");
  const ModelLayout targets_layout = BuildModelLayout(other_targets);
  s = ReadPeftAdapter(other_targets, targets_layout, dir, MakeAdapters(targets_layout, 0).views);
  EXPECT_THAT(s.message(), HasSubstr("target_modules is [\"q_proj\",\"v_proj\"] but the job's "
                                     "model.lora has target_modules [q_proj, v_proj, o_proj]"));

  std::filesystem::remove(dir + "/adapter_model.safetensors");
  s = ReadPeftAdapter(m, layout, dir, MakeAdapters(layout, 0).views);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
}

// The merged export holds W + scale·B·A, checked element by element against a float64
// reference written here (not MergeLoraAdapters), through the HF importer.
TEST(PeftAdapterTest, MergedExportHoldsWPlusScaleBA) {
  const ModelConfig m = LoraModel(ModelConfig::LLAMA, {"k_proj", "up_proj"});
  const ModelLayout layout = BuildModelLayout(m);
  const Adapters a = MakeAdapters(layout, 5);
  std::vector<std::vector<float>> base(layout.units.size());
  std::vector<const float*> pointers;
  std::mt19937 rng(6);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (size_t u = 0; u < layout.units.size(); ++u) {
    base[u].resize(layout.units[u].numel);
    for (float& x : base[u]) x = normal(rng);
    pointers.push_back(base[u].data());
  }
  const std::string dir = TempDir("merged");
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(
      ExportMergedHuggingFace(dir + "/model.safetensors", m, layout, pointers, a.views, DType::kF32)
          .ok());

  ModelConfig plain = m;
  plain.clear_lora();
  plain.clear_base_dtype();
  const ModelLayout plain_layout = BuildModelLayout(plain);
  std::vector<std::vector<float>> read(layout.units.size());
  std::vector<float*> read_pointers;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    read[u].resize(plain_layout.units[u].numel);
    read_pointers.push_back(read[u].data());
  }
  ASSERT_TRUE(
      ImportHuggingFace(dir + "/model.safetensors", plain, plain_layout, read_pointers).ok());
  const double scale = 16.0 / 4.0;
  int changed = 0;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const UnitLayout& unit = layout.units[u];
    std::vector<double> want(base[u].begin(), base[u].end());
    for (const LoraSite& s : unit.lora) {
      const ParamSpec* w = unit.Find(s.weight);
      const float* A = a.storage[u].data() + s.a.offset;
      const float* B = a.storage[u].data() + s.b.offset;
      for (int64_t i = 0; i < s.rows; ++i) {
        for (int64_t j = 0; j < s.in; ++j) {
          double ba = 0;
          for (int64_t k = 0; k < 4; ++k) ba += double{B[i * 4 + k]} * A[k * s.in + j];
          want[w->offset + (s.row_begin + i) * s.in + j] += scale * ba;
        }
      }
    }
    for (size_t i = 0; i < want.size(); ++i) {
      // One f32 rounding of the float64 sum.
      ASSERT_NEAR(read[u][i], want[i], 1e-6 * std::abs(want[i]) + 1e-30)
          << unit.name << "[" << i << "]";
      changed += read[u][i] != base[u][i];
    }
  }
  EXPECT_GT(changed, 1000);  // the adapters moved k_proj's and up_proj's rows
}

}  // namespace
}  // namespace zt
