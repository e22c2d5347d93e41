// model.lora and model.base_dtype: PEFT's defaults, one named line per broken rule, and the
// engine-support lines for what does not run yet.
#include "worker/job/lora_validation.h"

#include <limits>
#include <string>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/job/test_jobs.h"
#include "worker/job/job_validation.h"

namespace zt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using zerotrain::JobSpec;
using zerotrain::ModelConfig;

constexpr char kLlamaLora[] = R"(
name: lora
model: {family: LLAMA, n_layer: 2, n_head: 4, d_model: 64, vocab_size: 256, max_seq_len: 64,
        lora: {}}
data: {train: [train.bin], seq_len: 32}
train: {micro_batch_size: 2, max_steps: 5}
optimizer: {lr: 1.0e-3}
)";

TEST(LoraDefaultsTest, ArePeftsForEachFamily) {
  const JobSpec llama = testing::JobWithDefaults(kLlamaLora);
  EXPECT_EQ(llama.model().lora().rank(), 8);
  EXPECT_EQ(llama.model().lora().alpha(), 8.0f);
  EXPECT_EQ(llama.model().lora().dropout(), 0.0f);
  EXPECT_THAT(llama.model().lora().target_modules(), ElementsAre("q_proj", "v_proj"));
  EXPECT_EQ(llama.model().base_dtype(), ModelConfig::FP32);
  EXPECT_TRUE(ValidateJobSpec(llama).ok()) << ValidateJobSpec(llama);

  JobSpec gpt2 = testing::JobWithDefaults(testing::kMinimalYaml);
  gpt2.mutable_model()->mutable_lora();
  gpt2.mutable_precision()->set_param_dtype(zerotrain::PrecisionConfig::BF16);
  ApplyLoraDefaults(&gpt2);
  EXPECT_THAT(gpt2.model().lora().target_modules(), ElementsAre("c_attn"));
  EXPECT_EQ(gpt2.model().base_dtype(), ModelConfig::BF16);  // follows param_dtype

  // Without model.lora nothing is filled in: base_dtype stays unset.
  EXPECT_EQ(testing::JobWithDefaults(testing::kMinimalYaml).model().base_dtype(),
            ModelConfig::BASE_DTYPE_UNSPECIFIED);
}

struct LoraCase {
  const char* label;
  void (*mutate)(JobSpec&);
  const char* line;
};

TEST(LoraViolationsTest, EachRuleNamesTheFieldTheValueAndTheRule) {
  const LoraCase cases[] = {
      {"rank", [](JobSpec& s) { s.mutable_model()->mutable_lora()->set_rank(0); },
       "model.lora.rank: must be >= 1 (got 0)"},
      {"alpha", [](JobSpec& s) { s.mutable_model()->mutable_lora()->set_alpha(-2); },
       "model.lora.alpha: must be a finite number > 0 (got -2)"},
      {"dropout", [](JobSpec& s) { s.mutable_model()->mutable_lora()->set_dropout(1.0f); },
       "model.lora.dropout: must be in [0, 1) (got 1)"},
      {"unknown module",
       [](JobSpec& s) { s.mutable_model()->mutable_lora()->add_target_modules("c_attn"); },
       "model.lora.target_modules[2]: 'c_attn' is not a LLAMA module; the adaptable ones are "
       "q_proj k_proj v_proj o_proj gate_proj up_proj down_proj"},
      {"twice", [](JobSpec& s) { s.mutable_model()->mutable_lora()->add_target_modules("q_proj"); },
       "model.lora.target_modules[2]: 'q_proj' is listed twice (first at [0]); each module "
       "takes one adapter"},
      {"rank above the matrix",
       [](JobSpec& s) {
         s.mutable_model()->mutable_lora()->set_rank(65);
         s.mutable_model()->mutable_lora()->clear_target_modules();
         s.mutable_model()->mutable_lora()->add_target_modules("o_proj");
       },
       "model.lora.rank: 65 exceeds 64, the smaller side of o_proj's matrix; a LoRA rank must be "
       "at most it"},
      {"int8 threshold zero",
       [](JobSpec& s) {
         s.mutable_model()->set_base_dtype(ModelConfig::INT8);
         s.mutable_model()->set_int8_threshold(0.0f);
       },
       "model.int8_threshold: must be > 0 (got 0; Infinity turns the outlier decomposition "
       "off)"},
      {"int8 threshold negative",
       [](JobSpec& s) {
         s.mutable_model()->set_base_dtype(ModelConfig::INT8);
         s.mutable_model()->set_int8_threshold(-6.0f);
       },
       "model.int8_threshold: must be > 0 (got -6; Infinity turns the outlier decomposition "
       "off)"},
      {"int8 threshold with another base",
       [](JobSpec& s) {
         s.mutable_model()->set_base_dtype(ModelConfig::NF4);
         s.mutable_model()->set_int8_threshold(4.0f);
       },
       "model.int8_threshold: 4 is LLM.int8()'s outlier threshold and applies to "
       "model.base_dtype INT8 only (got base_dtype NF4)"},
      {"int8 base without lora",
       [](JobSpec& s) {
         s.mutable_model()->clear_lora();
         s.mutable_model()->set_base_dtype(ModelConfig::INT8);
       },
       "model.base_dtype: INT8 describes the frozen base of a LoRA job and needs model.lora; "
       "without it every weight trains and precision.param_dtype stores them (a quantized base "
       "has no gradient or optimizer state)"},
      {"quantized base without lora",
       [](JobSpec& s) {
         s.mutable_model()->clear_lora();
         s.mutable_model()->set_base_dtype(ModelConfig::NF4);
       },
       "model.base_dtype: NF4 describes the frozen base of a LoRA job and needs model.lora; "
       "without it every weight trains and precision.param_dtype stores them (a quantized base "
       "has no gradient or optimizer state)"},
  };
  for (const LoraCase& c : cases) {
    JobSpec spec = testing::JobWithDefaults(kLlamaLora);
    c.mutate(spec);
    EXPECT_THAT(LoraViolations(spec), ElementsAre(c.line)) << c.label;
    const absl::Status status = ValidateJobSpec(spec);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.label;
    EXPECT_THAT(status.message(), HasSubstr(c.line)) << c.label;
  }
}

TEST(LoraViolationsTest, GptTwoModulesAreItsOwn) {
  JobSpec spec = testing::JobWithDefaults(testing::kMinimalYaml);
  spec.mutable_model()->mutable_lora()->add_target_modules("q_proj");
  ApplyLoraDefaults(&spec);
  EXPECT_THAT(LoraViolations(spec),
              ElementsAre("model.lora.target_modules[0]: 'q_proj' is not a GPT2 module; the "
                          "adaptable ones are c_attn c_proj c_fc"));
  spec.mutable_model()->mutable_lora()->set_target_modules(0, "c_proj");
  EXPECT_THAT(LoraViolations(spec), ::testing::IsEmpty());
}

TEST(LoraEngineSupportTest, RunsAdaptersOverAnFp32Nf4OrInt8BaseAtEveryStage) {
  for (const auto base :
       {ModelConfig::FP32, ModelConfig::BF16, ModelConfig::NF4, ModelConfig::INT8}) {
    for (int stage : {0, 1, 2, 3}) {
      JobSpec spec = testing::JobWithDefaults(kLlamaLora);
      spec.mutable_model()->set_base_dtype(base);
      if (base == ModelConfig::BF16) {
        spec.mutable_precision()->set_param_dtype(zerotrain::PrecisionConfig::BF16);
      }
      spec.mutable_model()->mutable_lora()->set_init_from("adapter");
      spec.mutable_parallel()->set_zero_stage(stage);
      EXPECT_TRUE(CheckEngineSupport(spec).ok()) << ModelConfig::BaseDType_Name(base) << " stage "
                                                 << stage << ": " << CheckEngineSupport(spec);
    }
  }
}

TEST(LoraEngineSupportTest, NamesEachPartThatDoesNotRunYet) {
  JobSpec spec = testing::JobWithDefaults(kLlamaLora);
  spec.mutable_resources()->set_device(zerotrain::ResourceConfig::CUDA);
  spec.mutable_model()->set_base_dtype(ModelConfig::NF4);
  spec.mutable_model()->set_init_from("hf-model");
  // An NF4 base, seeded or from model.init_from, is quantized on the host and uploaded
  // (docs/lora.md, "LoRA on CUDA ranks"): no line names it or the adapters.
  for (const std::string& line : testing::Lines(CheckEngineSupport(spec))) {
    EXPECT_FALSE(line.starts_with("model.base_dtype: NF4")) << line;
    EXPECT_FALSE(absl::StrContains(line, "model.lora")) << line;
  }
  spec.mutable_resources()->set_device(zerotrain::ResourceConfig::CPU);
  EXPECT_TRUE(CheckEngineSupport(spec).ok()) << CheckEngineSupport(spec);
  spec.mutable_resources()->set_device(zerotrain::ResourceConfig::CUDA);
  spec.mutable_model()->set_base_dtype(ModelConfig::BF16);  // param_dtype is FP32
  EXPECT_TRUE(absl::StrContains(CheckEngineSupport(spec).message(),
                                "model.base_dtype: BF16 differs from precision.param_dtype FP32"))
      << CheckEngineSupport(spec);
  // INT8 runs now (kernels/int8_linear.h in the model): no line names it.
  spec.mutable_model()->set_base_dtype(ModelConfig::INT8);
  for (const std::string& line : testing::Lines(CheckEngineSupport(spec))) {
    EXPECT_FALSE(line.starts_with("model.base_dtype: INT8")) << line;
  }
  spec.mutable_resources()->set_device(zerotrain::ResourceConfig::CPU);
  EXPECT_TRUE(CheckEngineSupport(spec).ok()) << CheckEngineSupport(spec);
}

// CUDA ranks train LoRA over an unquantized or NF4 base, on tensor-parallel ranks and pipeline
// stages too (the adapters staged on the host and uploaded, lora_separate_memory_test.cc and
// lora_parallel_separate_memory_test.cc); what they do not yet do is named.
TEST(LoraEngineSupportTest, CudaRanksTrainAdaptersOverAnUnquantizedBase) {
  JobSpec spec = testing::JobWithDefaults(kLlamaLora);
  spec.mutable_resources()->set_device(zerotrain::ResourceConfig::CUDA);
  for (const int stage : {0, 1, 2, 3}) {
    spec.mutable_parallel()->set_zero_stage(stage);
    for (const std::string& line : testing::Lines(CheckEngineSupport(spec))) {
      EXPECT_FALSE(absl::StrContains(line, "model.lora")) << "stage " << stage << ": " << line;
    }
  }
  const auto names = [](const JobSpec& s, const std::string& what) {
    for (const std::string& line : testing::Lines(CheckEngineSupport(s))) {
      if (line.starts_with("resources.device: CUDA with model.lora") &&
          absl::StrContains(line, what)) {
        return true;
      }
    }
    return false;
  };
  JobSpec int8 = spec;
  int8.mutable_model()->set_base_dtype(ModelConfig::INT8);
  EXPECT_TRUE(names(int8, "model.base_dtype INT8")) << CheckEngineSupport(int8);
  // QLoRA: an NF4 base at every stage (quantized on the host and uploaded).
  JobSpec nf4 = spec;
  nf4.mutable_model()->set_base_dtype(ModelConfig::NF4);
  for (const int stage : {0, 1, 2, 3}) {
    nf4.mutable_parallel()->set_zero_stage(stage);
    EXPECT_FALSE(names(nf4, "")) << "stage " << stage << ": " << CheckEngineSupport(nf4);
  }
  // Tensor-parallel ranks and pipeline stages train their adapters on CUDA ranks too.
  JobSpec tp = nf4;
  tp.mutable_parallel()->set_zero_stage(1);
  tp.mutable_parallel()->set_world_size(4);
  tp.mutable_parallel()->set_tensor_parallel(2);
  tp.mutable_parallel()->set_pipeline_parallel(2);
  EXPECT_FALSE(names(tp, "")) << CheckEngineSupport(tp);
  // The adapters' states and the base's shards offloaded, on CUDA ranks too.
  JobSpec offloaded = nf4;
  offloaded.mutable_parallel()->set_zero_stage(3);
  offloaded.mutable_offload()->set_optimizer(zerotrain::OffloadConfig::CPU);
  offloaded.mutable_offload()->set_params(zerotrain::OffloadConfig::CPU);
  EXPECT_FALSE(names(offloaded, "")) << CheckEngineSupport(offloaded);
}

// The threshold is filled in for an INT8 base only (the paper's 6.0), kept when given.
TEST(LoraDefaultsTest, Int8ThresholdDefaultsToTheLlmInt8Papers) {
  JobSpec spec = testing::JobWithDefaults(kLlamaLora);
  EXPECT_FALSE(spec.model().has_int8_threshold());
  spec.mutable_model()->set_base_dtype(ModelConfig::INT8);
  ApplyLoraDefaults(&spec);
  EXPECT_EQ(spec.model().int8_threshold(), 6.0f);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  spec.mutable_model()->set_int8_threshold(std::numeric_limits<float>::infinity());
  ApplyLoraDefaults(&spec);
  EXPECT_EQ(spec.model().int8_threshold(), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);  // +inf: decomposition off
}

// Tensor parallelism trains adapters split as their base weights (f32, KV heads split or
// replicated, dropout, sequence parallelism, Adafactor, init_from), over a seeded NF4 base of
// block-aligned shares or an INT8 base too; each other case is named.
// NVMe optimizer offload swaps the adapters' states (lora_offload_training_test.cc).
TEST(LoraEngineSupportTest, NamesTensorParallelismAndNvmeOffloadWithAdapters) {
  JobSpec spec = testing::JobWithDefaults(kLlamaLora);
  spec.mutable_model()->set_n_kv_head(2);
  spec.mutable_parallel()->set_world_size(2);
  spec.mutable_parallel()->set_tensor_parallel(2);
  EXPECT_TRUE(CheckEngineSupport(spec).ok()) << CheckEngineSupport(spec);
  // Replicated KV heads' adapters (LoraParallelTrainingTest.ReplicatedKvHeadsAdaptersMatchOneRank).
  spec.mutable_parallel()->set_world_size(4);
  spec.mutable_parallel()->set_tensor_parallel(4);
  EXPECT_TRUE(CheckEngineSupport(spec).ok()) << CheckEngineSupport(spec);
  spec.mutable_parallel()->set_world_size(2);
  spec.mutable_parallel()->set_tensor_parallel(2);
  // Dropout draws by logical index
  // (LoraParallelTrainingTest.TensorParallelDropoutMasksAreOneRanks).
  spec.mutable_model()->mutable_lora()->set_dropout(0.1f);
  EXPECT_TRUE(CheckEngineSupport(spec).ok()) << CheckEngineSupport(spec);
  spec.mutable_model()->mutable_lora()->set_dropout(0.0f);
  // Adafactor over adapter shares (LoraParallelTrainingTest.TensorParallelAdafactorMatchesOneRank).
  spec.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAFACTOR);
  EXPECT_TRUE(CheckEngineSupport(spec).ok()) << CheckEngineSupport(spec);
  spec.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAMW);
  // Sequence parallelism (LoraParallelTrainingTest.SequenceParallelAdaptersMatchOneRank).
  spec.mutable_parallel()->set_sequence_parallel(true);
  EXPECT_TRUE(CheckEngineSupport(spec).ok()) << CheckEngineSupport(spec);
  spec.mutable_parallel()->set_sequence_parallel(false);
  // A base and adapters from files, each rank keeping its shares
  // (LoraParallelTrainingTest.InitFromFilesStartTensorParallelRanksWhereOneRankStarts).
  spec.mutable_model()->set_init_from("/models/base.safetensors");
  spec.mutable_model()->mutable_lora()->set_init_from("/adapters/peft");
  EXPECT_TRUE(CheckEngineSupport(spec).ok()) << CheckEngineSupport(spec);
  spec.mutable_model()->clear_init_from();
  spec.mutable_model()->mutable_lora()->clear_init_from();
  // An NF4 or INT8 base: each rank quantizes the whole weight and keeps its share
  // (LoraParallelTrainingTest.QloraBaseOnTensorParallelRanksIsOneRanksSlice). NF4 only where
  // each share holds whole 64-element blocks: d_model 64 leaves a row-parallel share 32 columns.
  spec.mutable_model()->set_base_dtype(ModelConfig::NF4);
  EXPECT_THAT(CheckEngineSupport(spec).message(),
              HasSubstr("parallel.tensor_parallel: 2 with model.lora trains over an NF4 base only "
                        "when model.d_model (64) and model.d_ff"));
  spec.mutable_model()->set_d_model(128);
  spec.mutable_model()->set_d_ff(256);
  EXPECT_TRUE(CheckEngineSupport(spec).ok()) << CheckEngineSupport(spec);
  spec.mutable_model()->set_d_ff(192);  // 96 columns a share: one block and a half
  EXPECT_THAT(CheckEngineSupport(spec).message(), HasSubstr("model.d_ff (192)"));
  spec.mutable_model()->set_d_model(64);
  spec.mutable_model()->set_base_dtype(ModelConfig::INT8);  // per-row scales slice exactly
  EXPECT_TRUE(CheckEngineSupport(spec).ok()) << CheckEngineSupport(spec);
  // Streamed from model.init_from: each rank reads the whole weights and keeps its shares
  // (LoraParallelTrainingTest.QloraBaseFromInitFromOnTensorParallelRanksIsOneRanksSlice).
  spec.mutable_model()->set_init_from("/models/base.safetensors");
  EXPECT_TRUE(CheckEngineSupport(spec).ok()) << CheckEngineSupport(spec);
  spec = testing::JobWithDefaults(kLlamaLora);
  spec.mutable_offload()->set_optimizer(zerotrain::OffloadConfig::NVME);
  spec.mutable_offload()->set_buffer_count(4);
  spec.mutable_parallel()->set_zero_stage(1);
  EXPECT_TRUE(CheckEngineSupport(spec).ok()) << CheckEngineSupport(spec);
}

// Pipeline stages train their own blocks' adapters (lora_parallel_training_test.cc): a LoRA
// job on PP2 (and PP2 × DP2 at ZeRO-1) passes, with no line naming model.lora.
TEST(LoraEngineSupportTest, AcceptsPipelineStages) {
  JobSpec spec = testing::JobWithDefaults(kLlamaLora);
  spec.mutable_parallel()->set_world_size(2);
  spec.mutable_parallel()->set_pipeline_parallel(2);
  spec.mutable_parallel()->set_micro_batches(2);
  spec.mutable_train()->set_grad_accum_steps(2);
  EXPECT_TRUE(CheckEngineSupport(spec).ok()) << CheckEngineSupport(spec);
  spec.mutable_parallel()->set_world_size(4);
  spec.mutable_parallel()->set_zero_stage(1);
  EXPECT_TRUE(CheckEngineSupport(spec).ok()) << CheckEngineSupport(spec);
  // A quantized base streamed from model.init_from into each stage's own units
  // (LoraParallelTrainingTest.QloraStagesStreamTheirOwnUnitsAsOneRankBitForBit), NF4 and INT8.
  for (const auto base : {ModelConfig::NF4, ModelConfig::INT8}) {
    spec.mutable_model()->set_base_dtype(base);
    spec.mutable_model()->set_init_from("base.safetensors");
    EXPECT_TRUE(CheckEngineSupport(spec).ok()) << CheckEngineSupport(spec);
  }
  // ... swapped to NVMe too (LoraOffloadTrainingTest.
  // StreamedQuantizedBaseSwappedIsTheDevicePathBitForBit).
  spec.mutable_offload()->set_params(zerotrain::OffloadConfig::NVME);
  spec.mutable_offload()->set_optimizer(zerotrain::OffloadConfig::NVME);
  spec.mutable_offload()->set_nvme_path("/tmp");
  EXPECT_TRUE(CheckEngineSupport(spec).ok()) << CheckEngineSupport(spec);
  spec.mutable_offload()->Clear();
  // ZeRO-3 stages: the base gathered for the step or per use, fp32 or NF4 (seeded).
  spec.mutable_model()->clear_init_from();
  spec.mutable_parallel()->set_zero_stage(3);
  for (const auto base : {ModelConfig::BASE_DTYPE_UNSPECIFIED, ModelConfig::NF4}) {
    spec.mutable_model()->set_base_dtype(base);
    for (const bool reshard : {false, true}) {
      spec.mutable_parallel()->set_reshard_after_forward(reshard);
      EXPECT_TRUE(CheckEngineSupport(spec).ok()) << reshard << ": " << CheckEngineSupport(spec);
    }
  }
}

}  // namespace
}  // namespace zt
