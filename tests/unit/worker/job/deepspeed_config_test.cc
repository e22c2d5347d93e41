// DeepSpeed configs laid over a JobSpec (worker/job/deepspeed_config.h). The configs under
// tests/data/deepspeed/ have the shapes of DeepSpeed's documented examples: the config-json
// page's example, the ZeRO-2 and ZeRO-3-Offload tutorials, Hugging Face's zero2 config with
// "auto", and bing_bert's LAMB config.
#include "worker/job/deepspeed_config.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "worker/job/job_file.h"
#include "worker/job/job_loading.h"

namespace zt {
namespace {

using zerotrain::JobSpec;
using zerotrain::MemoryConfig;
using zerotrain::OffloadConfig;
using zerotrain::OptimizerConfig;
using zerotrain::PrecisionConfig;

std::string DataPath(const std::string& name) {
  return std::string(ZT_SOURCE_DIR) + "/tests/data/deepspeed/" + name;
}

// A job file that leaves precision, sharding and schedule to the DeepSpeed config; `extra`
// with a train: line replaces the default micro batch 2 and 100 steps.
JobSpec BaseJob(const std::string& extra = "") {
  std::string yaml =
      "name: ds\n"
      "model: {family: GPT2, n_layer: 2, n_head: 4, d_model: 64, vocab_size: 256, "
      "max_seq_len: 64}\n"
      "data: {train: [train.bin], seq_len: 32}\n"
      "optimizer: {lr: 3.0e-4}\n";
  if (extra.find("train:") == std::string::npos) {
    yaml += "train: {micro_batch_size: 2, max_steps: 100}\n";
  }
  yaml += extra;
  absl::StatusOr<JobSpec> job = ParseJobText(yaml, JobFormat::kYaml, "job.yaml");
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? *job : JobSpec();
}

JobSpec WithWorld(JobSpec job, int world) {
  job.mutable_parallel()->set_world_size(world);
  return job;
}

absl::StatusOr<JobSpec> Apply(const std::string& json, JobSpec job) {
  return ApplyDeepSpeedConfig(json, "ds.json", std::move(job));
}

// The mapped job must pass the same validation a job file does.
void ExpectValid(const JobSpec& job) {
  absl::StatusOr<JobSpec> valid =
      ValidatedJob(job, {.check_paths = false, .check_engine_support = false});
  EXPECT_TRUE(valid.ok()) << valid.status();
}

MATCHER_P(IsErrorWith, text, "") {
  *result_listener << arg.status();
  return arg.status().code() == absl::StatusCode::kInvalidArgument &&
         std::string(arg.status().message()).find(text) != std::string::npos;
}

// ---- DeepSpeed's documented examples -----------------------------------------------------------

TEST(DeepSpeedConfigTest, ConfigJsonPageExample) {
  absl::StatusOr<JobSpec> job =
      ApplyDeepSpeedConfigFile(DataPath("config_json_example.json"), BaseJob());
  ASSERT_TRUE(job.ok()) << job.status();
  // train_batch_size 8 with accumulation 1 on one rank: micro batch 8.
  EXPECT_EQ(job->train().micro_batch_size(), 8);
  EXPECT_EQ(job->train().grad_accum_steps(), 1);
  // DeepSpeed's Adam decays decoupled (adam_w_mode defaults to true), weight_decay default 0.
  EXPECT_EQ(job->optimizer().type(), OptimizerConfig::ADAMW);
  EXPECT_FLOAT_EQ(job->optimizer().lr(), 0.00015f);
  EXPECT_FLOAT_EQ(job->optimizer().weight_decay(), 0.0f);
  EXPECT_FLOAT_EQ(job->optimizer().beta1(), 0.9f);
  EXPECT_FLOAT_EQ(job->optimizer().beta2(), 0.999f);
  EXPECT_FLOAT_EQ(job->optimizer().eps(), 1e-8f);
  const PrecisionConfig& p = job->precision();
  EXPECT_EQ(p.param_dtype(), PrecisionConfig::FP16);
  EXPECT_EQ(p.compute_dtype(), PrecisionConfig::FP16);
  EXPECT_EQ(p.grad_dtype(), PrecisionConfig::FP16);
  EXPECT_EQ(p.reduce_dtype(), PrecisionConfig::FP16);
  EXPECT_TRUE(p.master_weights());
  // fp16 with no loss-scale keys: DeepSpeed's dynamic defaults.
  EXPECT_FALSE(p.loss_scale().has_static_scale());
  EXPECT_EQ(p.loss_scale().initial_power(), 16);
  EXPECT_EQ(p.loss_scale().window(), 1000);
  EXPECT_EQ(p.loss_scale().hysteresis(), 2);
  EXPECT_FLOAT_EQ(p.loss_scale().min_scale(), 1.0f);
  // "zero_optimization": true is DeepSpeed's older spelling of stage 1.
  EXPECT_EQ(job->parallel().zero_stage(), 1);
  ExpectValid(*job);
}

TEST(DeepSpeedConfigTest, ZeroTwoTutorialOnTwoRanks) {
  absl::StatusOr<JobSpec> job =
      ApplyDeepSpeedConfigFile(DataPath("zero2_tutorial.json"), WithWorld(BaseJob(), 2));
  ASSERT_TRUE(job.ok()) << job.status();
  // 64 = 4 × accumulation × 2 ranks.
  EXPECT_EQ(job->train().micro_batch_size(), 4);
  EXPECT_EQ(job->train().grad_accum_steps(), 8);
  EXPECT_FLOAT_EQ(job->optimizer().beta1(), 0.9f);
  EXPECT_FLOAT_EQ(job->optimizer().beta2(), 0.95f);
  EXPECT_FLOAT_EQ(job->optimizer().grad_clip(), 1.0f);
  EXPECT_EQ(job->parallel().zero_stage(), 2);
  // 5e7 elements of fp16 gradients: 1e8 bytes.
  EXPECT_EQ(job->parallel().bucket_bytes(), 100'000'000);
  ExpectValid(*job);
}

TEST(DeepSpeedConfigTest, OptionsWorldSizeOverridesTheJobs) {
  absl::StatusOr<JobSpec> job =
      ApplyDeepSpeedConfigFile(DataPath("zero2_tutorial.json"), BaseJob(), {.world_size = 4});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->train().grad_accum_steps(), 4);  // 64 = 4 × 4 × 4
}

TEST(DeepSpeedConfigTest, ZeroThreeOffloadTutorialMapsBothOffloads) {
  // As the tutorial writes it, its stage3_prefetch_bucket_size is refused (ZeroTrain prefetches
  // units); with that key "auto", both offloads map.
  EXPECT_THAT(ApplyDeepSpeedConfigFile(DataPath("zero3_offload_tutorial.json"), BaseJob()),
              IsErrorWith("zero3_offload_tutorial.json: "
                          "zero_optimization.stage3_prefetch_bucket_size: "));
  std::ifstream in(DataPath("zero3_offload_tutorial.json"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text = absl::StrReplaceAll(text, {{R"("stage3_prefetch_bucket_size": 1e7)",
                                     R"("stage3_prefetch_bucket_size": "auto")"}});
  absl::StatusOr<JobSpec> job = Apply(text, BaseJob());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->parallel().zero_stage(), 3);
  EXPECT_EQ(job->offload().optimizer(), OffloadConfig::CPU);
  EXPECT_EQ(job->offload().params(), OffloadConfig::CPU);
  // Nothing else given: the job's defaults (DeepSpeed's) fill the rest.
  EXPECT_FALSE(job->offload().has_buffer_count());
  EXPECT_FALSE(job->offload().has_buffer_size());
  ExpectValid(*job);
}

TEST(DeepSpeedConfigTest, OffloadSectionsMapEveryKey) {
  absl::StatusOr<JobSpec> job = Apply(
      R"({"bf16": {"enabled": true},
          "zero_optimization": {"stage": 3,
            "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme",
                                  "pin_memory": true, "buffer_count": 4, "ratio": 1.0,
                                  "pipeline_read": false, "pipeline_write": true,
                                  "fast_init": false},
            "offload_param": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": true,
                              "buffer_count": 6, "buffer_size": 1e8, "max_in_cpu": 1e9}},
          "aio": {"block_size": 262144, "queue_depth": 32, "thread_count": 1,
                  "single_submit": false, "overlap_events": true}})",
      BaseJob());
  ASSERT_TRUE(job.ok()) << job.status();
  const zerotrain::OffloadConfig& o = job->offload();
  EXPECT_EQ(o.optimizer(), OffloadConfig::NVME);
  EXPECT_EQ(o.params(), OffloadConfig::NVME);
  EXPECT_EQ(o.nvme_path(), "/local_nvme");
  EXPECT_TRUE(o.pin_memory());
  EXPECT_EQ(o.buffer_count(), 6);  // one ring for both sections: the larger count
  // 1e8 bf16 elements = 2e8 bytes, rounded up to 4096.
  EXPECT_EQ(o.buffer_size(), 200'003'584);
  EXPECT_EQ(o.aio().block_size(), 262144);
  EXPECT_EQ(o.aio().queue_depth(), 32);
  ExpectValid(*job);

  // At fp32 parameters (the job's default) an element is 4 bytes: 1000 → 4000 → 4096.
  job = Apply(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu",
                  "buffer_size": 1000}}})",
              BaseJob());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->offload().buffer_size(), 4096);
  EXPECT_EQ(job->offload().optimizer(), OffloadConfig::DEVICE_UNSPECIFIED);

  // The older spelling of optimizer offload.
  job = Apply(R"({"zero_optimization": {"stage": 2, "cpu_offload": true}})", BaseJob());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->offload().optimizer(), OffloadConfig::CPU);
  ExpectValid(*job);

  // Device "none" maps to NONE, its other keys changing nothing.
  job = Apply(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "none"},
          "offload_optimizer": {"device": "none", "pin_memory": true}}})",
              BaseJob());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->offload().optimizer(), OffloadConfig::NONE);
  EXPECT_EQ(job->offload().params(), OffloadConfig::NONE);
}

TEST(DeepSpeedConfigTest, OffloadRefusalsNameTheKeyAndTheRule) {
  struct Case {
    const char* config;
    const char* error;
  } cases[] = {
      {R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "disk"}}})",
       R"(ds.json: zero_optimization.offload_param.device: must be "none", "cpu" or "nvme" (got "disk"))"},
      {R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}})",
       R"(ds.json: zero_optimization.offload_optimizer.nvme_path: required with device "nvme")"},
      {R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})",
       R"(ds.json: zero_optimization.offload_param.device: "cpu" needs zero_optimization.stage 3 (got 2))"},
      {R"({"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}})",
       R"(ds.json: zero_optimization.offload_optimizer.device: "cpu" needs zero_optimization.stage >= 1 (got 0))"},
      {R"({"zero_optimization": {"stage": 0, "cpu_offload": true}})",
       R"(ds.json: zero_optimization.cpu_offload: "cpu" needs zero_optimization.stage >= 1 (got 0))"},
      {R"({"zero_optimization": {"stage": 1, "cpu_offload": true,
                                 "offload_optimizer": {"device": "cpu"}}})",
       R"(ds.json: zero_optimization.cpu_offload: true is the older spelling)"},
      {R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})",
       R"(ds.json: zero_optimization.offload_optimizer.ratio: must be 1 (got 0.3))"},
      {R"({"zero_optimization": {"stage": 3,
             "offload_optimizer": {"device": "nvme", "nvme_path": "/a"},
             "offload_param": {"device": "nvme", "nvme_path": "/b"}}})",
       R"(ds.json: zero_optimization.offload_param.nvme_path: "/b" differs from offload_optimizer.nvme_path "/a")"},
      {R"({"zero_optimization": {"stage": 3,
             "offload_optimizer": {"device": "cpu", "pin_memory": true},
             "offload_param": {"device": "cpu", "pin_memory": false}}})",
       R"(ds.json: zero_optimization.offload_param.pin_memory: differs)"},
      {R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "buffer_count": 0}}})",
       R"(ds.json: zero_optimization.offload_param.buffer_count: must be in [1, 1024] (got 0))"},
      {R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "swap": 1}}})",
       R"(ds.json: zero_optimization.offload_param.swap: not a key ZeroTrain maps)"},
      {R"({"aio": {"block_size": 1000}})",
       R"(ds.json: aio.block_size: must be a multiple of 4096 bytes)"},
      {R"({"aio": {"queue_depth": 0}})",
       R"(ds.json: aio.queue_depth: must be in [1, 4096] (got 0))"},
      {R"({"aio": {"use_gds": true}})", R"(ds.json: aio.use_gds: true reads NVMe straight)"},
      {R"({"aio": {"queue": 8}})", R"(ds.json: aio.queue: not a key ZeroTrain maps)"},
  };
  for (const Case& c : cases)
    EXPECT_THAT(Apply(c.config, BaseJob()), IsErrorWith(c.error)) << c.config;
}

TEST(DeepSpeedConfigTest, OffloadWithTheStageLeftToTheJobIsCheckedByValidation) {
  // The config names no stage and the job none: DeepSpeed's rule is checked after defaults
  // (stage 0), by the offload validation.
  absl::StatusOr<JobSpec> job =
      Apply(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}})", BaseJob());
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<JobSpec> valid =
      ValidatedJob(*job, {.check_paths = false, .check_engine_support = false});
  EXPECT_EQ(valid.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(valid.status().message()),
      ::testing::HasSubstr("offload.optimizer: CPU needs parallel.zero_stage >= 1 (got 0)"));
}

TEST(DeepSpeedConfigTest, HuggingFaceZeroTwoConfigRefusesOnlyItsLogWarmup) {
  // Hugging Face's zero2 config as its docs give it keeps DeepSpeed's log warmup (refused);
  // its optimizer offload maps.
  absl::StatusOr<JobSpec> job = ApplyDeepSpeedConfigFile(DataPath("hf_zero2_auto.json"), BaseJob());
  EXPECT_THAT(job, IsErrorWith("hf_zero2_auto.json: scheduler.params.warmup_type: \"log\""));
  EXPECT_THAT(job, ::testing::Not(IsErrorWith("offload_optimizer")));
}

TEST(DeepSpeedConfigTest, AutoValuesKeepTheJobFilesValues) {
  std::ifstream in(DataPath("hf_zero2_auto.json"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The same config without the offload, and with the linear warmup ZeroTrain has.
  text = absl::StrReplaceAll(text, {{R"("device": "cpu")", R"("device": "none")"},
                                    {R"("warmup_num_steps": "auto")",
                                     R"("warmup_num_steps": "auto", "warmup_type": "linear")"}});
  JobSpec base = BaseJob(
      "train: {micro_batch_size: 3, grad_accum_steps: 5, max_steps: 50}\n"
      "precision: {param_dtype: BF16}\n");
  base.mutable_optimizer()->set_beta2(0.95f);
  base.mutable_optimizer()->set_weight_decay(0.1f);
  base.mutable_optimizer()->set_grad_clip(0.5f);
  base.mutable_optimizer()->mutable_schedule()->set_warmup_steps(7);
  absl::StatusOr<JobSpec> job = Apply(text, base);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->train().micro_batch_size(), 3);
  EXPECT_EQ(job->train().grad_accum_steps(), 5);
  EXPECT_EQ(job->precision().param_dtype(), PrecisionConfig::BF16);
  EXPECT_FLOAT_EQ(job->optimizer().lr(), 3e-4f);
  EXPECT_FLOAT_EQ(job->optimizer().beta2(), 0.95f);
  EXPECT_FLOAT_EQ(job->optimizer().weight_decay(), 0.1f);
  EXPECT_FLOAT_EQ(job->optimizer().grad_clip(), 0.5f);
  EXPECT_EQ(job->optimizer().schedule().warmup_steps(), 7);
  EXPECT_EQ(job->optimizer().schedule().decay(), OptimizerConfig::CONSTANT);
  EXPECT_EQ(job->parallel().zero_stage(), 2);
  // 2e8 elements in the job's fp32 reduction: 8e8 bytes.
  EXPECT_EQ(job->parallel().bucket_bytes(), 800'000'000);
  ExpectValid(*job);
}

TEST(DeepSpeedConfigTest, AutoMicroBatchNeedsTheJobToSetOne) {
  EXPECT_THAT(
      Apply(R"({"train_micro_batch_size_per_gpu": "auto"})", BaseJob("train: {max_steps: 100}\n")),
      IsErrorWith("train_micro_batch_size_per_gpu: \"auto\" keeps the job's "
                  "train.micro_batch_size, which the job file does not set"));
}

TEST(DeepSpeedConfigTest, BingBertLambIsRefusedNamingTheType) {
  EXPECT_THAT(ApplyDeepSpeedConfigFile(DataPath("bing_bert_lamb.json"), BaseJob()),
              IsErrorWith("bing_bert_lamb.json: optimizer.type: \"Lamb\" has no ZeroTrain "
                          "equivalent; supported: Adam and AdamW"));
}

// ---- the batch rule: any two of the three determine the third ----------------------------------

TEST(DeepSpeedConfigTest, MicroAndAccumulationGiveTheBatch) {
  absl::StatusOr<JobSpec> job =
      Apply(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3})",
            WithWorld(BaseJob(), 4));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->train().micro_batch_size(), 2);
  EXPECT_EQ(job->train().grad_accum_steps(), 3);
}

TEST(DeepSpeedConfigTest, BatchAndMicroGiveTheAccumulation) {
  absl::StatusOr<JobSpec> job = Apply(
      R"({"train_batch_size": 48, "train_micro_batch_size_per_gpu": 2})", WithWorld(BaseJob(), 4));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->train().micro_batch_size(), 2);
  EXPECT_EQ(job->train().grad_accum_steps(), 6);
}

TEST(DeepSpeedConfigTest, BatchAndAccumulationGiveTheMicroBatch) {
  absl::StatusOr<JobSpec> job = Apply(
      R"({"train_batch_size": 48, "gradient_accumulation_steps": 3})", WithWorld(BaseJob(), 4));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->train().micro_batch_size(), 4);
  EXPECT_EQ(job->train().grad_accum_steps(), 3);
}

TEST(DeepSpeedConfigTest, OneOfThemAloneMeansNoAccumulation) {
  absl::StatusOr<JobSpec> job = Apply(R"({"train_batch_size": 16})", WithWorld(BaseJob(), 4));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->train().micro_batch_size(), 4);
  EXPECT_EQ(job->train().grad_accum_steps(), 1);
  job =
      Apply(R"({"train_micro_batch_size_per_gpu": 5})", BaseJob("train: {grad_accum_steps: 4}\n"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->train().micro_batch_size(), 5);
  EXPECT_EQ(job->train().grad_accum_steps(), 1);
  EXPECT_THAT(Apply(R"({"gradient_accumulation_steps": 4})", BaseJob()),
              IsErrorWith("gradient_accumulation_steps: does not determine a batch alone"));
}

TEST(DeepSpeedConfigTest, ContradictoryBatchSizesNameAllThreeAndTheWorldSize) {
  EXPECT_THAT(Apply(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                        "gradient_accumulation_steps": 2})",
                    WithWorld(BaseJob(), 2)),
              IsErrorWith("ds.json: train_batch_size: 32 does not equal "
                          "train_micro_batch_size_per_gpu 4 × gradient_accumulation_steps 2 × "
                          "world size 2 = 16 (DeepSpeed's rule: train_batch_size = "
                          "train_micro_batch_size_per_gpu × gradient_accumulation_steps × "
                          "data-parallel world size)"));
  // Agreeing values pass.
  EXPECT_TRUE(Apply(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
                        "gradient_accumulation_steps": 2})",
                    WithWorld(BaseJob(), 2))
                  .ok());
  EXPECT_THAT(Apply(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4})",
                    WithWorld(BaseJob(), 2)),
              IsErrorWith("train_batch_size: 30 is not a multiple of "
                          "train_micro_batch_size_per_gpu 4 × world size 2"));
  EXPECT_THAT(Apply(R"({"train_batch_size": 0})", BaseJob()),
              IsErrorWith("train_batch_size: must be in [1, "));
}

// ---- schedulers ------------------------------------------------------------------------------

TEST(DeepSpeedConfigTest, WarmupLrIsLinearWarmupThenConstant) {
  absl::StatusOr<JobSpec> job = Apply(R"({"scheduler": {"type": "WarmupLR", "params": {
      "warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 100,
      "warmup_type": "linear"}}})",
                                      BaseJob());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_FLOAT_EQ(job->optimizer().lr(), 0.001f);
  EXPECT_EQ(job->optimizer().schedule().warmup_steps(), 100);
  EXPECT_EQ(job->optimizer().schedule().decay(), OptimizerConfig::CONSTANT);
  ExpectValid(*job);
}

TEST(DeepSpeedConfigTest, WarmupDecayLrDecaysLinearlyToMaxSteps) {
  const std::string config = R"({"scheduler": {"type": "WarmupDecayLR", "params": {
      "total_num_steps": 100, "warmup_max_lr": 3e-4, "warmup_num_steps": 10,
      "warmup_type": "linear"}}})";
  absl::StatusOr<JobSpec> job = Apply(config, BaseJob());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->optimizer().schedule().decay(), OptimizerConfig::LINEAR);
  EXPECT_FLOAT_EQ(job->optimizer().schedule().min_lr_ratio(), 0.0f);
  EXPECT_EQ(job->optimizer().schedule().warmup_steps(), 10);
  EXPECT_EQ(job->train().max_steps(), 100);
  ExpectValid(*job);
  EXPECT_THAT(Apply(config, BaseJob("train: {max_steps: 80}\n")),
              IsErrorWith("scheduler.params.total_num_steps: 100 differs from the job's "
                          "train.max_steps 80"));
  // A job without max_steps takes DeepSpeed's total.
  job = Apply(config, BaseJob("train: {micro_batch_size: 1}\n"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->train().max_steps(), 100);
  // WarmupDecayLR's peak defaults to 0.001 under DeepSpeed, not to the optimizer's lr.
  EXPECT_THAT(Apply(R"({"optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
                        "scheduler": {"type": "WarmupDecayLR", "params": {
                          "total_num_steps": 100, "warmup_type": "linear"}}})",
                    BaseJob()),
              IsErrorWith("scheduler.params.warmup_max_lr: 0.001 (DeepSpeed's default) is the "
                          "learning rate DeepSpeed trains at after warmup, not "
                          "optimizer.params.lr 0.0003"));
}

TEST(DeepSpeedConfigTest, WarmupCosineLrMapsCosMinRatio) {
  absl::StatusOr<JobSpec> job = Apply(R"({"scheduler": {"type": "WarmupCosineLR", "params": {
      "total_num_steps": 100, "warmup_num_steps": 20, "cos_min_ratio": 0.1,
      "warmup_type": "linear"}}})",
                                      BaseJob());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->optimizer().schedule().decay(), OptimizerConfig::COSINE);
  EXPECT_FLOAT_EQ(job->optimizer().schedule().min_lr_ratio(), 0.1f);
  EXPECT_EQ(job->optimizer().schedule().warmup_steps(), 20);
  EXPECT_FLOAT_EQ(job->optimizer().lr(), 3e-4f);  // the ratios scale the optimizer's lr
  ExpectValid(*job);
  // DeepSpeed's defaults: cos_min_ratio 1e-4, warmup over 1000 steps.
  job = Apply(R"({"scheduler": {"type": "WarmupCosineLR", "params": {
      "total_num_steps": 2000, "warmup_type": "linear"}}})",
              BaseJob("train: {micro_batch_size: 1}\n"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_FLOAT_EQ(job->optimizer().schedule().min_lr_ratio(), 1e-4f);
  EXPECT_EQ(job->optimizer().schedule().warmup_steps(), 1000);
  EXPECT_THAT(Apply(R"({"scheduler": {"type": "WarmupCosineLR", "params": {
      "total_num_steps": 100, "warmup_min_ratio": 0.1, "warmup_type": "linear"}}})",
                    BaseJob()),
              IsErrorWith("scheduler.params.warmup_min_ratio: must be 0"));
}

TEST(DeepSpeedConfigTest, LogWarmupIsRefusedIncludingDeepSpeedsDefault) {
  EXPECT_THAT(Apply(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}})",
                    BaseJob()),
              IsErrorWith("ds.json: scheduler.params.warmup_type: \"log\" (DeepSpeed's default "
                          "when the key is absent) warms up logarithmically; ZeroTrain warms up "
                          "linearly"));
  EXPECT_THAT(
      Apply(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "log"}}})", BaseJob()),
      IsErrorWith("scheduler.params.warmup_type: \"log\" warms up logarithmically"));
}

TEST(DeepSpeedConfigTest, SchedulerRefusals) {
  EXPECT_THAT(Apply(R"({"scheduler": {"type": "OneCycle", "params": {}}})", BaseJob()),
              IsErrorWith("scheduler.type: \"OneCycle\" has no ZeroTrain equivalent"));
  EXPECT_THAT(Apply(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-5,
                        "warmup_type": "linear"}}})",
                    BaseJob()),
              IsErrorWith("scheduler.params.warmup_min_lr: must be 0"));
  EXPECT_THAT(Apply(R"({"optimizer": {"type": "Adam", "params": {"lr": 1e-4}},
                        "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 2e-4,
                        "warmup_type": "linear"}}})",
                    BaseJob()),
              IsErrorWith("scheduler.params.warmup_max_lr: 0.0002 is the learning rate"));
  // DeepSpeed warms up over at least two steps.
  absl::StatusOr<JobSpec> job = Apply(
      R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 1,
          "warmup_type": "linear"}}})",
      BaseJob());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->optimizer().schedule().warmup_steps(), 2);
}

// ---- optimizers ------------------------------------------------------------------------------

TEST(DeepSpeedConfigTest, AdamParamsMap) {
  absl::StatusOr<JobSpec> job = Apply(R"({"optimizer": {"type": "AdamW", "params": {
      "lr": 6e-4, "betas": [0.8, 0.9], "eps": 1e-6, "weight_decay": 0.05}}})",
                                      BaseJob());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->optimizer().type(), OptimizerConfig::ADAMW);
  EXPECT_FLOAT_EQ(job->optimizer().lr(), 6e-4f);
  EXPECT_FLOAT_EQ(job->optimizer().beta1(), 0.8f);
  EXPECT_FLOAT_EQ(job->optimizer().beta2(), 0.9f);
  EXPECT_FLOAT_EQ(job->optimizer().eps(), 1e-6f);
  EXPECT_FLOAT_EQ(job->optimizer().weight_decay(), 0.05f);
  // torch_adam builds torch.optim.AdamW, whose weight_decay defaults to 0.01.
  job = Apply(R"({"optimizer": {"type": "AdamW", "params": {"torch_adam": true}}})", BaseJob());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_FLOAT_EQ(job->optimizer().weight_decay(), 0.01f);
  EXPECT_FLOAT_EQ(job->optimizer().lr(), 1e-3f);  // FusedAdam's default lr
}

TEST(DeepSpeedConfigTest, AdamRefusals) {
  EXPECT_THAT(Apply(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false,
                        "weight_decay": 0.01}}})",
                    BaseJob()),
              IsErrorWith("optimizer.params.adam_w_mode: false makes Adam add weight_decay"));
  // Without decay, L2 and decoupled Adam are the same update.
  EXPECT_TRUE(
      Apply(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})", BaseJob())
          .ok());
  EXPECT_THAT(Apply(R"({"optimizer": {"type": "Adam", "params": {"amsgrad": true}}})", BaseJob()),
              IsErrorWith("optimizer.params.amsgrad"));
  EXPECT_THAT(Apply(R"({"optimizer": {"type": "Adam", "params": {"betas": [0.9]}}})", BaseJob()),
              IsErrorWith("optimizer.params.betas: must be [beta1, beta2]"));
  EXPECT_THAT(
      Apply(R"({"optimizer": {"type": "Adam", "params": {"max_grad_norm": 1.0}}})", BaseJob()),
      IsErrorWith("optimizer.params.max_grad_norm: not a key ZeroTrain maps"));
  EXPECT_THAT(Apply(R"({"optimizer": {"type": "OneBitAdam", "params": {}}})", BaseJob()),
              IsErrorWith("optimizer.type: \"OneBitAdam\" has no ZeroTrain equivalent"));
}

TEST(DeepSpeedConfigTest, SgdMapsAndRefusesCoupledDecay) {
  absl::StatusOr<JobSpec> job =
      Apply(R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}})", BaseJob());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->optimizer().type(), OptimizerConfig::SGD);
  EXPECT_FLOAT_EQ(job->optimizer().lr(), 0.1f);
  EXPECT_FLOAT_EQ(job->optimizer().momentum(), 0.9f);
  EXPECT_FLOAT_EQ(job->optimizer().weight_decay(), 0.0f);
  ExpectValid(*job);
  EXPECT_THAT(Apply(R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1,
                        "weight_decay": 1e-4}}})",
                    BaseJob()),
              IsErrorWith("optimizer.params.weight_decay: torch.optim.SGD adds"));
  EXPECT_THAT(Apply(R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "nesterov": true}}})",
                    BaseJob()),
              IsErrorWith("optimizer.params.nesterov"));
}

// ---- precision -------------------------------------------------------------------------------

TEST(DeepSpeedConfigTest, Fp16LossScaleKeysMap) {
  absl::StatusOr<JobSpec> job = Apply(R"({"fp16": {"enabled": true, "loss_scale": 0,
      "initial_scale_power": 12, "loss_scale_window": 500, "hysteresis": 4,
      "min_loss_scale": 0.5, "consecutive_hysteresis": true}})",
                                      BaseJob());
  ASSERT_TRUE(job.ok()) << job.status();
  const zerotrain::LossScaleConfig& ls = job->precision().loss_scale();
  EXPECT_FALSE(ls.has_static_scale());
  EXPECT_EQ(ls.initial_power(), 12);
  EXPECT_EQ(ls.window(), 500);
  EXPECT_EQ(ls.hysteresis(), 4);
  EXPECT_FLOAT_EQ(ls.min_scale(), 0.5f);
  EXPECT_TRUE(ls.consecutive_hysteresis());
  ExpectValid(*job);
  job = Apply(R"({"fp16": {"enabled": true, "loss_scale": 128}})", BaseJob());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_FLOAT_EQ(job->precision().loss_scale().static_scale(), 128.0f);
  EXPECT_THAT(Apply(R"({"fp16": {"enabled": true, "initial_scale_power": 65}})", BaseJob()),
              IsErrorWith("fp16.initial_scale_power: must be in [0, 64] (got 65)"));
}

TEST(DeepSpeedConfigTest, Bf16AndDataTypes) {
  absl::StatusOr<JobSpec> job = Apply(
      R"({"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp32"},
          "communication_data_type": "fp32"})",
      BaseJob());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->precision().param_dtype(), PrecisionConfig::BF16);
  EXPECT_EQ(job->precision().compute_dtype(), PrecisionConfig::BF16);
  EXPECT_EQ(job->precision().grad_dtype(), PrecisionConfig::FP32);
  EXPECT_EQ(job->precision().reduce_dtype(), PrecisionConfig::FP32);
  EXPECT_TRUE(job->precision().master_weights());
  ExpectValid(*job);
  // fp16 disabled changes nothing.
  job = Apply(R"({"fp16": {"enabled": false, "loss_scale": 64}})", BaseJob());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->precision().param_dtype(), PrecisionConfig::DTYPE_UNSPECIFIED);
  EXPECT_FALSE(job->precision().loss_scale().has_static_scale());
}

TEST(DeepSpeedConfigTest, Fp16AndBf16TogetherIsRefused) {
  EXPECT_THAT(Apply(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})", BaseJob()),
              IsErrorWith("ds.json: bf16.enabled: fp16.enabled and bf16.enabled are both true"));
}

// ---- ZeRO and activation checkpointing -------------------------------------------------------

TEST(DeepSpeedConfigTest, PrefetchBucketInElementsIsRefused) {
  EXPECT_THAT(Apply(R"({"zero_optimization": {"stage": 3,
                        "stage3_prefetch_bucket_size": 5e8}})",
                    BaseJob()),
              IsErrorWith("zero_optimization.stage3_prefetch_bucket_size: ZeroTrain prefetches "
                          "whole units"));
  EXPECT_TRUE(Apply(R"({"zero_optimization": {"stage": 3,
                        "stage3_prefetch_bucket_size": "auto"}})",
                    BaseJob())
                  .ok());
  EXPECT_THAT(Apply(R"({"zero_optimization": {"stage": 4}})", BaseJob()),
              IsErrorWith("zero_optimization.stage: must be in [0, 3] (got 4)"));
}

TEST(DeepSpeedConfigTest, ActivationCheckpointingIsFullUnlessTheJobNamesAPolicy) {
  const std::string config = R"({"activation_checkpointing": {"partition_activations": false,
      "cpu_checkpointing": false, "contiguous_memory_optimization": false,
      "number_checkpoints": null, "synchronize_checkpoint_boundary": false, "profile": false}})";
  absl::StatusOr<JobSpec> job = Apply(config, BaseJob());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->memory().activation_checkpointing(), MemoryConfig::FULL);
  job = Apply(config, BaseJob("memory: {activation_checkpointing: SELECTIVE}\n"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->memory().activation_checkpointing(), MemoryConfig::SELECTIVE);
  EXPECT_THAT(Apply(R"({"activation_checkpointing": {"cpu_checkpointing": true}})", BaseJob()),
              IsErrorWith("activation_checkpointing.cpu_checkpointing: true offloads"));
}

// Every other value ZeroTrain cannot honour, each named with its field.
TEST(DeepSpeedConfigTest, EachRefusalNamesItsField) {
  const struct {
    const char* config;
    const char* error;
  } kCases[] = {
      {R"({"fp16": {"enabled": true, "fp16_master_weights_and_grads": true}})",
       "fp16.fp16_master_weights_and_grads: true keeps master weights"},
      {R"({"optimizer": {"type": "Adam", "params": {"bias_correction": false}}})",
       "optimizer.params.bias_correction: false turns"},
      {R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "dampening": 0.1}}})",
       "optimizer.params.dampening: must be 0"},
      {R"({"optimizer": {"type": "SGD", "params": {"momentum": 0.9}}})",
       "optimizer.params.lr: SGD needs a learning rate"},
      {R"({"optimizer": {"params": {"lr": 0.1}}})", "optimizer.type: must name the optimizer"},
      {R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "linear",
           "last_batch_iteration": 99}}})",
       "scheduler.params.last_batch_iteration: must be -1"},
      {R"({"scheduler": {"type": "WarmupCosineLR", "params": {"warmup_type": "linear"}}})",
       "scheduler.params.total_num_steps: is required by this scheduler"},
      {R"({"zero_optimization": {"load_from_fp32_weights": false}})",
       "zero_optimization.load_from_fp32_weights: false resumes"},
      {R"({"zero_optimization": {"overlap_comm": "yes"}})",
       "zero_optimization.overlap_comm: must be true, false or \"auto\""},
      {R"({"gradient_predivide_factor": 2.0})", "gradient_predivide_factor: must be 1.0"},
      {R"({"gradient_clipping": -1})", "gradient_clipping: must be in [0, "},
      {R"({"data_types": {"grad_accum_dtype": "int8"}})",
       "data_types.grad_accum_dtype: must be \"fp32\", \"fp16\" or \"bf16\" (got \"int8\")"},
      {R"({"bf16": {"enabled": true}, "bfloat16": {"enabled": true}})",
       "bfloat16: is DeepSpeed's other spelling of bf16"},
      {R"({"train_micro_batch_size_per_gpu": 2.5})",
       "train_micro_batch_size_per_gpu: must be an integer or \"auto\" (got 2.5)"},
  };
  for (const auto& c : kCases) {
    EXPECT_THAT(Apply(c.config, BaseJob()), IsErrorWith(std::string("ds.json: ") + c.error))
        << c.config;
  }
}

// ---- the file as a whole ----------------------------------------------------------------------

TEST(DeepSpeedConfigTest, MalformedJsonNamesLineAndColumn) {
  EXPECT_THAT(Apply("{\n  \"train_batch_size\": 8,\n  \"fp16\": {\"enabled\": tru}\n}", BaseJob()),
              IsErrorWith("ds.json: malformed JSON: parse error at line 3, column"));
  EXPECT_THAT(Apply("[1, 2]", BaseJob()), IsErrorWith("a DeepSpeed config is a JSON object"));
  EXPECT_THAT(Apply(R"({"fp16": {"enabled": true, "enabled": false}})", BaseJob()),
              IsErrorWith("ds.json: \"enabled\" is given twice in one object"));
  // A number past double's range is malformed, not a crash; so is nesting a million deep.
  EXPECT_THAT(Apply(R"({"train_batch_size": 1e999})", BaseJob()),
              IsErrorWith("ds.json: malformed JSON"));
  EXPECT_THAT(Apply(R"({"steps_per_print": )" + std::string(1'000'000, '[') + "}", BaseJob()),
              IsErrorWith("ds.json: malformed JSON"));
  // The same key in two objects is no duplicate.
  EXPECT_TRUE(Apply(R"({"fp16": {"enabled": false}, "bf16": {"enabled": true}})", BaseJob()).ok());
}

TEST(DeepSpeedConfigTest, UnknownKeysAreRefusedAndNoOpKeysAccepted) {
  EXPECT_THAT(Apply(R"({"train_batch_size": 8, "sparse_attention": {"mode": "fixed"}})", BaseJob()),
              IsErrorWith("ds.json: sparse_attention: not a key ZeroTrain maps"));
  EXPECT_THAT(Apply(R"({"zero_optimization": {"stage": 1, "mics_shard_size": 8}})", BaseJob()),
              IsErrorWith("zero_optimization.mics_shard_size: not a key ZeroTrain maps"));
  // Logging and profiling keys change nothing: the job comes back as it went in.
  const JobSpec base = BaseJob();
  absl::StatusOr<JobSpec> job = Apply(R"({"steps_per_print": 10, "wall_clock_breakdown": true,
      "memory_breakdown": false, "tensorboard": {"enabled": true, "output_path": "tb/"},
      "flops_profiler": {"enabled": false}, "prescale_gradients": false,
      "gradient_predivide_factor": 1.0})",
                                      base);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->SerializeAsString(), base.SerializeAsString());
  // Control characters in a key or value are escaped in the message, never echoed raw.
  EXPECT_THAT(Apply("{\"bad\\nkey\": 1}", BaseJob()),
              IsErrorWith("ds.json: \"bad\\nkey\": not a key"));
  EXPECT_THAT(Apply(R"({"optimizer": {"type": "Lamb\nzt: forged"}})", BaseJob()),
              IsErrorWith("optimizer.type: \"Lamb\\nzt: forged\" has no"));
  EXPECT_THAT(Apply(R"({"prescale_gradients": true})", BaseJob()),
              IsErrorWith("prescale_gradients: true divides gradients"));
  EXPECT_THAT(Apply(R"({"steps_per_print": "often"})", BaseJob()),
              IsErrorWith("steps_per_print: must be an integer"));
}

// Validation runs on the job the two files make together, and its errors name both files.
TEST(DeepSpeedConfigTest, LoadValidatedJobChecksTheCombinationNamingBothFiles) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("zt-ds-load-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string job = (dir / "job.yaml").string(), ds = (dir / "ds.json").string();
  std::ofstream(job) << "name: ds\n"
                        "model: {family: GPT2, n_layer: 2, n_head: 4, d_model: 64,"
                        " vocab_size: 256, max_seq_len: 64}\n"
                        "data: {train: [train.bin], seq_len: 32}\n"
                        "train: {micro_batch_size: 2, max_steps: 10}\n"
                        "optimizer: {lr: 1.0e-3}\n"
                        "precision: {param_dtype: BF16, stochastic_rounding: true}\n";
  std::ofstream(ds) << R"({"fp16": {"enabled": true}, "train_batch_size": 8})";
  const JobLoadOptions options{
      .check_paths = false, .check_engine_support = false, .deepspeed_config = ds};
  absl::StatusOr<JobSpec> loaded = LoadValidatedJob(job, options);
  EXPECT_THAT(loaded, IsErrorWith(job + " with " + ds +
                                  ": precision.stochastic_rounding: requires "
                                  "precision.param_dtype BF16"));
  std::ofstream(ds) << R"({"bf16": {"enabled": true}, "train_batch_size": 8})";
  loaded = LoadValidatedJob(job, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->train().micro_batch_size(), 8);
  // The planner's copy keeps what neither file sets open.
  loaded = LoadJobForPlanning(job, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_FALSE(loaded->parallel().has_zero_stage());
  std::filesystem::remove_all(dir);
}

TEST(DeepSpeedConfigTest, MissingFileIsNotFound) {
  EXPECT_EQ(ApplyDeepSpeedConfigFile(DataPath("no-such.json"), BaseJob()).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace zt

namespace zt {
namespace {

TEST(DeepSpeedConfigTest, AutoTpSizeIsTensorParallelAndDividesTheBatchRulesWorld) {
  // 8 ranks at autotp_size 4: 2 data-parallel ranks, so 16 = 4 × 2 × 2.
  absl::StatusOr<JobSpec> job = Apply(R"({"tensor_parallel": {"autotp_size": 4},
                                          "train_batch_size": 16,
                                          "train_micro_batch_size_per_gpu": 4})",
                                      WithWorld(BaseJob(), 8));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->parallel().tensor_parallel(), 4);
  EXPECT_EQ(job->train().grad_accum_steps(), 2);
  ExpectValid(*job);
  EXPECT_THAT(Apply(R"({"tensor_parallel": {"autotp_size": 0}})", BaseJob()),
              IsErrorWith("ds.json: tensor_parallel.autotp_size: must be in [1, "));
  EXPECT_THAT(Apply(R"({"tensor_parallel": {"tp_size": 2}})", BaseJob()),
              IsErrorWith("ds.json: tensor_parallel.tp_size: not a key ZeroTrain maps"));
}

}  // namespace
}  // namespace zt
