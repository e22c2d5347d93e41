// Tests of worker/job/parallel_validation.h (through ValidateJobSpec, which includes it), the
// parallel defaults of ApplyJobDefaults, and the layout lines of CheckEngineSupport.
#include "worker/job/parallel_validation.h"

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/job/test_jobs.h"
#include "worker/job/job_defaults.h"
#include "worker/job/job_validation.h"

namespace zt {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using zerotrain::JobSpec;
using zerotrain::ParallelConfig;

// GPT-2-like: 12 heads, d_ff 3072, 4 blocks (6 units).
constexpr char kGpt2Yaml[] = R"(
name: layout
model: {family: GPT2, n_layer: 4, n_head: 12, d_model: 768, vocab_size: 256, max_seq_len: 64}
data: {train: [train.bin], seq_len: 32}
train: {micro_batch_size: 2, max_steps: 5}
optimizer: {lr: 1.0e-3}
)";

// Llama-like with grouped KV heads: 8 query heads, 2 KV heads, 8 blocks.
constexpr char kLlamaYaml[] = R"(
name: layout-gqa
model: {family: LLAMA, n_layer: 8, n_head: 8, n_kv_head: 2, d_model: 256, d_ff: 768,
        vocab_size: 256, max_seq_len: 64}
data: {train: [train.bin], seq_len: 32}
train: {micro_batch_size: 2, max_steps: 5}
optimizer: {lr: 1.0e-3}
)";

JobSpec With(const char* base, const std::string& parallel, const std::string& train = "") {
  std::string yaml = base;
  yaml += "parallel: {" + parallel + "}\n";
  if (!train.empty()) {
    // Replaces the base's train line: later keys of one YAML map would be duplicates.
    const size_t at = yaml.find("train: {");
    const size_t end = yaml.find('\n', at);
    yaml.replace(at, end - at, "train: {" + train + "}");
  }
  return testing::JobWithDefaults(yaml.c_str());
}

TEST(ParallelDefaultsTest, AreOneRankPerDimensionAnd1F1BOverTheAccumulationSteps) {
  const JobSpec job = With(kGpt2Yaml, "world_size: 8",
                           "micro_batch_size: 2, grad_accum_steps: 4, "
                           "max_steps: 5");
  EXPECT_EQ(job.parallel().tensor_parallel(), 1);
  EXPECT_EQ(job.parallel().pipeline_parallel(), 1);
  EXPECT_FALSE(job.parallel().sequence_parallel());
  EXPECT_EQ(job.parallel().pipeline_schedule(), ParallelConfig::ONE_F_ONE_B);
  EXPECT_EQ(job.parallel().virtual_stages(), 1);
  EXPECT_EQ(job.parallel().micro_batches(), 4);
  EXPECT_EQ(job.parallel().shard_group_size(), 8);  // tp = pp = 1: the world, as before
}

TEST(ParallelDefaultsTest, ShardGroupDefaultsToTheDataParallelSize) {
  const JobSpec job =
      With(kGpt2Yaml, "world_size: 16, tensor_parallel: 2, pipeline_parallel: 2, micro_batches: 2");
  EXPECT_EQ(job.parallel().shard_group_size(), 4);
  EXPECT_TRUE(ValidateJobSpec(job).ok()) << ValidateJobSpec(job);
}

TEST(ParallelDefaultsTest, MicroBatchesAloneSetTheAccumulationSteps) {
  const JobSpec job = With(kGpt2Yaml, "micro_batches: 6");
  EXPECT_EQ(job.train().grad_accum_steps(), 6);
  EXPECT_EQ(job.parallel().micro_batches(), 6);
}

TEST(ParallelValidationTest, AcceptsTheMainLayouts) {
  for (const std::string& parallel : {
           "world_size: 8, tensor_parallel: 2",
           "world_size: 8, tensor_parallel: 4, sequence_parallel: true",
           "world_size: 8, pipeline_parallel: 2, micro_batches: 4",
           "world_size: 8, tensor_parallel: 2, pipeline_parallel: 2, zero_stage: 1, micro_batches: "
           "2",
           "world_size: 6, pipeline_parallel: 6, pipeline_schedule: GPIPE",
           "world_size: 4, pipeline_parallel: 2, pipeline_schedule: INTERLEAVED, "
           "virtual_stages: 2, micro_batches: 4",
           "world_size: 8, tensor_parallel: 2, shard_group_size: 2, zero_stage: 3",
       }) {
    const JobSpec job = With(kGpt2Yaml, parallel);
    EXPECT_THAT(ParallelViolations(job), IsEmpty()) << parallel;
    EXPECT_TRUE(ValidateJobSpec(job).ok()) << parallel << ": " << ValidateJobSpec(job);
  }
}

TEST(ParallelValidationTest, GroupedKvHeadsSplitWhenAtLeastTpAndReplicateBelow) {
  // 2 KV heads: tp 2 splits them, tp 4 and 8 replicate each on 2 and 4 ranks.
  for (int tp : {2, 4, 8}) {
    const JobSpec job = With(kLlamaYaml, "world_size: 8, tensor_parallel: " + std::to_string(tp));
    EXPECT_THAT(ParallelViolations(job), IsEmpty()) << tp;
  }
}

struct Case {
  std::string label;
  const char* base;
  std::string parallel;
  std::vector<std::string> lines;
};

TEST(ParallelValidationTest, NamesTheFieldTheValueAndTheRule) {
  const std::vector<Case> cases = {
      {"world not divisible",
       kGpt2Yaml,
       "world_size: 6, tensor_parallel: 4",
       {"parallel.world_size: 6 is not divisible by parallel.tensor_parallel 4 × "
        "parallel.pipeline_parallel 1 = 4 (the data-parallel size is world_size / "
        "(tensor_parallel · pipeline_parallel))"}},
      {"world not divisible by tp · pp",
       kGpt2Yaml,
       "world_size: 6, tensor_parallel: 2, pipeline_parallel: 2, micro_batches: 2",
       {"parallel.world_size: 6 is not divisible by parallel.tensor_parallel 2 × "
        "parallel.pipeline_parallel 2 = 4 (the data-parallel size is world_size / "
        "(tensor_parallel · pipeline_parallel))"}},
      {"tp × pp: tp does not divide the heads, pp over the units",
       kGpt2Yaml,
       "world_size: 56, tensor_parallel: 8, pipeline_parallel: 7, micro_batches: 7",
       {"parallel.tensor_parallel: 8 does not divide model.n_head 12 (attention is split by "
        "heads: each rank needs whole heads)",
        "parallel.tensor_parallel: 8 does not divide model.n_kv_head 12 (with n_kv_head >= "
        "tensor_parallel the KV heads are split)",
        "parallel.pipeline_parallel: 7 stages exceed the model's 6 units (model.n_layer 4 blocks "
        "+ embedding + head): every stage needs at least one unit"}},
      {"tp × pp: shard group not dividing dp",
       kGpt2Yaml,
       "world_size: 12, tensor_parallel: 2, pipeline_parallel: 2, shard_group_size: 2, "
       "micro_batches: 2",
       {"parallel.shard_group_size: 2 does not divide the data-parallel size 3 "
        "(parallel.world_size 12 / (tensor_parallel 2 · pipeline_parallel 2)): ZeRO shards "
        "inside the data-parallel group"}},
      {"tp does not divide heads",
       kGpt2Yaml,
       "world_size: 5, tensor_parallel: 5",
       {"parallel.tensor_parallel: 5 does not divide model.n_head 12 (attention is split by "
        "heads: each rank needs whole heads)",
        "parallel.tensor_parallel: 5 does not divide model.n_kv_head 12 (with n_kv_head >= "
        "tensor_parallel the KV heads are split)",
        "parallel.tensor_parallel: 5 does not divide model.d_ff 3072 (the MLP is split column- "
        "then row-parallel by its hidden width)"}},
      {"tp zero",
       kGpt2Yaml,
       "tensor_parallel: 0",
       {"parallel.tensor_parallel: must be >= 1 (got 0)"}},
      {"pp over the units",
       kGpt2Yaml,
       "world_size: 7, pipeline_parallel: 7, micro_batches: 7",
       {"parallel.pipeline_parallel: 7 stages exceed the model's 6 units (model.n_layer 4 blocks "
        "+ embedding + head): every stage needs at least one unit"}},
      {"virtual stages without interleaving",
       kGpt2Yaml,
       "world_size: 2, pipeline_parallel: 2, virtual_stages: 2, micro_batches: 2",
       {"parallel.virtual_stages: 2 needs parallel.pipeline_schedule INTERLEAVED (got "
        "ONE_F_ONE_B)"}},
      {"interleaved layers not divisible",
       kGpt2Yaml,
       "world_size: 2, pipeline_parallel: 2, pipeline_schedule: INTERLEAVED, virtual_stages: 3, "
       "micro_batches: 4",
       {"parallel.virtual_stages: model.n_layer 4 is not divisible by parallel.pipeline_parallel "
        "2 × parallel.virtual_stages 3 (each of the pp · virtual_stages chunks holds as many "
        "blocks)"}},
      {"interleaved chunks more than the units",
       kGpt2Yaml,
       "world_size: 2, pipeline_parallel: 2, pipeline_schedule: INTERLEAVED, virtual_stages: 4, "
       "micro_batches: 4",
       {"parallel.virtual_stages: model.n_layer 4 is not divisible by parallel.pipeline_parallel "
        "2 × parallel.virtual_stages 4 (each of the pp · virtual_stages chunks holds as many "
        "blocks)"}},
      {"interleaved with one chunk",
       kGpt2Yaml,
       "world_size: 2, pipeline_parallel: 2, pipeline_schedule: INTERLEAVED, micro_batches: 2",
       {"parallel.virtual_stages: INTERLEAVED needs >= 2 model chunks per rank (got 1; 1 is "
        "ONE_F_ONE_B)"}},
      {"interleaved micro-batches not a multiple",
       kGpt2Yaml,
       "world_size: 2, pipeline_parallel: 2, pipeline_schedule: INTERLEAVED, virtual_stages: 2, "
       "micro_batches: 3",
       {"parallel.micro_batches: 3 is not a multiple of parallel.pipeline_parallel 2 (the "
        "INTERLEAVED schedule sends micro-batches through the chunks in groups of "
        "pipeline_parallel)"}},
      {"1F1B with too few micro-batches",
       kGpt2Yaml,
       "world_size: 4, pipeline_parallel: 4, micro_batches: 2",
       {"parallel.micro_batches: 2 is fewer than parallel.pipeline_parallel 4; ONE_F_ONE_B needs "
        "at least one micro-batch per stage to fill the pipeline"}},
      {"sequence parallel without tp",
       kGpt2Yaml,
       "sequence_parallel: true",
       {"parallel.sequence_parallel: needs parallel.tensor_parallel > 1 (got 1): the sequence is "
        "split across the tensor-parallel group"}},
      {"shard group not dividing dp",
       kGpt2Yaml,
       "world_size: 12, tensor_parallel: 2, shard_group_size: 4",
       {"parallel.shard_group_size: 4 does not divide the data-parallel size 6 "
        "(parallel.world_size 12 / (tensor_parallel 2 · pipeline_parallel 1)): ZeRO shards "
        "inside the data-parallel group"}},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ParallelViolations(With(c.base, c.parallel)), ::testing::ElementsAreArray(c.lines))
        << c.label;
  }
}

TEST(ParallelValidationTest, GroupedKvHeadsThatNeitherDivideNorAreDividedAreRefused) {
  // 3 KV heads, tp 2: 3 ≥ 2, so they would be split, and 2 does not divide 3.
  JobSpec job = With(kLlamaYaml, "world_size: 2, tensor_parallel: 2");
  job.mutable_model()->set_n_head(6);
  job.mutable_model()->set_n_kv_head(3);
  job.mutable_model()->set_d_model(384);
  EXPECT_THAT(ParallelViolations(job),
              ElementsAre("parallel.tensor_parallel: 2 does not divide model.n_kv_head 3 (with "
                          "n_kv_head >= tensor_parallel the KV heads are split)"));
  // 2 KV heads, 6 query heads, tp 3: 3 is not a multiple of 2.
  job.mutable_parallel()->set_tensor_parallel(3);
  job.mutable_parallel()->set_world_size(3);
  job.mutable_parallel()->set_shard_group_size(1);
  job.mutable_model()->set_n_kv_head(2);
  EXPECT_THAT(ParallelViolations(job),
              ElementsAre("parallel.tensor_parallel: 3 is not a multiple of model.n_kv_head 2 "
                          "(with n_kv_head < tensor_parallel each KV head is replicated on "
                          "tensor_parallel / n_kv_head ranks)"));
}

TEST(ParallelValidationTest, MicroBatchesMustBeTheAccumulationSteps) {
  const JobSpec job =
      With(kGpt2Yaml, "micro_batches: 4", "micro_batch_size: 2, grad_accum_steps: 2, max_steps: 5");
  EXPECT_THAT(ParallelViolations(job),
              ElementsAre("parallel.micro_batches: 4 differs from train.grad_accum_steps 2; the "
                          "pipeline's micro-batches are the step's accumulation micro-batches "
                          "(set one of them, or both alike)"));
}

TEST(ParallelValidationTest, UnsetFieldsAreNamed) {
  JobSpec job = With(kGpt2Yaml, "world_size: 1");
  job.mutable_parallel()->clear_tensor_parallel();
  job.mutable_parallel()->clear_micro_batches();
  EXPECT_THAT(ParallelViolations(job),
              ElementsAre("parallel.tensor_parallel: not set (ApplyJobDefaults must run before "
                          "validation)",
                          "parallel.micro_batches: not set (ApplyJobDefaults must run before "
                          "validation)"));
}

TEST(ParallelValidationTest, SequenceParallelNeedsTheSequenceToDivideByTensorParallel) {
  JobSpec job = With(kGpt2Yaml, "world_size: 4, tensor_parallel: 4, sequence_parallel: true");
  EXPECT_THAT(ParallelViolations(job), IsEmpty());  // seq_len 32
  job.mutable_data()->set_seq_len(30);
  EXPECT_THAT(ParallelViolations(job),
              ElementsAre("data.seq_len: 30 is not divisible by parallel.tensor_parallel 4 "
                          "(parallel.sequence_parallel splits the sequence's tokens evenly over "
                          "the tensor-parallel group)"));
  job.mutable_parallel()->set_sequence_parallel(false);
  EXPECT_THAT(ParallelViolations(job), IsEmpty());  // only sequence parallelism needs it
}

TEST(CheckEngineSupportTest, RefusesTheLayoutsTheEngineDoesNotRunYet) {
  // Tensor parallelism trains, pipeline parallelism alone and the two together (3D with
  // ZeRO), and sequence parallelism with them.
  const JobSpec job = With(kGpt2Yaml,
                           "world_size: 8, tensor_parallel: 2, pipeline_parallel: 2, "
                           "sequence_parallel: true, micro_batches: 2");
  ASSERT_TRUE(ValidateJobSpec(job).ok()) << ValidateJobSpec(job);
  EXPECT_TRUE(CheckEngineSupport(job).ok()) << CheckEngineSupport(job);
  EXPECT_TRUE(CheckEngineSupport(With(kGpt2Yaml, "world_size: 8")).ok());
  for (const char* layout :
       {"world_size: 4, tensor_parallel: 2, pipeline_parallel: 2, micro_batches: 4",
        "world_size: 8, tensor_parallel: 2, pipeline_parallel: 2, zero_stage: 1, "
        "micro_batches: 4",
        "world_size: 8, tensor_parallel: 4, pipeline_parallel: 2, pipeline_schedule: GPIPE, "
        "micro_batches: 2"}) {
    JobSpec tp_pp = With(kLlamaYaml, layout);
    // A pipelined job evaluates data.val with a forward-only pass over the stages.
    tp_pp.mutable_data()->add_val(tp_pp.data().train(0));
    ASSERT_TRUE(ValidateJobSpec(tp_pp).ok()) << layout << ": " << ValidateJobSpec(tp_pp);
    EXPECT_TRUE(CheckEngineSupport(tp_pp).ok()) << layout << ": " << CheckEngineSupport(tp_pp);
  }
}

TEST(CheckEngineSupportTest, PipelineTrainsEveryScheduleAtEveryZeroStageInF32And16Bit) {
  for (const char* layout :
       {"world_size: 2, pipeline_parallel: 2, pipeline_schedule: GPIPE, micro_batches: 2",
        "world_size: 2, pipeline_parallel: 2, pipeline_schedule: INTERLEAVED, virtual_stages: 2, "
        "micro_batches: 4",
        "world_size: 4, pipeline_parallel: 2, zero_stage: 1, micro_batches: 4",
        "world_size: 4, pipeline_parallel: 2, zero_stage: 2, micro_batches: 4",
        "world_size: 4, pipeline_parallel: 2, zero_stage: 3, micro_batches: 4, "
        "reshard_after_forward: false",
        // Each unit gathered per use (FSDP's reshard after forward) on the stage.
        "world_size: 4, pipeline_parallel: 2, zero_stage: 3, micro_batches: 4",
        "world_size: 4, pipeline_parallel: 2, zero_stage: 3, micro_batches: 4, "
        "pipeline_schedule: INTERLEAVED, virtual_stages: 2",
        "world_size: 4, pipeline_parallel: 4, micro_batches: 4"}) {
    JobSpec job = With(kLlamaYaml, layout);
    ASSERT_TRUE(ValidateJobSpec(job).ok()) << ValidateJobSpec(job);
    EXPECT_TRUE(CheckEngineSupport(job).ok()) << layout << ": " << CheckEngineSupport(job);
    // Mixed precision: 16-bit parameters, activations and gradients, f32 master weights.
    for (const auto dtype : {zerotrain::PrecisionConfig::BF16, zerotrain::PrecisionConfig::FP16}) {
      job.mutable_precision()->set_param_dtype(dtype);
      job.mutable_precision()->set_compute_dtype(dtype);
      job.mutable_precision()->set_grad_dtype(dtype);
      job.mutable_precision()->set_reduce_dtype(dtype);
      EXPECT_TRUE(CheckEngineSupport(job).ok()) << layout << ": " << CheckEngineSupport(job);
    }
    // Adafactor: per-tensor statistics of tensors each stage holds whole.
    job.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAFACTOR);
    EXPECT_TRUE(CheckEngineSupport(job).ok()) << layout << ": " << CheckEngineSupport(job);
  }
  JobSpec job = With(kGpt2Yaml,
                     "world_size: 4, pipeline_parallel: 2, zero_stage: 3, micro_batches: 4, "
                     "pipeline_schedule: INTERLEAVED, virtual_stages: 2");
  job.mutable_precision()->set_param_dtype(zerotrain::PrecisionConfig::BF16);
  // CUDA ranks run the stages too (their links and statistics in device buffers).
  job.mutable_resources()->set_device(zerotrain::ResourceConfig::CUDA);
  EXPECT_TRUE(CheckEngineSupport(job).ok()) << CheckEngineSupport(job);
}

// One micro-batch a step trains a pipeline at every ZeRO stage: at stage 2, or 3 keeping its
// units gathered, a stage reduce-scatters its one backward of each unit as it ends (as at 3
// with reshard_after_forward, the default, it does each micro-batch's).
TEST(CheckEngineSupportTest, PipelineTrainsOneMicroBatchAtEveryZeroStage) {
  for (const auto& [stage, reshard] :
       {std::pair{2, true}, std::pair{3, false}, std::pair{3, true}, std::pair{1, true}}) {
    const JobSpec job =
        With(kLlamaYaml, absl::StrCat("world_size: 4, pipeline_parallel: 2, zero_stage: ", stage,
                                      ", pipeline_schedule: GPIPE, micro_batches: 1, "
                                      "reshard_after_forward: ",
                                      reshard ? "true" : "false"));
    ASSERT_TRUE(ValidateJobSpec(job).ok()) << ValidateJobSpec(job);
    EXPECT_TRUE(CheckEngineSupport(job).ok()) << stage << ": " << CheckEngineSupport(job);
  }
}

TEST(CheckEngineSupportTest, TensorParallelTrainsUnderEveryZeroStageInF32And16Bit) {
  for (const char* layout :
       {"world_size: 2, tensor_parallel: 2", "world_size: 8, tensor_parallel: 4, zero_stage: 1",
        "world_size: 8, tensor_parallel: 2, zero_stage: 3"}) {
    JobSpec job = With(kLlamaYaml, layout);
    ASSERT_TRUE(ValidateJobSpec(job).ok()) << ValidateJobSpec(job);
    EXPECT_TRUE(CheckEngineSupport(job).ok()) << layout << ": " << CheckEngineSupport(job);
    // Mixed precision: 16-bit parameters, activations and gradients, f32 master weights.
    for (const auto dtype : {zerotrain::PrecisionConfig::BF16, zerotrain::PrecisionConfig::FP16}) {
      job.mutable_precision()->set_param_dtype(dtype);
      job.mutable_precision()->set_compute_dtype(dtype);
      job.mutable_precision()->set_grad_dtype(dtype);
      job.mutable_precision()->set_reduce_dtype(dtype);
      EXPECT_TRUE(CheckEngineSupport(job).ok()) << layout << ": " << CheckEngineSupport(job);
    }
  }
  // On CUDA every optimizer trains tensor-parallel ranks: Adafactor's split statistics are
  // summed over the group by its CUDA kernel's tensor-parallel path.
  JobSpec job = With(kGpt2Yaml, "world_size: 4, tensor_parallel: 2, zero_stage: 2");
  job.mutable_precision()->set_param_dtype(zerotrain::PrecisionConfig::BF16);
  job.mutable_resources()->set_device(zerotrain::ResourceConfig::CUDA);
  job.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAFACTOR);
  EXPECT_TRUE(CheckEngineSupport(job).ok()) << CheckEngineSupport(job);
  // AdamW (and with it SGD and 8-bit AdamW) trains tensor- and sequence-parallel CUDA ranks.
  job.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAMW);
  EXPECT_TRUE(CheckEngineSupport(job).ok()) << CheckEngineSupport(job);
  job.mutable_parallel()->set_sequence_parallel(true);
  EXPECT_TRUE(CheckEngineSupport(job).ok()) << CheckEngineSupport(job);
}

// Adafactor's statistics of split tensors are summed over the TP group; only replicated KV
// heads (n_kv_head < tensor_parallel) are refused, by name.
TEST(CheckEngineSupportTest, TensorParallelAdafactorTrainsWithSplitOrReplicatedKvHeads) {
  // n_kv_head 2: split over 2 ranks, replicated over 4 (each head's rows counted once).
  for (const char* layout :
       {"world_size: 2, tensor_parallel: 2", "world_size: 4, tensor_parallel: 2, zero_stage: 1",
        "world_size: 4, tensor_parallel: 4", "world_size: 8, tensor_parallel: 4, zero_stage: 2"}) {
    JobSpec job = With(kLlamaYaml, layout);
    job.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAFACTOR);
    EXPECT_TRUE(CheckEngineSupport(job).ok()) << layout << ": " << CheckEngineSupport(job);
  }
}

}  // namespace
}  // namespace zt
