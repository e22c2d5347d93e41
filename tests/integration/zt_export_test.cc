// `zt export CHECKPOINT --out DIR`: a sharded checkpoint written out as a Hugging Face model
// directory equals, bit for bit, what `zt train --export` writes from the same weights in the
// trainer's memory; split by --max-shard-bytes it carries a correct index; model.init_from
// reads the directory back bit for bit; a corrupt rank file is refused by name. Values are
// compared as bytes: both sides are fp32 copies of the same fp32 numbers, so there is no
// rounding to allow for.
#include <sys/wait.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/scratch_dir_test.h"
#include "tests/integration/zt_process.h"
#include "worker/checkpoint/hf_interop.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/checkpoint/checkpoint_export.h"
#include "worker/data/token_shard.h"
#include "worker/model/param_layout.h"

namespace zt {
namespace {

using ::testing::HasSubstr;

using testing::RunResult;

RunResult RunZt(const std::string& args) { return testing::RunZtCommand(args); }

std::string ReadBytes(const std::string& path) { return testing::ReadText(path); }

// Every tensor of a safetensors file or model directory: name -> (dtype, shape, bytes).
struct TensorBytes {
  StDType dtype;
  std::vector<int64_t> shape;
  std::string bytes;
  bool operator==(const TensorBytes&) const = default;
};
using TensorMap = std::map<std::string, TensorBytes>;

void AddTensors(const std::string& path, TensorMap* out) {
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  for (const SafetensorsTensorInfo& t : (*file)->tensors()) {
    const absl::Span<const uint8_t> b = (*file)->Bytes(t);
    ASSERT_TRUE(
        out->emplace(t.name, TensorBytes{t.dtype, t.shape, std::string(b.begin(), b.end())}).second)
        << t.name << " appears twice";
  }
}

// A GPT-2 (tied) or Llama (untied, 4 query heads sharing 2 key/value heads) job of 10 steps
// on two ranks, checkpointed every 5 steps.
struct JobCase {
  std::string family;
  std::string parallel;
  std::string precision;
};
const JobCase kGpt2Stage3 = {"GPT2", "  world_size: 2\n  zero_stage: 3\n", ""};
// bf16 parameters keep fp32 master weights: the export reads those, as `--export` does.
const JobCase kLlamaGqaBf16Stage2 = {"LLAMA", "  world_size: 2\n  zero_stage: 2\n",
                                     "precision: {param_dtype: BF16}\n"};
// Split master weights: the fp32 weights are joined from the bf16 parameters and the saved
// low halves, sharded under stage 3 — both exports must see the same fp32 numbers.
const JobCase kGpt2SplitMasterStage3 = {
    "GPT2", "  world_size: 2\n  zero_stage: 3\n",
    "precision: {param_dtype: BF16, split_master_weights: true}\n"};

// The d_ff the job's defaults gave, as the exported config.json records it.
int HfConfigDff(const std::string& dir) {
  return nlohmann::json::parse(ReadBytes(dir + "/config.json"))["intermediate_size"].get<int>();
}

class ZtExportTest : public testing::ScratchDirTest {
 protected:
  ZtExportTest() : ScratchDirTest("zt-export-test") {}

  // Writes job file `name`; `checkpoint_dir` empty: no checkpoints.
  std::string WriteJob(const std::string& name, const JobCase& c, const std::string& checkpoint_dir,
                       const std::string& init_from = "") {
    std::ofstream f(Path(name));
    f << "name: export-test\n"
         "model:\n"
         "  family: "
      << c.family
      << "\n"
         "  n_layer: 2\n"
         "  n_head: 4\n"
      << (c.family == "LLAMA" ? "  n_kv_head: 2\n" : "")
      << "  d_model: 16\n"
         "  vocab_size: 64\n"
         "  max_seq_len: 16\n";
    if (!init_from.empty()) f << "  init_from: " << init_from << "\n";
    f << "data:\n  train: [" << Path("train.bin")
      << "]\n  seq_len: 16\n"
         "train:\n  micro_batch_size: 2\n  max_steps: 10\n"
         "optimizer:\n  lr: 0.01\n"
         "parallel:\n"
      << c.parallel << c.precision;
    if (!checkpoint_dir.empty()) {
      f << "checkpoint:\n  dir: " << checkpoint_dir << "\n  interval_steps: 5\n";
    }
    return Path(name);
  }

  // Trains `c` for 10 steps into checkpoint directory "ckpt", exporting the final weights in
  // process to A/w.safetensors.
  void TrainWithCheckpoints(const JobCase& c) {
    std::filesystem::create_directories(Path("A"));
    const RunResult r =
        RunZt("train " + WriteJob("job.yaml", c, Path("ckpt")) + " --quiet --run-dir " +
              Path("run") + " --export " + Path("A/w.safetensors"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }

  // zt export of the checkpoint equals the in-process export; the model directory imports
  // (model.init_from) and re-exports bit for bit.
  void ExpectExportMatchesAndRoundTrips(const JobCase& c) {
    ASSERT_NO_FATAL_FAILURE(TrainWithCheckpoints(c));
    RunResult r = RunZt("export " + Path("ckpt") + " --format hf --out " + Path("B"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // The same writer, the same tensors in the same order: the files are equal byte for byte.
    EXPECT_EQ(ReadBytes(Path("B/model.safetensors")), ReadBytes(Path("A/w.safetensors")));
    EXPECT_FALSE(std::filesystem::exists(Path("B/model.safetensors.index.json")));

    r = RunZt("train " + WriteJob("import.yaml", c, "", Path("B")) + " --quiet --steps 0 " +
              "--run-dir " + Path("run2") + " --export " + Path("C.safetensors"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(ReadBytes(Path("C.safetensors")), ReadBytes(Path("B/model.safetensors")));
  }
};

// A LoRA job (docs/lora.md): `zt export` of its checkpoint writes the PEFT adapter directory,
// the same tensors `zt train --export` wrote from the trainer's memory; --merge-adapters
// writes a plain Hugging Face model that differs from the base exactly in the adapted weights;
// --merge-adapters on a checkpoint without adapters is refused by name.
TEST_F(ZtExportTest, LoraCheckpointExportsThePeftAdaptersOrTheMergedModel) {
  const JobCase c = {"LLAMA", "  world_size: 2\n  zero_stage: 1\n", ""};
  const std::string job = WriteJob("lora.yaml", c, Path("ckpt"));
  {
    // The model section gets adapters on q_proj and v_proj (PEFT's Llama default).
    std::string text = ReadBytes(job);
    text.replace(text.find("  max_seq_len: 16\n"), 18,
                 "  max_seq_len: 16\n  lora: {rank: 4, alpha: 8}\n");
    std::ofstream(job, std::ios::trunc) << text;
  }
  RunResult r =
      RunZt("train " + job + " --quiet --run-dir " + Path("run") + " --export " + Path("A"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = RunZt("export " + Path("ckpt") + " --out " + Path("B") + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  TensorMap a, b;
  ASSERT_NO_FATAL_FAILURE(AddTensors(Path("A/adapter_model.safetensors"), &a));
  ASSERT_NO_FATAL_FAILURE(AddTensors(Path("B/adapter_model.safetensors"), &b));
  EXPECT_EQ(a.size(), 2u * 2u * 2u);  // 2 layers × q, v × A, B
  EXPECT_EQ(a, b);
  EXPECT_TRUE(a.count("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"));
  const nlohmann::json config = nlohmann::json::parse(ReadBytes(Path("B/adapter_config.json")));
  EXPECT_EQ(config["r"], 4);
  EXPECT_EQ(config["peft_type"], "LORA");

  r = RunZt("export " + Path("ckpt") + " --merge-adapters --out " + Path("M") + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  TensorMap merged;
  ASSERT_NO_FATAL_FAILURE(AddTensors(Path("M/model.safetensors"), &merged));
  EXPECT_TRUE(merged.count("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_EQ(merged.count("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"), 0u);
  const nlohmann::json hf = nlohmann::json::parse(ReadBytes(Path("M/config.json")));
  EXPECT_EQ(hf["model_type"], "llama");

  // A checkpoint without adapters has nothing to merge.
  std::filesystem::remove_all(Path("ckpt"));
  ASSERT_NO_FATAL_FAILURE(TrainWithCheckpoints(kGpt2Stage3));
  r = RunZt("export " + Path("ckpt") + " --merge-adapters --out " + Path("N"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--merge-adapters"));
}

TEST_F(ZtExportTest, Gpt2StageThreeExportEqualsInProcessExportAndRoundTrips) {
  ExpectExportMatchesAndRoundTrips(kGpt2Stage3);

  // config.json describes the tensors: its dimensions are the weights' shapes.
  const nlohmann::json config = nlohmann::json::parse(ReadBytes(Path("B/config.json")));
  EXPECT_EQ(config["model_type"], "gpt2");
  EXPECT_EQ(config["architectures"], nlohmann::json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(config["torch_dtype"], "float32");
  EXPECT_EQ(config["tie_word_embeddings"], true);
  EXPECT_EQ(config["n_layer"], 2);
  EXPECT_EQ(config["n_head"], 4);
  TensorMap b;
  ASSERT_NO_FATAL_FAILURE(AddTensors(Path("B/model.safetensors"), &b));
  const int64_t V = config["vocab_size"], C = config["n_embd"], P = config["n_positions"],
                F = config["n_inner"];
  EXPECT_EQ(b["transformer.wte.weight"].shape, (std::vector<int64_t>{V, C}));
  EXPECT_EQ(b["transformer.wpe.weight"].shape, (std::vector<int64_t>{P, C}));
  EXPECT_EQ(b["transformer.h.1.mlp.c_fc.weight"].shape, (std::vector<int64_t>{C, F}));
  EXPECT_EQ(b["transformer.h.1.attn.c_attn.weight"].shape, (std::vector<int64_t>{C, 3 * C}));
  EXPECT_EQ(b.count("lm_head.weight"), 0u);
  EXPECT_EQ(b.size(), 2 + 12 * 2 + 2u);
}

TEST_F(ZtExportTest, LlamaGqaUntiedBf16ExportReadsMasterWeightsAndRoundTrips) {
  ExpectExportMatchesAndRoundTrips(kLlamaGqaBf16Stage2);
  const nlohmann::json config = nlohmann::json::parse(ReadBytes(Path("B/config.json")));
  EXPECT_EQ(config["model_type"], "llama");
  EXPECT_EQ(config["num_attention_heads"], 4);
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["tie_word_embeddings"], false);
  TensorMap b;
  ASSERT_NO_FATAL_FAILURE(AddTensors(Path("B/model.safetensors"), &b));
  const int64_t C = config["hidden_size"], V = config["vocab_size"];
  const int64_t D = C / config["num_attention_heads"].get<int64_t>();
  EXPECT_EQ(b["model.layers.0.self_attn.k_proj.weight"].shape,
            (std::vector<int64_t>{config["num_key_value_heads"].get<int64_t>() * D, C}));
  EXPECT_EQ(b["lm_head.weight"].shape, (std::vector<int64_t>{V, C}));
}

TEST_F(ZtExportTest, SplitMasterStageThreeExportJoinsTheHalvesAndRoundTrips) {
  ExpectExportMatchesAndRoundTrips(kGpt2SplitMasterStage3);
  // The joined fp32 weights carry low bits a bf16 value lacks: the export read the low
  // halves, not only the bf16 parameters.
  TensorMap b;
  ASSERT_NO_FATAL_FAILURE(AddTensors(Path("B/model.safetensors"), &b));
  const std::string& bytes = b.at("transformer.h.0.mlp.c_fc.weight").bytes;
  std::vector<uint32_t> bits(bytes.size() / 4);
  std::memcpy(bits.data(), bytes.data(), bits.size() * 4);
  EXPECT_TRUE(std::any_of(bits.begin(), bits.end(), [](uint32_t v) { return (v & 0xffff) != 0; }));
}

TEST_F(ZtExportTest, SplitsIntoShardsWithACorrectIndexThatImports) {
  ASSERT_NO_FATAL_FAILURE(TrainWithCheckpoints(kLlamaGqaBf16Stage2));
  // 3000 bytes: more than the smallest tensors (64-byte norms), less than the embedding
  // (64 × 16 × 4 = 4096 bytes), so files hold several tensors and some tensor is alone.
  constexpr int64_t kMaxShard = 3000;
  RunResult r = RunZt("export " + Path("ckpt") + " --out " + Path("S") + " --max-shard-bytes " +
                      std::to_string(kMaxShard));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  TensorMap whole;
  ASSERT_NO_FATAL_FAILURE(AddTensors(Path("A/w.safetensors"), &whole));

  const nlohmann::json index =
      nlohmann::json::parse(ReadBytes(Path("S/model.safetensors.index.json")));
  const nlohmann::json& weight_map = index["weight_map"];
  std::set<std::string> files;
  for (const auto& [name, file] : weight_map.items()) files.insert(file.get<std::string>());
  ASSERT_GT(files.size(), 2u);
  TensorMap sharded;
  int64_t total = 0;
  int n = 1;
  for (const std::string& file : files) {
    EXPECT_EQ(file, HfShardName(n++, static_cast<int>(files.size())));
    TensorMap in_file;
    ASSERT_NO_FATAL_FAILURE(AddTensors(Path("S/" + file), &in_file));
    int64_t bytes = 0;
    for (const auto& [name, t] : in_file) {
      EXPECT_EQ(weight_map[name], file) << name;
      bytes += static_cast<int64_t>(t.bytes.size());
      sharded.emplace(name, t);
    }
    EXPECT_TRUE(bytes <= kMaxShard || in_file.size() == 1) << file << " holds " << bytes;
    total += bytes;
  }
  EXPECT_EQ(sharded, whole);
  EXPECT_EQ(weight_map.size(), whole.size());
  EXPECT_EQ(index["metadata"]["total_size"], total);
  EXPECT_FALSE(std::filesystem::exists(Path("S/model.safetensors")));

  // The shards import to the same weights as the single file, bit for bit.
  zerotrain::ModelConfig m;
  m.set_family(zerotrain::ModelConfig::LLAMA);
  m.set_n_layer(2);
  m.set_n_head(4);
  m.set_n_kv_head(2);
  m.set_d_model(16);
  m.set_d_ff(HfConfigDff(Path("S")));
  m.set_vocab_size(64);
  m.set_max_seq_len(16);
  m.set_tie_embeddings(false);
  const ModelLayout layout = BuildModelLayout(m);
  std::vector<std::vector<float>> from_shards, from_file;
  std::vector<float*> shard_units, file_units;
  for (const UnitLayout& u : layout.units) {
    shard_units.push_back(from_shards.emplace_back(u.numel, -1.0f).data());
    file_units.push_back(from_file.emplace_back(u.numel, -2.0f).data());
  }
  absl::Status s = ImportHuggingFace(Path("S"), m, layout, shard_units);
  ASSERT_TRUE(s.ok()) << s;
  s = ImportHuggingFace(Path("A/w.safetensors"), m, layout, file_units);
  ASSERT_TRUE(s.ok()) << s;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    EXPECT_EQ(0, std::memcmp(from_shards[u].data(), from_file[u].data(),
                             from_file[u].size() * sizeof(float)))
        << layout.units[u].name;
  }

  // The shards import (model.init_from) to the same weights.
  r = RunZt("train " + WriteJob("import.yaml", kLlamaGqaBf16Stage2, "", Path("S")) +
            " --quiet --steps 0 --run-dir " + Path("run2") + " --export " + Path("C.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ReadBytes(Path("C.safetensors")), ReadBytes(Path("A/w.safetensors")));
}

// A step directory exports that step: here step 5, which a run stopped after 5 steps of the
// same schedule holds in memory.
TEST_F(ZtExportTest, StepDirectoryExportsThatStep) {
  ASSERT_NO_FATAL_FAILURE(TrainWithCheckpoints(kGpt2Stage3));
  RunResult r = RunZt("train " + WriteJob("five.yaml", kGpt2Stage3, "") + " --quiet --steps 5" +
                      " --run-dir " + Path("run5") + " --export " + Path("five.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = RunZt("export " + Path("ckpt/step-00000005") + " --out " + Path("B5") + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ReadBytes(Path("B5/model.safetensors")), ReadBytes(Path("five.safetensors")));
  EXPECT_NE(ReadBytes(Path("B5/model.safetensors")), ReadBytes(Path("A/w.safetensors")));
}

TEST_F(ZtExportTest, CorruptRankFileIsRefusedByName) {
  ASSERT_NO_FATAL_FAILURE(TrainWithCheckpoints(kGpt2Stage3));
  const std::string rank1 = Path("ckpt/step-00000010/rank-00001.safetensors");
  std::string bytes = ReadBytes(rank1);
  ASSERT_GT(bytes.size(), 100u);
  bytes[bytes.size() - 7] ^= 0x10;
  std::ofstream(rank1, std::ios::binary | std::ios::trunc) << bytes;
  const RunResult r = RunZt("export " + Path("ckpt") + " --out " + Path("B"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("rank-00001.safetensors"));
  EXPECT_THAT(r.output, HasSubstr("checksum"));
  EXPECT_FALSE(std::filesystem::exists(Path("B/config.json")));
  EXPECT_FALSE(std::filesystem::exists(Path("B/model.safetensors")));
}

TEST_F(ZtExportTest, RefusesBadFlagsAndAnEarlierExport) {
  ASSERT_NO_FATAL_FAILURE(TrainWithCheckpoints(kGpt2Stage3));
  RunResult r = RunZt("export " + Path("ckpt") + " --out " + Path("B") + " --dtype fp8");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--dtype"));
  r = RunZt("export " + Path("ckpt") + " --out " + Path("B") + " --format gguf");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--format"));
  r = RunZt("export " + Path("nowhere") + " --out " + Path("B"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr(Path("nowhere")));
  r = RunZt("export " + Path("ckpt") + " --out " + Path("B") + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = RunZt("export " + Path("ckpt") + " --out " + Path("B") + " --max-shard-bytes 1000");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("already holds an export"));
}

// The exporter streams: one ReadUnitRange per Hugging Face tensor, of exactly that tensor's
// range, and it never holds more than two tensors' worth of f32 (the read and its transpose).
TEST_F(ZtExportTest, ReadsOneTensorRangeAtATime) {
  ASSERT_NO_FATAL_FAILURE(TrainWithCheckpoints(kGpt2Stage3));
  std::vector<std::pair<std::string, int64_t>> reads;
  CheckpointExportOptions options;
  options.dtype = DType::kBF16;
  options.on_read = [&](const HfTensor& t, int64_t begin, int64_t end) {
    reads.emplace_back(t.name, end - begin);
  };
  auto result = ExportCheckpoint(Path("ckpt"), Path("B"), options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->step, 10);

  auto file = SafetensorsFile::Open(Path("B/model.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(reads.size(), (*file)->tensors().size());
  int64_t largest = 0, model = 0;
  for (size_t i = 0; i < reads.size(); ++i) {
    const SafetensorsTensorInfo& t = (*file)->tensors()[i];
    EXPECT_EQ(reads[i].first, t.name);
    EXPECT_EQ(reads[i].second, t.numel()) << t.name;
    EXPECT_EQ(t.dtype, StDType::kBF16) << t.name;
    largest = std::max(largest, t.numel());
    model += t.numel();
  }
  EXPECT_LE(result->peak_buffer_floats, 2 * largest);
  EXPECT_LT(result->peak_buffer_floats, model);
}

}  // namespace
}  // namespace zt
