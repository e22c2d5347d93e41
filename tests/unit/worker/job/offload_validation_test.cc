// Tests of worker/job/offload_validation.h, and of the offload lines of ValidateJobSpec,
// CheckJobPaths, CheckEngineSupport, AllowedRoots::CheckJob and ApplyJobDefaults.
#include "worker/job/offload_validation.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/job/test_jobs.h"
#include "worker/job/allowed_roots.h"
#include "worker/job/job_defaults.h"
#include "worker/job/job_validation.h"

namespace zt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using zerotrain::JobSpec;
using zerotrain::ModelConfig;
using zerotrain::OffloadConfig;

JobSpec Valid() { return testing::JobWithDefaults(testing::kMinimalYaml); }

TEST(OffloadDefaultsTest, AreDeepSpeeds) {
  const JobSpec job = Valid();
  EXPECT_EQ(job.offload().optimizer(), OffloadConfig::NONE);
  EXPECT_EQ(job.offload().params(), OffloadConfig::NONE);
  EXPECT_FALSE(job.offload().pin_memory());
  // offload_optimizer's buffer_count; offload_param's is 5.
  EXPECT_EQ(job.offload().buffer_count(), 4);
  // 1e8 16-bit elements in bytes, rounded up to 4096.
  EXPECT_EQ(job.offload().buffer_size(), 200003584);
  EXPECT_EQ(job.offload().buffer_size() % 4096, 0);
  EXPECT_EQ(job.offload().aio().block_size(), 1048576);
  EXPECT_EQ(job.offload().aio().queue_depth(), 8);
  EXPECT_EQ(job.resources().device_memory_bytes(), 0);

  const JobSpec params = testing::JobWithDefaults(
      (std::string(testing::kMinimalYaml) +
       "parallel: {zero_stage: 3}\noffload: {params: CPU, buffer_count: 7}\n")
          .c_str());
  EXPECT_EQ(params.offload().buffer_count(), 7);  // a value the job sets stands
  const JobSpec params_default = testing::JobWithDefaults(
      (std::string(testing::kMinimalYaml) + "parallel: {zero_stage: 3}\noffload: {params: NVME}\n")
          .c_str());
  EXPECT_EQ(params_default.offload().buffer_count(), 5);
}

TEST(OffloadValidationTest, TheDefaultsAndEveryLegalCombinationPass) {
  EXPECT_TRUE(OffloadViolations(Valid()).empty());
  for (int stage = 1; stage <= 3; ++stage) {
    for (OffloadConfig::Device optimizer : {OffloadConfig::CPU, OffloadConfig::NVME}) {
      JobSpec job = Valid();
      job.mutable_parallel()->set_zero_stage(stage);
      job.mutable_offload()->set_optimizer(optimizer);
      job.mutable_offload()->set_nvme_path("/swap");
      if (stage == 3) job.mutable_offload()->set_params(OffloadConfig::NVME);
      EXPECT_TRUE(OffloadViolations(job).empty()) << stage << " " << optimizer;
      EXPECT_TRUE(ValidateJobSpec(job).ok()) << ValidateJobSpec(job);
    }
  }
}

struct Case {
  const char* label;
  std::function<void(JobSpec&)> mutate;
  const char* line;
};

TEST(OffloadValidationTest, EachRuleNamesTheFieldTheValueAndTheRule) {
  const Case cases[] = {
      {"optimizer needs stage >= 1",
       [](JobSpec& s) { s.mutable_offload()->set_optimizer(OffloadConfig::CPU); },
       "offload.optimizer: CPU needs parallel.zero_stage >= 1 (got 0): the offloaded optimizer "
       "state is the rank's ZeRO shard"},
      {"params needs stage 3",
       [](JobSpec& s) {
         s.mutable_parallel()->set_zero_stage(2);
         s.mutable_offload()->set_params(OffloadConfig::CPU);
       },
       "offload.params: CPU needs parallel.zero_stage 3 (got 2): only stage 3 shards the "
       "parameters"},
      {"nvme needs a path",
       [](JobSpec& s) {
         s.mutable_parallel()->set_zero_stage(1);
         s.mutable_offload()->set_optimizer(OffloadConfig::NVME);
       },
       "offload.nvme_path: required when offload.optimizer (NVME) or offload.params (NONE) is "
       "NVME: the swap store's directory"},
      {"split master",
       [](JobSpec& s) {
         s.mutable_parallel()->set_zero_stage(1);
         s.mutable_precision()->set_param_dtype(zerotrain::PrecisionConfig::BF16);
         s.mutable_precision()->set_master_weights(true);
         s.mutable_precision()->set_split_master_weights(true);
         s.mutable_offload()->set_optimizer(OffloadConfig::CPU);
       },
       "offload.optimizer: CPU cannot be combined with precision.split_master_weights (the "
       "master weights' high halves are the device's parameters)"},
      {"unknown device",
       [](JobSpec& s) { s.mutable_offload()->set_params(static_cast<OffloadConfig::Device>(9)); },
       "offload.params: must be NONE, CPU or NVME (got 9)"},
      {"unset device",
       [](JobSpec& s) { s.mutable_offload()->set_optimizer(OffloadConfig::DEVICE_UNSPECIFIED); },
       "offload.optimizer: must be NONE, CPU or NVME (got DEVICE_UNSPECIFIED)"},
      {"buffer_count", [](JobSpec& s) { s.mutable_offload()->set_buffer_count(0); },
       "offload.buffer_count: must be in 1..1024 (got 0)"},
      {"buffer_size aligned", [](JobSpec& s) { s.mutable_offload()->set_buffer_size(100000); },
       "offload.buffer_size: must be a positive multiple of 4096 bytes (the swap store's "
       "O_DIRECT unit), at most 1099511627776 (got 100000)"},
      {"buffer_size positive", [](JobSpec& s) { s.mutable_offload()->set_buffer_size(-4096); },
       "offload.buffer_size: must be a positive multiple of 4096 bytes (the swap store's "
       "O_DIRECT unit), at most 1099511627776 (got -4096)"},
      {"block_size aligned",
       [](JobSpec& s) { s.mutable_offload()->mutable_aio()->set_block_size(1000); },
       "offload.aio.block_size: must be a positive multiple of 4096 bytes (the swap store's "
       "O_DIRECT unit), at most 1073741824 (got 1000)"},
      {"block_size zero", [](JobSpec& s) { s.mutable_offload()->mutable_aio()->set_block_size(0); },
       "offload.aio.block_size: must be a positive multiple of 4096 bytes (the swap store's "
       "O_DIRECT unit), at most 1073741824 (got 0)"},
      {"queue_depth", [](JobSpec& s) { s.mutable_offload()->mutable_aio()->set_queue_depth(4097); },
       "offload.aio.queue_depth: must be in 1..4096 (got 4097)"},
      {"unset buffer_count", [](JobSpec& s) { s.mutable_offload()->clear_buffer_count(); },
       "offload.buffer_count: not set (ApplyJobDefaults must run before validation)"},
      {"device memory", [](JobSpec& s) { s.mutable_resources()->set_device_memory_bytes(-1); },
       "resources.device_memory_bytes: must be >= 0 (got -1)"},
  };
  for (const Case& c : cases) {
    JobSpec job = Valid();
    c.mutate(job);
    EXPECT_THAT(OffloadViolations(job), ElementsAre(c.line)) << c.label;
    // ValidateJobSpec reports the same line, as InvalidArgument.
    const absl::Status status = ValidateJobSpec(job);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.label;
    EXPECT_THAT(testing::Lines(status), ElementsAre(c.line)) << c.label;
  }
}

class NvmePathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("zt_nvme_path_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_ / "swap");
    std::ofstream(dir_ / "file") << "x";
  }
  void TearDown() override {
    ::chmod((dir_ / "swap").c_str(), 0755);
    std::filesystem::remove_all(dir_);
  }
  JobSpec NvmeJob(const std::string& path) const {
    JobSpec job = Valid();
    job.mutable_parallel()->set_zero_stage(3);
    job.mutable_offload()->set_params(OffloadConfig::NVME);
    job.mutable_offload()->set_nvme_path(path);
    return job;
  }
  std::filesystem::path dir_;
};

TEST_F(NvmePathTest, AnExistingWritableDirectoryPasses) {
  EXPECT_TRUE(CheckNvmePath(NvmeJob((dir_ / "swap").string())).ok());
  // Unused, the path is not looked at (DeepSpeed ignores it too).
  JobSpec cpu = NvmeJob((dir_ / "missing").string());
  cpu.mutable_offload()->set_params(OffloadConfig::CPU);
  EXPECT_TRUE(CheckNvmePath(cpu).ok());
}

TEST_F(NvmePathTest, MissingOrNotADirectoryIsRefusedNamingThePath) {
  const std::string missing = (dir_ / "missing").string();
  absl::Status status = CheckNvmePath(NvmeJob(missing));
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(status.message(),
            "offload.nvme_path directory '" + missing + "' does not exist; create it first");

  const std::string file = (dir_ / "file").string();
  status = CheckNvmePath(NvmeJob(file));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "offload.nvme_path path '" + file + "' is not a directory");

  // CheckJobPaths carries the line and its code (data files are missing too: NotFound wins).
  status = CheckJobPaths(NvmeJob(missing));
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("offload.nvme_path directory '" + missing + "'"));
}

TEST_F(NvmePathTest, AnUnwritableDirectoryIsPermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into a mode 0555 directory anyway";
  const std::filesystem::path locked = dir_ / "swap";
  ASSERT_EQ(::chmod(locked.c_str(), 0555), 0);
  const absl::Status status = CheckNvmePath(NvmeJob(locked.string()));
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(),
              HasSubstr("offload.nvme_path directory '" + locked.string() + "' is not writable"));
}

TEST_F(NvmePathTest, AllowedRootsRefuseAnNvmePathOutsideThemOnlyWhenNvmeIsUsed) {
  absl::StatusOr<AllowedRoots> roots = AllowedRoots::Create({(dir_ / "swap").string()});
  ASSERT_TRUE(roots.ok()) << roots.status();
  JobSpec job = NvmeJob("/var/tmp/elsewhere");
  job.mutable_data()->set_train(0, (dir_ / "swap" / "train.bin").string());
  const absl::Status status = roots->CheckJob(job);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(), HasSubstr("offload.nvme_path /var/tmp/elsewhere is outside the "
                                          "allowed roots"));
  JobSpec inside = NvmeJob((dir_ / "swap" / "store").string());
  inside.mutable_data()->set_train(0, (dir_ / "swap" / "train.bin").string());
  EXPECT_TRUE(roots->CheckJob(inside).ok()) << roots->CheckJob(inside);
  // Offloaded to the CPU only, the path is not the job's: not checked.
  job.mutable_offload()->set_params(OffloadConfig::CPU);
  EXPECT_TRUE(roots->CheckJob(job).ok()) << roots->CheckJob(job);
}

TEST(OffloadEngineSupportTest, TrainsEveryOffloadWhereTheEngineRunsIt) {
  JobSpec job = Valid();
  job.mutable_parallel()->set_zero_stage(3);
  job.mutable_offload()->set_optimizer(OffloadConfig::CPU);
  EXPECT_TRUE(CheckEngineSupport(job).ok()) << CheckEngineSupport(job);
  job.mutable_offload()->set_params(OffloadConfig::NVME);
  job.mutable_offload()->set_nvme_path("/swap");
  EXPECT_TRUE(ValidateJobSpec(job).ok()) << ValidateJobSpec(job);
  // Swapped parameters go with swapped states.
  absl::Status status = CheckEngineSupport(job);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(testing::Lines(status),
              ElementsAre("offload.params: NVME trains with offload.optimizer NVME (the shards "
                          "are swapped with the states, in their generation) so far"));
  job.mutable_offload()->set_optimizer(OffloadConfig::NVME);
  EXPECT_TRUE(CheckEngineSupport(job).ok()) << CheckEngineSupport(job);
  job.mutable_offload()->set_optimizer(OffloadConfig::CPU);
  // The parameters in host memory train beside the optimizer's offload, on CPU ranks.
  job.mutable_offload()->set_params(OffloadConfig::CPU);
  EXPECT_TRUE(CheckEngineSupport(job).ok()) << CheckEngineSupport(job);
  job.mutable_offload()->set_optimizer(OffloadConfig::NVME);
  EXPECT_TRUE(CheckEngineSupport(job).ok()) << CheckEngineSupport(job);
  job.mutable_offload()->set_optimizer(OffloadConfig::NONE);
  EXPECT_THAT(testing::Lines(CheckEngineSupport(job)),
              ElementsAre("offload.params: CPU trains with offload.optimizer CPU or NVME (the "
                          "step updates the host shards in place) so far"));
  job.mutable_offload()->set_optimizer(OffloadConfig::CPU);
  // ... and on CUDA ranks, through the rank's copy engine (offload_separate_memory_test.cc).
  job.mutable_resources()->set_device(zerotrain::ResourceConfig::CUDA);
  EXPECT_TRUE(CheckEngineSupport(job).ok()) << CheckEngineSupport(job);
  job.mutable_resources()->set_device(zerotrain::ResourceConfig::CPU);
  // Optimizer states on NVMe train.
  job.mutable_offload()->set_params(OffloadConfig::NONE);
  job.mutable_offload()->set_optimizer(OffloadConfig::NVME);
  EXPECT_TRUE(CheckEngineSupport(job).ok()) << CheckEngineSupport(job);
  // ... with at least three ring buffers; the host step of CPU offload with one.
  job.mutable_offload()->set_buffer_count(2);
  EXPECT_THAT(testing::Lines(CheckEngineSupport(job)),
              ElementsAre("offload.buffer_count: 2 — the host optimizer step needs 3 ring "
                          "buffers or more (gradients down, parameters up, a unit's states in "
                          "and out of the swap store; twice the states' to read the next unit "
                          "ahead)"));
  job.mutable_offload()->set_optimizer(OffloadConfig::CPU);
  job.mutable_offload()->set_buffer_count(1);
  EXPECT_TRUE(CheckEngineSupport(job).ok()) << CheckEngineSupport(job);
}

}  // namespace
}  // namespace zt

namespace zt {
namespace {

// A LoRA job's frozen base shards train in the pinned host pool (offload.params CPU) and
// swapped (NVME, worker/offload/swapped_base.h), beside any optimizer offload or none (nothing
// updates the base), on pipeline stages and tensor-parallel ranks too, seeded or streamed from
// model.init_from.
TEST(OffloadEngineSupportTest, LoraBaseShardsTrainOnTheHostAndSwapped) {
  JobSpec job = Valid();
  job.mutable_parallel()->set_zero_stage(3);
  job.mutable_model()->mutable_lora()->set_rank(4);
  for (const auto params : {OffloadConfig::CPU, OffloadConfig::NVME}) {
    job.mutable_offload()->set_params(params);
    for (const auto optimizer : {OffloadConfig::NONE, OffloadConfig::CPU, OffloadConfig::NVME}) {
      job.mutable_offload()->set_optimizer(optimizer);
      EXPECT_TRUE(CheckEngineSupport(job).ok())
          << OffloadConfig::Device_Name(params) << " " << OffloadConfig::Device_Name(optimizer)
          << ": " << CheckEngineSupport(job);
    }
  }
  // A quantized base streamed from model.init_from goes to the store a whole unit at a time.
  JobSpec streamed = job;
  streamed.mutable_model()->set_base_dtype(ModelConfig::NF4);
  streamed.mutable_model()->set_init_from("/models/base");
  EXPECT_TRUE(CheckEngineSupport(streamed).ok()) << CheckEngineSupport(streamed);
  // Each pipeline stage and tensor-parallel rank swaps its own share of the base.
  JobSpec staged = job;
  staged.mutable_parallel()->set_world_size(2);
  staged.mutable_parallel()->set_pipeline_parallel(2);
  staged.mutable_parallel()->set_micro_batches(2);
  EXPECT_TRUE(CheckEngineSupport(staged).ok()) << CheckEngineSupport(staged);
  JobSpec split = job;
  split.mutable_parallel()->set_world_size(2);
  split.mutable_parallel()->set_tensor_parallel(2);
  EXPECT_TRUE(CheckEngineSupport(split).ok()) << CheckEngineSupport(split);
  // Without model.lora, swapped shards still go with the optimizer's states.
  job.clear_model();
  job.mutable_model()->CopyFrom(Valid().model());
  job.mutable_offload()->set_optimizer(OffloadConfig::CPU);
  EXPECT_THAT(testing::Lines(CheckEngineSupport(job)),
              ElementsAre("offload.params: NVME trains with offload.optimizer NVME (the shards are "
                          "swapped with the states, in their generation) so far"));
}

// offload.delayed_update (ZeRO-Offload's DPU): off by default, 40 serial steps before it
// starts; validation asks for a host step, the engine for what its thread can run beside.
TEST(DelayedUpdateValidationTest, DefaultsOffAfterFortySteps) {
  const JobSpec job = Valid();
  EXPECT_FALSE(job.offload().delayed_update().enabled());
  EXPECT_EQ(job.offload().delayed_update().after_steps(), 40);
  const JobSpec set = testing::JobWithDefaults(
      (std::string(testing::kMinimalYaml) +
       "parallel: {zero_stage: 1}\noffload: {optimizer: CPU, delayed_update: {enabled: true, "
       "after_steps: 0}}\n")
          .c_str());
  EXPECT_TRUE(set.offload().delayed_update().enabled());
  EXPECT_EQ(set.offload().delayed_update().after_steps(), 0);  // a value the job sets stands
  EXPECT_TRUE(OffloadViolations(set).empty());
  EXPECT_TRUE(CheckEngineSupport(set).ok()) << CheckEngineSupport(set);
}

TEST(DelayedUpdateValidationTest, NeedsAHostStepAndANonNegativeWarmUp) {
  JobSpec job = Valid();
  job.mutable_parallel()->set_zero_stage(1);
  job.mutable_offload()->mutable_delayed_update()->set_enabled(true);
  EXPECT_THAT(OffloadViolations(job),
              ElementsAre("offload.delayed_update.enabled: true needs offload.optimizer CPU or "
                          "NVME (got NONE): it overlaps the host optimizer step with the next "
                          "step"));
  EXPECT_THAT(testing::Lines(ValidateJobSpec(job)),
              ::testing::Contains(HasSubstr("offload.delayed_update.enabled")));
  job.mutable_offload()->set_optimizer(OffloadConfig::CPU);
  job.mutable_offload()->mutable_delayed_update()->set_after_steps(-1);
  EXPECT_THAT(OffloadViolations(job),
              ElementsAre("offload.delayed_update.after_steps: must be >= 0 (got -1)"));
  // Off, its fields are not the job's business beyond their range.
  job.mutable_offload()->mutable_delayed_update()->set_after_steps(3);
  job.mutable_offload()->set_optimizer(OffloadConfig::NONE);
  job.mutable_offload()->mutable_delayed_update()->set_enabled(false);
  EXPECT_TRUE(OffloadViolations(job).empty());
}

TEST(DelayedUpdateEngineSupportTest, RefusesByNameWhatItsThreadCannotRunBeside) {
  JobSpec job = Valid();
  job.mutable_parallel()->set_zero_stage(2);
  job.mutable_parallel()->set_world_size(2);
  job.mutable_parallel()->set_shard_group_size(2);
  job.mutable_offload()->set_optimizer(OffloadConfig::CPU);
  job.mutable_offload()->mutable_delayed_update()->set_enabled(true);
  ASSERT_TRUE(CheckEngineSupport(job).ok()) << CheckEngineSupport(job);
  const auto refused = [&](const JobSpec& j, const std::string& rule) {
    EXPECT_TRUE(ValidateJobSpec(j).ok()) << ValidateJobSpec(j);  // valid, not yet trained
    const absl::Status status = CheckEngineSupport(j);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << rule;
    EXPECT_THAT(
        testing::Lines(status),
        ElementsAre(absl::StrCat("offload.delayed_update.enabled: true trains ", rule, " so far")));
  };
  // NVMe offload trains: its delayed step streams the states on its own thread.
  JobSpec nvme = job;
  nvme.mutable_offload()->set_optimizer(OffloadConfig::NVME);
  nvme.mutable_offload()->set_nvme_path("/swap");
  EXPECT_TRUE(CheckEngineSupport(nvme).ok()) << CheckEngineSupport(nvme);
  // Host shards train (the host step writes their second bank, params.host), and so do
  // swapped ones (it writes the store's next generation, committed at the switch).
  JobSpec params = job;
  params.mutable_parallel()->set_zero_stage(3);
  params.mutable_offload()->set_params(OffloadConfig::CPU);
  EXPECT_TRUE(CheckEngineSupport(params).ok()) << CheckEngineSupport(params);
  params.mutable_offload()->set_params(OffloadConfig::NVME);
  params.mutable_offload()->set_optimizer(OffloadConfig::NVME);
  params.mutable_offload()->set_nvme_path("/swap");
  EXPECT_TRUE(ValidateJobSpec(params).ok()) << ValidateJobSpec(params);
  EXPECT_TRUE(CheckEngineSupport(params).ok()) << CheckEngineSupport(params);
  JobSpec fp16 = job;
  fp16.mutable_precision()->set_param_dtype(zerotrain::PrecisionConfig::FP16);
  fp16.mutable_precision()->set_compute_dtype(zerotrain::PrecisionConfig::FP16);
  fp16.mutable_precision()->set_grad_dtype(zerotrain::PrecisionConfig::FP16);
  fp16.mutable_precision()->set_reduce_dtype(zerotrain::PrecisionConfig::FP16);
  fp16.mutable_precision()->set_master_weights(true);
  refused(fp16,
          "without FP16 in precision (fp16's dynamic loss scaling must skip an overflowing "
          "step's update, which a delayed update learns of only after the next step has "
          "computed on it; use BF16 or FP32)");
  // A sharded Adafactor trains: its statistics sums go over contexts of their own
  // (worker/shard/host_step_sums.h). So does one rank's, which sums nothing.
  JobSpec adafactor = job;
  adafactor.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAFACTOR);
  EXPECT_TRUE(CheckEngineSupport(adafactor).ok()) << CheckEngineSupport(adafactor);
  adafactor.mutable_parallel()->set_world_size(1);
  adafactor.mutable_parallel()->set_shard_group_size(1);
  EXPECT_TRUE(CheckEngineSupport(adafactor).ok()) << CheckEngineSupport(adafactor);
  // Tensor and pipeline parallelism train: a step's collectives stay on the compute thread.
  for (const auto& [tp, pp] : {std::pair{2, 1}, std::pair{1, 2}, std::pair{2, 2}}) {
    JobSpec split = job;
    split.mutable_parallel()->set_world_size(2 * tp * pp);
    split.mutable_parallel()->set_shard_group_size(2);
    split.mutable_parallel()->set_tensor_parallel(tp);
    split.mutable_parallel()->set_pipeline_parallel(pp);
    if (pp > 1) {  // a stage at ZeRO 2 accumulates its micro-batches
      split.mutable_train()->set_grad_accum_steps(2);
      split.mutable_parallel()->set_micro_batches(2);
    }
    EXPECT_TRUE(ValidateJobSpec(split).ok()) << ValidateJobSpec(split);
    EXPECT_TRUE(CheckEngineSupport(split).ok())
        << tp << "x" << pp << ": " << CheckEngineSupport(split);
  }
}

}  // namespace
}  // namespace zt
