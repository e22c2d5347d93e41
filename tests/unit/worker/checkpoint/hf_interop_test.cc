#include "worker/checkpoint/hf_interop.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/worker/checkpoint/checkpoint_test_util.h"
#include "tests/unit/worker/checkpoint/hf_test_names.h"
#include "worker/checkpoint/safetensors.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using testing_util::Gpt2Sources;
using testing_util::HfOrderValues;
using testing_util::HfSource;
using testing_util::LlamaSources;
using testing_util::Numel;
using testing_util::RoundToSignificantBits;
using testing_util::ScratchDir;
using testing_util::TinyGpt2;
using testing_util::TinyLlama;
using testing_util::UnitBuffers;

// Element j of file tensor k: distinct across the file, and exact in f32 for k < 2^11 and
// j < 4096 ((k + 1) + j/4096 needs at most 12 + 12 significant bits).
float SyntheticValue(size_t k, int64_t j) {
  return static_cast<float>(k + 1) + static_cast<float>(j) / 4096.0f;
}

struct FileTensor {
  std::string name;
  StDType dtype = StDType::kF32;
  std::vector<int64_t> shape;
  std::vector<float> values;  // for float dtypes; integer ones are written as zeros
};

std::vector<FileTensor> SyntheticTensors(const std::vector<HfSource>& sources) {
  std::vector<FileTensor> t;
  for (size_t k = 0; k < sources.size(); ++k) {
    FileTensor& f = t.emplace_back();
    f.name = sources[k].name;
    f.shape = sources[k].shape;
    f.values.resize(Numel(f.shape));
    for (int64_t j = 0; j < Numel(f.shape); ++j) f.values[j] = SyntheticValue(k, j);
  }
  return t;
}

void WriteFile(const std::string& path, const std::vector<FileTensor>& tensors) {
  std::vector<SafetensorsTensorSpec> specs;
  for (const FileTensor& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  auto w = SafetensorsWriter::Create(path, specs);
  ASSERT_TRUE(w.ok()) << w.status();
  for (const FileTensor& t : tensors) {
    if (t.dtype == StDType::kF32 || t.dtype == StDType::kF16 || t.dtype == StDType::kBF16) {
      ASSERT_TRUE((*w)->WriteF32(t.name, t.values).ok());
    } else {
      const std::vector<uint8_t> zeros(Numel(t.shape) * StDTypeSize(t.dtype), 0);
      ASSERT_TRUE((*w)->Write(t.name, zeros).ok());
    }
  }
  ASSERT_TRUE((*w)->Finish().ok());
}

// Buffers filled with NaN, so a parameter the import leaves unwritten shows.
UnitBuffers NanBuffers(const ModelLayout& layout) {
  UnitBuffers b(layout, 0);
  for (auto& u : b.data) std::fill(u.begin(), u.end(), std::numeric_limits<float>::quiet_NaN());
  return b;
}

// Checks that every element of every source tensor landed where HfSource says, bit for bit
// (f32 to f32: nothing to round), and that no element was left unwritten.
void ExpectPlacedAsSourcesSay(const ModelLayout& layout, const std::vector<HfSource>& sources,
                              const UnitBuffers& got) {
  for (size_t k = 0; k < sources.size(); ++k) {
    const std::vector<double> placed = HfOrderValues(layout, sources[k], got.Const());
    for (size_t j = 0; j < placed.size(); ++j) {
      ASSERT_EQ(placed[j], SyntheticValue(k, static_cast<int64_t>(j)))
          << sources[k].name << " element " << j << " → " << sources[k].unit << " "
          << sources[k].param;
    }
  }
  for (size_t u = 0; u < got.data.size(); ++u) {
    for (size_t i = 0; i < got.data[u].size(); ++i) {
      ASSERT_FALSE(std::isnan(got.data[u][i])) << layout.units[u].name << " element " << i;
    }
  }
}

TEST(HfInteropTest, ImportsGpt2WithAndWithoutPrefixTransposingConv1D) {
  ScratchDir dir;
  for (const std::string prefix : {"transformer.", ""}) {
    SCOPED_TRACE("prefix \"" + prefix + "\"");
    const zerotrain::ModelConfig m = TinyGpt2(/*tied=*/false);
    const ModelLayout layout = BuildModelLayout(m);
    const std::vector<HfSource> sources = Gpt2Sources(m, prefix);
    std::vector<FileTensor> tensors = SyntheticTensors(sources);
    // Causal-mask buffers older GPT-2 files carry: accepted and skipped.
    const int64_t P = m.max_seq_len();
    tensors.push_back(
        {prefix + "h.0.attn.bias", StDType::kF32, {1, 1, P, P}, std::vector<float>(P * P, 1.0f)});
    tensors.push_back({prefix + "h.1.attn.masked_bias", StDType::kF32, {}, {-1e4f}});
    const std::string path = dir.Path("gpt2.safetensors");
    WriteFile(path, tensors);

    UnitBuffers got = NanBuffers(layout);
    const absl::Status s = ImportHuggingFace(path, m, layout, got.Mutable());
    ASSERT_TRUE(s.ok()) << s;
    ExpectPlacedAsSourcesSay(layout, sources, got);
  }
}

TEST(HfInteropTest, ImportsLlamaConcatenatingQkvAndGateUp) {
  ScratchDir dir;
  const zerotrain::ModelConfig m = TinyLlama(/*tied=*/false);
  const ModelLayout layout = BuildModelLayout(m);
  const std::vector<HfSource> sources = LlamaSources(m);
  std::vector<FileTensor> tensors = SyntheticTensors(sources);
  tensors.push_back(
      {"model.layers.1.self_attn.rotary_emb.inv_freq", StDType::kF32, {2}, {1.0f, 0.01f}});
  const std::string path = dir.Path("llama.safetensors");
  WriteFile(path, tensors);

  UnitBuffers got = NanBuffers(layout);
  const absl::Status s = ImportHuggingFace(path, m, layout, got.Mutable());
  ASSERT_TRUE(s.ok()) << s;
  ExpectPlacedAsSourcesSay(layout, sources, got);
}

// Export then import: every buffer comes back bit for bit, and the file holds exactly the
// names Hugging Face uses.
void ExpectRoundTrip(const zerotrain::ModelConfig& m, const std::vector<HfSource>& sources,
                     const std::string& path) {
  const ModelLayout layout = BuildModelLayout(m);
  const UnitBuffers original(layout, 1234);
  absl::Status s = ExportHuggingFace(path, m, layout, original.Const());
  ASSERT_TRUE(s.ok()) << s;

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  std::set<std::string> names, want;
  for (const SafetensorsTensorInfo& t : (*file)->tensors()) {
    names.insert(t.name);
    EXPECT_EQ(t.dtype, StDType::kF32) << t.name;
  }
  for (const HfSource& src : sources) {
    want.insert(src.name);
    const SafetensorsTensorInfo* t = (*file)->Find(src.name);
    ASSERT_NE(t, nullptr) << src.name;
    EXPECT_EQ(t->shape, src.shape) << src.name;
  }
  EXPECT_EQ(names, want);
  EXPECT_EQ((*file)->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));

  UnitBuffers back = NanBuffers(layout);
  s = ImportHuggingFace(path, m, layout, back.Mutable());
  ASSERT_TRUE(s.ok()) << s;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    ASSERT_EQ(std::memcmp(back.data[u].data(), original.data[u].data(),
                          original.data[u].size() * sizeof(float)),
              0)
        << layout.units[u].name;
  }
}

TEST(HfInteropTest, Gpt2TiedExportImportRoundTripsBitForBit) {
  ScratchDir dir;
  const zerotrain::ModelConfig m = TinyGpt2(/*tied=*/true);
  // As GPT2LMHeadModel saves it: "transformer." everywhere and no lm_head.weight.
  ExpectRoundTrip(m, Gpt2Sources(m, "transformer."), dir.Path("gpt2.safetensors"));
}

TEST(HfInteropTest, LlamaGqaUntiedExportImportRoundTripsBitForBit) {
  ScratchDir dir;
  const zerotrain::ModelConfig m = TinyLlama(/*tied=*/false);
  ExpectRoundTrip(m, LlamaSources(m), dir.Path("llama.safetensors"));
}

// A 16-bit export read back equals the float64 reference rounding of every parameter. Exact
// equality: round-to-nearest-even to 8 (bf16) or 11 (f16) significant bits has one answer, and
// the seeded values (|x| in [0.01, 2)) are normal numbers in both formats.
TEST(HfInteropTest, SixteenBitExportRoundsToNearestEven) {
  ScratchDir dir;
  struct Case {
    zerotrain::ModelConfig m;
    DType dtype;
    StDType file_dtype;
    int bits;
  };
  for (const Case& c : {Case{TinyLlama(false), DType::kBF16, StDType::kBF16, 8},
                        Case{TinyGpt2(true), DType::kF16, StDType::kF16, 11}}) {
    SCOPED_TRACE(StDTypeName(c.file_dtype));
    const ModelLayout layout = BuildModelLayout(c.m);
    const UnitBuffers original(layout, 99);
    const std::string path = dir.Path("half.safetensors");
    absl::Status s = ExportHuggingFace(path, c.m, layout, original.Const(), c.dtype);
    ASSERT_TRUE(s.ok()) << s;
    auto file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok());
    for (const SafetensorsTensorInfo& t : (*file)->tensors()) EXPECT_EQ(t.dtype, c.file_dtype);

    UnitBuffers back = NanBuffers(layout);
    s = ImportHuggingFace(path, c.m, layout, back.Mutable());
    ASSERT_TRUE(s.ok()) << s;
    for (size_t u = 0; u < layout.units.size(); ++u) {
      for (size_t i = 0; i < original.data[u].size(); ++i) {
        ASSERT_EQ(static_cast<double>(back.data[u][i]),
                  RoundToSignificantBits(original.data[u][i], c.bits))
            << layout.units[u].name << " element " << i;
      }
    }
  }
}

TEST(HfInteropTest, ReportsEveryUnknownMissingAndMismatchedTensorAtOnce) {
  ScratchDir dir;
  const zerotrain::ModelConfig m = TinyGpt2(/*tied=*/false);
  const ModelLayout layout = BuildModelLayout(m);
  std::vector<FileTensor> tensors = SyntheticTensors(Gpt2Sources(m, "transformer."));
  std::erase_if(tensors, [](const FileTensor& t) {
    return t.name == "transformer.ln_f.bias" || t.name == "lm_head.weight";
  });
  for (FileTensor& t : tensors) {
    if (t.name == "transformer.wpe.weight") {
      t.shape = {m.max_seq_len() + 1, m.d_model()};
      t.values.resize(Numel(t.shape), 0.5f);
    }
    if (t.name == "transformer.h.1.ln_2.bias") t.dtype = StDType::kI32;
  }
  tensors.push_back({"transformer.h.0.attn.extra", StDType::kF32, {3}, {1, 2, 3}});
  tensors.push_back({"h.2.mlp.c_fc.weight", StDType::kF32, {1}, {0}});  // block 2 of 2
  tensors.push_back({"h.0.ln_1.weight", StDType::kF32, {16}, std::vector<float>(16, 1.0f)});
  const std::string path = dir.Path("bad.safetensors");
  WriteFile(path, tensors);

  UnitBuffers buffers(layout, 7);
  const UnitBuffers before = buffers;
  const absl::Status s = ImportHuggingFace(path, m, layout, buffers.Mutable());
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  const std::string msg(s.message());
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("7 problem(s)"));
  EXPECT_THAT(msg, HasSubstr("unknown tensor \"transformer.h.0.attn.extra\" [3]"));
  EXPECT_THAT(msg, HasSubstr("unknown tensor \"h.2.mlp.c_fc.weight\" [1]"));
  EXPECT_THAT(msg, HasSubstr("missing tensor \"transformer.ln_f.bias\" (expected shape [16])"));
  EXPECT_THAT(msg, HasSubstr("missing tensor \"lm_head.weight\" (expected shape [11, 16])"));
  EXPECT_THAT(msg, HasSubstr("\"transformer.wpe.weight\" has shape [8, 16]; expected [7, 16]"));
  EXPECT_THAT(msg, HasSubstr("\"transformer.h.1.ln_2.bias\" has dtype I32"));
  EXPECT_THAT(msg, HasSubstr("\"transformer.h.0.ln_1.weight\" is given twice"));
  // A failed import leaves the buffers as they were.
  EXPECT_EQ(buffers.data, before.data);
}

TEST(HfInteropTest, TiedModelAcceptsHeadEqualToEmbeddingOnly) {
  ScratchDir dir;
  const zerotrain::ModelConfig m = TinyGpt2(/*tied=*/true);
  const ModelLayout layout = BuildModelLayout(m);
  const std::vector<HfSource> sources = Gpt2Sources(m, "transformer.");
  std::vector<FileTensor> tensors = SyntheticTensors(sources);
  FileTensor head = tensors[0];
  head.name = "lm_head.weight";
  tensors.push_back(head);
  const std::string path = dir.Path("tied.safetensors");
  WriteFile(path, tensors);
  UnitBuffers got = NanBuffers(layout);
  absl::Status s = ImportHuggingFace(path, m, layout, got.Mutable());
  ASSERT_TRUE(s.ok()) << s;
  ExpectPlacedAsSourcesSay(layout, sources, got);

  tensors.back().values[5] += 1.0f;
  WriteFile(path, tensors);
  s = ImportHuggingFace(path, m, layout, got.Mutable());
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("\"lm_head.weight\" differs from \"transformer.wte.weight\""
                                     " (first at element 5)"));
  EXPECT_THAT(s.message(), HasSubstr("tie_embeddings"));
}

TEST(HfInteropTest, RejectsBadArguments) {
  ScratchDir dir;
  const zerotrain::ModelConfig m = TinyLlama(/*tied=*/true);
  const ModelLayout layout = BuildModelLayout(m);
  UnitBuffers b(layout, 3);
  const std::string path = dir.Path("x.safetensors");

  absl::Status s = ExportHuggingFace(path, m, layout, b.Const(), DType::kI32);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("i32"));

  std::vector<const float*> short_list = b.Const();
  short_list.pop_back();
  s = ExportHuggingFace(path, m, layout, short_list);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("unit_params"));

  // A layout built from another config is refused before any byte is touched.
  const ModelLayout other = BuildModelLayout(TinyLlama(/*tied=*/false));
  s = ExportHuggingFace(path, m, other, UnitBuffers(other, 3).Const());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);

  zerotrain::ModelConfig unspecified = m;
  unspecified.set_family(zerotrain::ModelConfig::FAMILY_UNSPECIFIED);
  s = ExportHuggingFace(path, unspecified, layout, b.Const());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model.family"));
  EXPECT_FALSE(std::filesystem::exists(path));

  s = ImportHuggingFace(dir.Path("absent.safetensors"), m, layout, b.Mutable());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
}

// The exported name map is the one the tests write out independently: same names, shapes and
// order, and each entry's unit range holds exactly the values HfSource places there. HfOrder
// must give the file's row-major order, compared exactly (a transpose copies, never rounds).
TEST(HfInteropTest, TensorListMatchesTheIndependentNameMap) {
  for (const bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "Llama" : "GPT-2");
    const zerotrain::ModelConfig m = llama ? TinyLlama(/*tied=*/false) : TinyGpt2(/*tied=*/true);
    const ModelLayout layout = BuildModelLayout(m);
    const std::vector<HfSource> sources = llama ? LlamaSources(m) : Gpt2Sources(m, "transformer.");
    auto table = HuggingFaceTensors(m, layout);
    ASSERT_TRUE(table.ok()) << table.status();
    ASSERT_EQ(table->size(), sources.size());
    const UnitBuffers values(layout, 77);
    std::vector<float> scratch;
    for (size_t k = 0; k < sources.size(); ++k) {
      const HfTensor& t = (*table)[k];
      EXPECT_EQ(t.name, sources[k].name);
      EXPECT_EQ(t.shape, sources[k].shape) << t.name;
      EXPECT_EQ(layout.units[t.unit].name, sources[k].unit) << t.name;
      EXPECT_EQ(t.transpose, sources[k].transposed) << t.name;
      ASSERT_EQ(t.numel(), Numel(sources[k].shape)) << t.name;
      const absl::Span<const float> range(values.Const()[t.unit] + t.unit_begin(), t.numel());
      const absl::Span<const float> ordered = HfOrder(t, range, &scratch);
      const std::vector<double> want = HfOrderValues(layout, sources[k], values.Const());
      ASSERT_EQ(ordered.size(), want.size()) << t.name;
      for (size_t j = 0; j < want.size(); ++j) {
        ASSERT_EQ(ordered[j], want[j]) << t.name << " element " << j;
      }
    }
  }
}

TEST(HfInteropTest, ConfigJsonHasTheFieldsTransformersReads) {
  zerotrain::ModelConfig g = TinyGpt2(/*tied=*/true);
  g.set_norm_eps(1e-5f);
  auto gpt2 = HuggingFaceConfig(g, DType::kBF16);
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  EXPECT_EQ((*gpt2)["model_type"], "gpt2");
  EXPECT_EQ((*gpt2)["architectures"], nlohmann::json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ((*gpt2)["vocab_size"], g.vocab_size());
  EXPECT_EQ((*gpt2)["n_embd"], g.d_model());
  EXPECT_EQ((*gpt2)["n_layer"], g.n_layer());
  EXPECT_EQ((*gpt2)["n_head"], g.n_head());
  EXPECT_EQ((*gpt2)["n_inner"], g.d_ff());
  EXPECT_EQ((*gpt2)["n_positions"], g.max_seq_len());
  EXPECT_EQ((*gpt2)["tie_word_embeddings"], true);
  EXPECT_EQ((*gpt2)["torch_dtype"], "bfloat16");
  // The float's shortest decimal, as a person would write it in config.json: 1e-5, not the
  // 9.99999974737875e-06 that widening the f32 gives.
  EXPECT_EQ((*gpt2)["layer_norm_epsilon"].get<double>(), 1e-5);

  zerotrain::ModelConfig l = TinyLlama(/*tied=*/false);
  l.set_norm_eps(1e-5f);
  l.set_rope_theta(500000.0f);
  auto llama = HuggingFaceConfig(l, DType::kF32);
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ((*llama)["model_type"], "llama");
  EXPECT_EQ((*llama)["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ((*llama)["hidden_size"], l.d_model());
  EXPECT_EQ((*llama)["intermediate_size"], l.d_ff());
  EXPECT_EQ((*llama)["num_hidden_layers"], l.n_layer());
  EXPECT_EQ((*llama)["num_attention_heads"], l.n_head());
  EXPECT_EQ((*llama)["num_key_value_heads"], l.n_kv_head());
  EXPECT_EQ((*llama)["max_position_embeddings"], l.max_seq_len());
  EXPECT_EQ((*llama)["rms_norm_eps"].get<double>(), 1e-5);
  EXPECT_EQ((*llama)["rope_theta"].get<double>(), 500000.0);
  EXPECT_EQ((*llama)["tie_word_embeddings"], false);
  EXPECT_EQ((*llama)["torch_dtype"], "float32");

  EXPECT_EQ(HuggingFaceConfig(l, DType::kI32).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HfShardName(2, 13), "model-00002-of-00013.safetensors");
}

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// A Hugging Face model directory imports like the single file: from model.safetensors, or
// from the shards an index lists (here split unevenly and in reverse file order, so nothing
// depends on the order of the shards or of tensors within them).
TEST(HfInteropTest, ImportsModelDirectoriesSingleAndSharded) {
  ScratchDir dir;
  const zerotrain::ModelConfig m = TinyLlama(/*tied=*/false);
  const ModelLayout layout = BuildModelLayout(m);
  const std::vector<HfSource> sources = LlamaSources(m);
  const std::vector<FileTensor> tensors = SyntheticTensors(sources);

  std::filesystem::create_directories(dir.Path("single"));
  WriteFile(dir.Path("single/model.safetensors"), tensors);
  UnitBuffers got = NanBuffers(layout);
  absl::Status s = ImportHuggingFace(dir.Path("single"), m, layout, got.Mutable());
  ASSERT_TRUE(s.ok()) << s;
  ExpectPlacedAsSourcesSay(layout, sources, got);

  std::filesystem::create_directories(dir.Path("sharded"));
  const std::vector<FileTensor> first(tensors.begin(), tensors.begin() + 3);
  const std::vector<FileTensor> second(tensors.begin() + 3, tensors.end());
  WriteFile(dir.Path("sharded/model-00002-of-00002.safetensors"), first);
  WriteFile(dir.Path("sharded/model-00001-of-00002.safetensors"), second);
  nlohmann::json weight_map;
  for (const FileTensor& t : first) weight_map[t.name] = "model-00002-of-00002.safetensors";
  for (const FileTensor& t : second) weight_map[t.name] = "model-00001-of-00002.safetensors";
  const nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
  WriteText(dir.Path("sharded/model.safetensors.index.json"), index.dump());
  got = NanBuffers(layout);
  s = ImportHuggingFace(dir.Path("sharded"), m, layout, got.Mutable());
  ASSERT_TRUE(s.ok()) << s;
  ExpectPlacedAsSourcesSay(layout, sources, got);
}

// StreamHuggingFace hands over pieces of whole rows that, placed where the sink is told
// (rows [t.row_offset + row, …) of t.param), give what ImportHuggingFace writes: a sharded
// Llama directory cut into pieces of 100 elements (so every tensor comes in several), and a
// GPT-2 file whose Conv1D weights arrive whole and transposed.
TEST(HfInteropTest, StreamsPiecesThatPlaceLikeTheImport) {
  ScratchDir dir;
  struct Case {
    zerotrain::ModelConfig m;
    std::vector<HfSource> sources;
    std::string path;
  };
  std::vector<Case> cases;
  {
    const zerotrain::ModelConfig m = TinyLlama(/*tied=*/false);
    const std::vector<HfSource> sources = LlamaSources(m);
    const std::vector<FileTensor> tensors = SyntheticTensors(sources);
    std::filesystem::create_directories(dir.Path("sharded"));
    const std::vector<FileTensor> first(tensors.begin(), tensors.begin() + 4);
    const std::vector<FileTensor> second(tensors.begin() + 4, tensors.end());
    WriteFile(dir.Path("sharded/model-00001-of-00002.safetensors"), first);
    WriteFile(dir.Path("sharded/model-00002-of-00002.safetensors"), second);
    nlohmann::json weight_map;
    for (const FileTensor& t : first) weight_map[t.name] = "model-00001-of-00002.safetensors";
    for (const FileTensor& t : second) weight_map[t.name] = "model-00002-of-00002.safetensors";
    WriteText(dir.Path("sharded/model.safetensors.index.json"),
              nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump());
    cases.push_back({m, sources, dir.Path("sharded")});
  }
  {
    const zerotrain::ModelConfig m = TinyGpt2(/*tied=*/false);
    const std::vector<HfSource> sources = Gpt2Sources(m, "transformer.");
    WriteFile(dir.Path("gpt2.safetensors"), SyntheticTensors(sources));
    cases.push_back({m, sources, dir.Path("gpt2.safetensors")});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path);
    const ModelLayout layout = BuildModelLayout(c.m);
    UnitBuffers got = NanBuffers(layout);
    int pieces = 0, tensors = 0;
    std::string last;
    const absl::Status s = StreamHuggingFace(
        c.path, c.m, layout,
        [&](const HfTensor& t, int64_t row, absl::Span<const float> values) {
          const int64_t cols = t.param->shape.size() < 2 ? 1 : t.param->numel / t.param->shape[0];
          EXPECT_EQ(values.size() % cols, 0u) << t.name << ": a piece of whole rows";
          if (t.transpose) {
            EXPECT_EQ(row, 0) << t.name;
            EXPECT_EQ(static_cast<int64_t>(values.size()), t.numel()) << t.name << ": whole";
          } else {
            EXPECT_LE(static_cast<int64_t>(values.size()), std::max<int64_t>(100, cols)) << t.name;
          }
          std::copy(values.begin(), values.end(),
                    got.data[t.unit].begin() + t.unit_begin() + row * cols);
          ++pieces;
          tensors += t.name != last;
          last = t.name;
          return absl::OkStatus();
        },
        /*piece_elements=*/100);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(tensors, static_cast<int>(c.sources.size()));
    EXPECT_GT(pieces, tensors);  // the 100-element pieces cut the larger tensors
    ExpectPlacedAsSourcesSay(layout, c.sources, got);
  }
  // The sink's error stops the stream, with its code, the file and the tensor named.
  const ModelLayout layout = BuildModelLayout(cases[1].m);
  const absl::Status s = StreamHuggingFace(
      cases[1].path, cases[1].m, layout, [](const HfTensor& t, int64_t, absl::Span<const float>) {
        return t.name == "transformer.h.1.mlp.c_fc.weight"
                   ? absl::InvalidArgumentError("value 3 is not finite")
                   : absl::OkStatus();
      });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr(cases[1].path + ": tensor \"transformer.h.1.mlp.c_fc.weight\": "
                                        "value 3 is not finite"));
  // With `wanted`, only the wanted tensors (a pipeline stage's units: here unit 1's) reach the
  // sink, each whole, and the file is still checked whole first.
  std::vector<std::string> seen, want;
  const absl::StatusOr<std::vector<HfTensor>> table = HuggingFaceTensors(cases[1].m, layout);
  ASSERT_TRUE(table.ok()) << table.status();
  for (const HfTensor& t : *table) {
    if (t.unit == 1) want.push_back(t.name);
  }
  ASSERT_FALSE(want.empty());
  const auto only_unit_one = [](const HfTensor& t) { return t.unit == 1; };
  const absl::Status filtered = StreamHuggingFace(
      cases[1].path, cases[1].m, layout,
      [&](const HfTensor& t, int64_t, absl::Span<const float>) {
        if (seen.empty() || seen.back() != t.name) seen.push_back(t.name);
        return absl::OkStatus();
      },
      kHfStreamPieceElements, only_unit_one);
  ASSERT_TRUE(filtered.ok()) << filtered;
  EXPECT_EQ(seen, want);
  zerotrain::ModelConfig other = cases[1].m;
  other.set_n_layer(other.n_layer() + 1);  // a block the file does not have
  const absl::Status unchecked = StreamHuggingFace(
      cases[1].path, other, BuildModelLayout(other),
      [](const HfTensor&, int64_t, absl::Span<const float>) { return absl::OkStatus(); },
      kHfStreamPieceElements, only_unit_one);
  EXPECT_FALSE(unchecked.ok()) << "a missing tensor of an unwanted unit is still an error";
}

TEST(HfInteropTest, ModelDirectoryErrorsNameTheDirectoryOrIndex) {
  ScratchDir dir;
  const zerotrain::ModelConfig m = TinyLlama(/*tied=*/false);
  const ModelLayout layout = BuildModelLayout(m);
  const std::vector<FileTensor> tensors = SyntheticTensors(LlamaSources(m));
  UnitBuffers got = NanBuffers(layout);

  std::filesystem::create_directories(dir.Path("empty"));
  absl::Status s = ImportHuggingFace(dir.Path("empty"), m, layout, got.Mutable());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr(dir.Path("empty")));
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors.index.json"));

  std::filesystem::create_directories(dir.Path("d"));
  WriteFile(dir.Path("d/a.safetensors"), tensors);
  const std::string index = dir.Path("d/model.safetensors.index.json");
  nlohmann::json weight_map;
  for (const FileTensor& t : tensors) weight_map[t.name] = "a.safetensors";
  struct Case {
    std::string what;
    nlohmann::json index;
    std::string message;
  };
  nlohmann::json unlisted = weight_map;
  unlisted.erase("model.norm.weight");
  nlohmann::json escaping = weight_map;
  escaping["model.norm.weight"] = "../a.safetensors";
  nlohmann::json extra = weight_map;
  extra["model.extra.weight"] = "a.safetensors";
  const std::vector<Case> cases = {
      {"no weight_map", {{"metadata", {}}}, "weight_map"},
      {"a tensor the index does not list",
       {{"weight_map", unlisted}},
       "holds tensor \"model.norm.weight\", which the index does not list"},
      {"a file outside the directory", {{"weight_map", escaping}}, "../a.safetensors"},
      {"a tensor its file lacks",
       {{"weight_map", extra}},
       "maps tensor \"model.extra.weight\" to a.safetensors, which does not hold it"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    WriteText(index, c.index.dump());
    s = ImportHuggingFace(dir.Path("d"), m, layout, got.Mutable());
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(s.message(), HasSubstr(index));
    EXPECT_THAT(s.message(), HasSubstr(c.message));
  }
  WriteText(index, "{not json");
  s = ImportHuggingFace(dir.Path("d"), m, layout, got.Mutable());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(index));
}

}  // namespace
}  // namespace zt
