#include "worker/job/job_validation.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/job/test_jobs.h"

namespace zt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;
using zerotrain::JobSpec;
using zerotrain::ModelConfig;
using zerotrain::OptimizerConfig;
using zerotrain::PrecisionConfig;
using zerotrain::ResourceConfig;

JobSpec Valid() { return testing::JobWithDefaults(testing::kMinimalYaml); }

TEST(ValidateJobSpecTest, AcceptsAValidJob) {
  EXPECT_TRUE(ValidateJobSpec(Valid()).ok()) << ValidateJobSpec(Valid());
  // The full job breaks no schema rule; what the engine cannot run yet is another check.
  EXPECT_TRUE(ValidateJobSpec(testing::JobWithDefaults(testing::kFullYaml)).ok());
}

struct RuleCase {
  const char* label;
  std::function<void(JobSpec&)> mutate;
  const char* line;  // The single violation line expected.
};

TEST(ValidateJobSpecTest, EachRuleNamesTheFieldTheValueAndTheRule) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const RuleCase cases[] = {
      {"name chars", [](JobSpec& s) { s.set_name("my job"); },
       "name: may hold only [A-Za-z0-9._-], found byte 0x20 at position 2"},
      {"name length", [](JobSpec& s) { s.set_name(std::string(129, 'a')); },
       "name: 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...' has 129 characters; at most 128 are "
       "allowed"},
      {"family", [](JobSpec& s) { s.mutable_model()->set_family(ModelConfig::FAMILY_UNSPECIFIED); },
       "model.family: must be GPT2 or LLAMA (got FAMILY_UNSPECIFIED)"},
      {"n_layer", [](JobSpec& s) { s.mutable_model()->set_n_layer(0); },
       "model.n_layer: must be >= 1 (got 0)"},
      {"d_model divisible",
       [](JobSpec& s) {
         s.mutable_model()->set_d_model(250);
         s.mutable_model()->set_d_ff(1000);
       },
       "model.d_model: 250 is not divisible by model.n_head 4"},
      {"gpt2 kv heads", [](JobSpec& s) { s.mutable_model()->set_n_kv_head(2); },
       "model.n_kv_head: GPT2 requires n_kv_head == n_head (got 2, n_head 4)"},
      {"kv heads divide",
       [](JobSpec& s) {
         s.mutable_model()->set_family(ModelConfig::LLAMA);
         s.mutable_model()->set_n_head(6);
         s.mutable_model()->set_d_model(96);
         s.mutable_model()->set_n_kv_head(4);
       },
       "model.n_head: 6 is not divisible by model.n_kv_head 4"},
      {"kv heads >= 1", [](JobSpec& s) { s.mutable_model()->set_n_kv_head(0); },
       "model.n_kv_head: must be >= 1 (got 0)"},
      {"rope head size",
       [](JobSpec& s) {
         s.mutable_model()->set_family(ModelConfig::LLAMA);
         s.mutable_model()->set_d_model(36);
       },
       "model.d_model: LLAMA needs an even head size for RoPE (d_model 36 / n_head 4 = 9)"},
      {"d_ff", [](JobSpec& s) { s.mutable_model()->set_d_ff(0); },
       "model.d_ff: must be >= 1 (got 0)"},
      {"vocab", [](JobSpec& s) { s.mutable_model()->set_vocab_size(1); },
       "model.vocab_size: must be >= 2 (got 1)"},
      {"norm_eps", [](JobSpec& s) { s.mutable_model()->set_norm_eps(0); },
       "model.norm_eps: must be > 0 (got 0)"},
      {"rope_theta", [](JobSpec& s) { s.mutable_model()->set_rope_theta(-1); },
       "model.rope_theta: must be > 0 (got -1)"},
      {"init_std", [=](JobSpec& s) { s.mutable_model()->set_init_std(nan); },
       "model.init_std: must be a finite number > 0 (got nan)"},
      {"seq_len vs max", [](JobSpec& s) { s.mutable_data()->set_seq_len(512); },
       "data.seq_len: 512 exceeds model.max_seq_len 64"},
      {"seq_len", [](JobSpec& s) { s.mutable_data()->set_seq_len(0); },
       "data.seq_len: must be >= 1 (got 0)"},
      {"train files", [](JobSpec& s) { s.mutable_data()->clear_train(); },
       "data.train: at least one file is required"},
      {"empty val path", [](JobSpec& s) { s.mutable_data()->add_val(""); },
       "data.val[0]: the path is empty"},
      {"micro batch", [](JobSpec& s) { s.mutable_train()->set_micro_batch_size(0); },
       "train.micro_batch_size: must be >= 1 (got 0)"},
      {"grad accum", [](JobSpec& s) { s.mutable_train()->set_grad_accum_steps(-1); },
       "train.grad_accum_steps: must be >= 1 (got -1)"},
      {"max steps", [](JobSpec& s) { s.mutable_train()->set_max_steps(0); },
       "train.max_steps: must be >= 1 (got 0)"},
      {"eval interval", [](JobSpec& s) { s.mutable_train()->set_eval_interval(-5); },
       "train.eval_interval: must be >= 0 (got -5)"},
      {"eval steps",
       [](JobSpec& s) {
         s.mutable_train()->set_eval_interval(10);
         s.mutable_train()->set_eval_steps(0);
       },
       "train.eval_steps: must be >= 1 when train.eval_interval > 0 (got 0, eval_interval 10)"},
      {"log interval", [](JobSpec& s) { s.mutable_train()->set_log_interval(0); },
       "train.log_interval: must be >= 1 (got 0)"},
      {"optimizer type",
       [](JobSpec& s) { s.mutable_optimizer()->set_type(OptimizerConfig::TYPE_UNSPECIFIED); },
       "optimizer.type: must be ADAMW, SGD, ADAMW_8BIT or ADAFACTOR (got TYPE_UNSPECIFIED)"},
      {"lr", [](JobSpec& s) { s.mutable_optimizer()->set_lr(0); },
       "optimizer.lr: must be > 0 (got 0)"},
      {"lr inf", [=](JobSpec& s) { s.mutable_optimizer()->set_lr(inf); },
       "optimizer.lr: must be a finite number > 0 (got inf)"},
      {"beta1", [](JobSpec& s) { s.mutable_optimizer()->set_beta1(1); },
       "optimizer.beta1: must be in [0, 1) (got 1)"},
      {"beta2", [](JobSpec& s) { s.mutable_optimizer()->set_beta2(-0.5); },
       "optimizer.beta2: must be in [0, 1) (got -0.5)"},
      {"eps", [](JobSpec& s) { s.mutable_optimizer()->set_eps(0); },
       "optimizer.eps: must be > 0 (got 0)"},
      {"weight decay", [](JobSpec& s) { s.mutable_optimizer()->set_weight_decay(-0.1f); },
       "optimizer.weight_decay: must be >= 0 (got -0.1)"},
      {"grad clip", [](JobSpec& s) { s.mutable_optimizer()->set_grad_clip(-1); },
       "optimizer.grad_clip: must be >= 0 (got -1)"},
      {"momentum", [](JobSpec& s) { s.mutable_optimizer()->set_momentum(1.5f); },
       "optimizer.momentum: must be in [0, 1) (got 1.5)"},
      {"warmup",
       [](JobSpec& s) { s.mutable_optimizer()->mutable_schedule()->set_warmup_steps(-1); },
       "optimizer.schedule.warmup_steps: must be >= 0 (got -1)"},
      {"decay",
       [](JobSpec& s) {
         s.mutable_optimizer()->mutable_schedule()->set_decay(OptimizerConfig::DECAY_UNSPECIFIED);
       },
       "optimizer.schedule.decay: must be CONSTANT, COSINE or LINEAR (got DECAY_UNSPECIFIED)"},
      {"min lr ratio",
       [](JobSpec& s) { s.mutable_optimizer()->mutable_schedule()->set_min_lr_ratio(1.5f); },
       "optimizer.schedule.min_lr_ratio: must be in [0, 1] (got 1.5)"},
      {"dtype",
       [](JobSpec& s) {
         s.mutable_precision()->set_grad_dtype(PrecisionConfig::DTYPE_UNSPECIFIED);
       },
       "precision.grad_dtype: must be FP32, BF16 or FP16 (got DTYPE_UNSPECIFIED)"},
      {"world size", [](JobSpec& s) { s.mutable_parallel()->set_world_size(0); },
       "parallel.world_size: must be >= 1 (got 0)"},
      {"zero stage", [](JobSpec& s) { s.mutable_parallel()->set_zero_stage(4); },
       "parallel.zero_stage: must be in 0..3 (got 4)"},
      {"shard group",
       [](JobSpec& s) {
         s.mutable_parallel()->set_world_size(4);
         s.mutable_parallel()->set_shard_group_size(3);
       },
       "parallel.shard_group_size: 3 does not divide the data-parallel size 4 (parallel.world_size "
       "4 / "
       "(tensor_parallel 1 · pipeline_parallel 1)): ZeRO shards inside the data-parallel group"},
      {"prefetch", [](JobSpec& s) { s.mutable_parallel()->set_prefetch_units(-1); },
       "parallel.prefetch_units: must be >= 0 (got -1)"},
      {"bucket", [](JobSpec& s) { s.mutable_parallel()->set_bucket_bytes(-5); },
       "parallel.bucket_bytes: must be >= 0 (got -5)"},
      {"comm timeout", [](JobSpec& s) { s.mutable_parallel()->set_comm_timeout_s(0); },
       "parallel.comm_timeout_s: must be > 0 (got 0)"},
      {"checkpoint interval", [](JobSpec& s) { s.mutable_checkpoint()->set_interval_steps(0); },
       "checkpoint.interval_steps: must be >= 1 (got 0)"},
      {"keep last", [](JobSpec& s) { s.mutable_checkpoint()->set_keep_last(0); },
       "checkpoint.keep_last: must be >= 1 (got 0)"},
      {"device",
       [](JobSpec& s) {
         s.mutable_resources()->set_device(ResourceConfig::DEVICE_KIND_UNSPECIFIED);
       },
       "resources.device: must be CPU or CUDA (got DEVICE_KIND_UNSPECIFIED)"},
      {"cpu threads", [](JobSpec& s) { s.mutable_resources()->set_cpu_threads(-2); },
       "resources.cpu_threads: must be >= 0 (got -2)"},
      {"defaults not applied", [](JobSpec& s) { s.mutable_train()->clear_seed(); },
       "train.seed: not set (ApplyJobDefaults must run before validation)"},
  };
  for (const RuleCase& c : cases) {
    JobSpec spec = Valid();
    c.mutate(spec);
    const absl::Status status = ValidateJobSpec(spec);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.label;
    EXPECT_THAT(testing::Lines(status), ElementsAre(c.line)) << c.label;
  }
}

TEST(ValidateJobSpecTest, ReportsEveryViolationAtOnce) {
  JobSpec spec = Valid();
  spec.set_name("bad name!");
  spec.mutable_model()->set_d_model(250);
  spec.mutable_model()->set_d_ff(1000);
  spec.mutable_data()->set_seq_len(512);
  spec.mutable_data()->clear_train();
  spec.mutable_optimizer()->set_lr(0);
  const absl::Status status = ValidateJobSpec(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      testing::Lines(status),
      UnorderedElementsAre("name: may hold only [A-Za-z0-9._-], found byte 0x20 at position 3",
                           "model.d_model: 250 is not divisible by model.n_head 4",
                           "data.seq_len: 512 exceeds model.max_seq_len 64",
                           "data.train: at least one file is required",
                           "optimizer.lr: must be > 0 (got 0)"));
}

TEST(ValidateJobSpecTest, NameRules) {
  for (const std::string& name :
       std::vector<std::string>{"a", "run-1.v_2", std::string(128, 'z')}) {
    JobSpec spec = Valid();
    spec.set_name(name);
    EXPECT_TRUE(ValidateJobSpec(spec).ok()) << "'" << name << "'";
  }
  for (const std::string& name :
       std::vector<std::string>{"", "a/b", "caf\xc3\xa9", std::string(129, 'z')}) {
    JobSpec spec = Valid();
    spec.set_name(name);
    EXPECT_THAT(std::string(ValidateJobSpec(spec).message()), HasSubstr("name: ")) << name;
  }
}

// Regression: NUL and newline inside checkpoint.dir were accepted (with NUL the node read "x"
// where the spec said "x\0y"). Every string field is walked, nested and repeated ones too.
TEST(ValidateJobSpecTest, ControlCharactersAreRefusedInEveryStringFieldByItsPath) {
  JobSpec spec = Valid();
  spec.mutable_checkpoint()->set_dir(std::string("x\0y", 3));
  spec.mutable_data()->add_train("b\nc.bin");
  spec.mutable_model()->set_init_from("w\x7f.safetensors");
  spec.mutable_data()->add_val("fine.bin");
  const absl::Status status = ValidateJobSpec(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      testing::Lines(status),
      UnorderedElementsAre(
          "checkpoint.dir: 'x\\x00y' holds control character 0x00 at position 1; names and "
          "paths may hold none (bytes below 0x20, and 0x7f)",
          "data.train[1]: 'b\\nc.bin' holds control character 0x0a at position 1; names and "
          "paths may hold none (bytes below 0x20, and 0x7f)",
          "model.init_from: 'w\\x7f.safetensors' holds control character 0x7f at position 1; "
          "names and paths may hold none (bytes below 0x20, and 0x7f)"));
  spec = Valid();
  spec.mutable_checkpoint()->set_dir("/ok/dir with spaces/é");
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
}

TEST(ValidateJobSpecTest, AnEmptyJobListsWhatIsMissingWithoutDividingByZero) {
  JobSpec spec;
  ApplyJobDefaults(&spec);
  const absl::Status status = ValidateJobSpec(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      testing::Lines(status),
      UnorderedElementsAre(
          "name: required: 1 to 128 characters of [A-Za-z0-9._-]",
          "model.family: must be GPT2 or LLAMA (got FAMILY_UNSPECIFIED)",
          "model.n_layer: must be >= 1 (got 0)", "model.n_head: must be >= 1 (got 0)",
          "model.d_model: must be >= 1 (got 0)", "model.n_kv_head: must be >= 1 (got 0)",
          "model.vocab_size: must be >= 2 (got 0)", "model.max_seq_len: must be >= 1 (got 0)",
          "data.train: at least one file is required", "data.seq_len: must be >= 1 (got 0)",
          "train.micro_batch_size: must be >= 1 (got 0)", "train.max_steps: must be >= 1 (got 0)",
          "optimizer.lr: must be > 0 (got 0)"));
}

TEST(ValidateJobSpecTest, DffWithoutADefaultIsReported) {
  JobSpec spec = Valid();
  spec.mutable_model()->clear_d_ff();
  spec.mutable_model()->set_d_model(1 << 30);
  spec.mutable_model()->set_n_head(1);
  spec.mutable_model()->set_n_kv_head(1);
  ApplyJobDefaults(&spec);
  EXPECT_THAT(std::string(ValidateJobSpec(spec).message()),
              HasSubstr("model.d_ff: not set, and its default from model.d_model 1073741824 "
                        "does not fit in int32"));
}

class CheckJobPathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("check_job_paths_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    std::filesystem::permissions(dir_, std::filesystem::perms::owner_all);
    std::filesystem::remove_all(dir_);
  }
  std::string File(const std::string& name) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << "tokens";
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(CheckJobPathsTest, AcceptsExistingFiles) {
  JobSpec spec = Valid();
  spec.mutable_data()->set_train(0, File("train.bin"));
  spec.mutable_data()->add_val(File("val.bin"));
  spec.mutable_model()->set_init_from(File("init.safetensors"));
  EXPECT_TRUE(CheckJobPaths(spec).ok()) << CheckJobPaths(spec);
}

TEST_F(CheckJobPathsTest, ReportsEveryMissingPathByFieldAndIndex) {
  JobSpec spec = Valid();
  const std::string missing_train = (dir_ / "x.bin").string();
  const std::string missing_val = (dir_ / "v.bin").string();
  const std::string missing_init = (dir_ / "w.safetensors").string();
  spec.mutable_data()->set_train(0, File("train.bin"));
  spec.mutable_data()->add_train(missing_train);
  spec.mutable_data()->add_val(missing_val);
  spec.mutable_data()->add_val(dir_.string());
  spec.mutable_model()->set_init_from(missing_init);
  const absl::Status status = CheckJobPaths(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(testing::Lines(status),
              ElementsAre(absl::StrCat("data.train[1]: '", missing_train, "' does not exist"),
                          absl::StrCat("data.val[0]: '", missing_val, "' does not exist"),
                          absl::StrCat("data.val[1]: '", dir_.string(), "' is not a regular file"),
                          absl::StrCat("model.init_from: '", missing_init, "' does not exist")));
}

TEST_F(CheckJobPathsTest, ADirectoryIsInvalidArgument) {
  JobSpec spec = Valid();
  spec.mutable_data()->set_train(0, dir_.string());
  EXPECT_EQ(CheckJobPaths(spec).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CheckJobPathsTest, AnUnreadableFileIsPermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads files whatever their mode";
  JobSpec spec = Valid();
  const std::string path = File("secret.bin");
  std::filesystem::permissions(path, std::filesystem::perms::none);
  spec.mutable_data()->set_train(0, path);
  const absl::Status status = CheckJobPaths(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr(absl::StrCat("data.train[0]: '", path, "' is not readable")));
}

TEST(CheckEngineSupportTest, AcceptsTheDefaults) { EXPECT_TRUE(CheckEngineSupport(Valid()).ok()); }

// Offload on CUDA ranks: the host step and the gathers move through the rank's copy engine
// (a CudaCopyEngine's copy stream), as on a CPU rank whose memory is its own
// (tests/unit/worker/trainer/offload_separate_memory_test.cc; on a GPU,
// tests/gpu/worker/train/offload_gpu_test.cc).
TEST(CheckEngineSupportTest, EveryOffloadIsAcceptedOnCudaRanks) {
  using zerotrain::OffloadConfig;
  const std::pair<OffloadConfig::Device, OffloadConfig::Device> offloads[] = {
      {OffloadConfig::CPU, OffloadConfig::NONE},
      {OffloadConfig::NVME, OffloadConfig::NONE},
      {OffloadConfig::CPU, OffloadConfig::CPU},
      {OffloadConfig::NVME, OffloadConfig::CPU},
      {OffloadConfig::NVME, OffloadConfig::NVME}};
  for (const auto& [optimizer, params] : offloads) {
    JobSpec spec = Valid();
    spec.mutable_resources()->set_device(zerotrain::ResourceConfig::CUDA);
    spec.mutable_parallel()->set_zero_stage(3);
    spec.mutable_offload()->set_optimizer(optimizer);
    spec.mutable_offload()->set_params(params);
    spec.mutable_offload()->set_nvme_path("/tmp");
    spec.mutable_offload()->set_buffer_count(4);
    const absl::Status status = CheckEngineSupport(spec);
    EXPECT_TRUE(status.ok()) << OffloadConfig::Device_Name(optimizer) << " "
                             << OffloadConfig::Device_Name(params) << ": " << status;
  }
  // A sharded Adafactor's host step sums its statistics in host memory over contexts of its
  // own (worker/shard/host_step_sums.h).
  JobSpec adafactor = Valid();
  adafactor.mutable_resources()->set_device(zerotrain::ResourceConfig::CUDA);
  adafactor.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAFACTOR);
  adafactor.mutable_parallel()->set_zero_stage(1);
  adafactor.mutable_parallel()->set_world_size(2);
  adafactor.mutable_parallel()->set_shard_group_size(2);
  adafactor.mutable_offload()->set_optimizer(OffloadConfig::CPU);
  EXPECT_TRUE(CheckEngineSupport(adafactor).ok()) << CheckEngineSupport(adafactor);
}

// Gradients reduce in reduce_dtype on any number of ranks (ShardingEngine::ReduceGradients);
// fp16 reductions only where the loss scaler runs.
TEST(CheckEngineSupportTest, ReduceDtypeDiffersFromGradDtypeExceptUnscaledFp16) {
  using P = zerotrain::PrecisionConfig;
  JobSpec job = Valid();
  job.mutable_parallel()->set_world_size(2);
  for (const auto [grad, reduce] :
       {std::pair{P::FP32, P::BF16}, std::pair{P::BF16, P::FP32}, std::pair{P::FP16, P::FP32}}) {
    job.mutable_precision()->set_grad_dtype(grad);
    job.mutable_precision()->set_reduce_dtype(reduce);
    EXPECT_TRUE(CheckEngineSupport(job).ok()) << P::DType_Name(grad) << CheckEngineSupport(job);
  }
  job.mutable_precision()->set_grad_dtype(P::FP32);
  job.mutable_precision()->set_reduce_dtype(P::FP16);
  EXPECT_THAT(testing::Lines(CheckEngineSupport(job)),
              ElementsAre("precision.reduce_dtype: FP16 needs loss scaling, which runs only when "
                          "param_dtype, compute_dtype or grad_dtype is FP16 (grad_dtype is FP32); "
                          "reduce in BF16 or FP32, or train in FP16"));
  job.mutable_precision()->set_compute_dtype(P::FP16);  // the loss scaler runs
  EXPECT_TRUE(CheckEngineSupport(job).ok()) << CheckEngineSupport(job);
}

TEST(CheckEngineSupportTest, ListsEveryUnsupportedFeature) {
  const absl::Status status = CheckEngineSupport(testing::JobWithDefaults(testing::kFullYaml));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(testing::Lines(status),
              ElementsAre("offload.params: NVME trains with offload.optimizer NVME (the shards "
                          "are swapped with the states, in their generation) so far",
                          "offload.delayed_update.enabled: true trains without FP16 in precision "
                          "(fp16's dynamic loss scaling must skip an overflowing step's update, "
                          "which a delayed update learns of only after the next step has "
                          "computed on it; use BF16 or FP32) so far"));
}

}  // namespace
}  // namespace zt

namespace zt {
namespace {

// The memory-technique rules: every broken combination is reported in the same answer,
// each naming its field.
TEST(MemoryTechniqueValidationTest, ReportsEveryBrokenCombinationAtOnce) {
  zerotrain::JobSpec spec;
  auto* m = spec.mutable_model();
  m->set_family(zerotrain::ModelConfig::GPT2);
  m->set_n_layer(1);
  m->set_n_head(2);
  m->set_d_model(8);
  m->set_vocab_size(16);
  m->set_max_seq_len(8);
  spec.mutable_data()->add_train("x.bin");
  spec.mutable_data()->set_seq_len(8);
  spec.mutable_train()->set_micro_batch_size(1);
  spec.mutable_train()->set_max_steps(1);
  spec.mutable_optimizer()->set_lr(1e-3f);
  spec.mutable_optimizer()->set_quant_block_size(1000);
  spec.mutable_precision()->set_param_dtype(zerotrain::PrecisionConfig::FP16);
  spec.mutable_precision()->set_master_weights(false);
  spec.mutable_precision()->mutable_loss_scale()->set_static_scale(-4);
  spec.mutable_memory()->set_checkpoint_every_k(0);
  ApplyJobDefaults(&spec);
  const absl::Status s = ValidateJobSpec(spec);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  for (const char* field :
       {"optimizer.quant_block_size: must be a power of two", "precision.master_weights: false",
        "precision.loss_scale.static_scale: must be > 0",
        "memory.checkpoint_every_k: must be >= 1"}) {
    EXPECT_NE(s.message().find(field), std::string::npos) << field << "\n" << s.message();
  }
}

TEST(MemoryTechniqueValidationTest, ZeroStaticScaleIsRejected) {
  zerotrain::JobSpec spec;
  spec.mutable_precision()->mutable_loss_scale()->set_static_scale(0);
  ApplyJobDefaults(&spec);
  const absl::Status s = ValidateJobSpec(spec);
  EXPECT_NE(s.message().find("precision.loss_scale.static_scale: must be > 0 (got 0)"),
            std::string::npos)
      << s.message();
}

TEST(MemoryTechniqueValidationTest, SplitMasterWeightsNeedBf16MasterWeightsRoundedToNearest) {
  JobSpec spec = Valid();
  spec.mutable_precision()->set_param_dtype(zerotrain::PrecisionConfig::BF16);
  spec.mutable_precision()->set_split_master_weights(true);
  // Valid()'s defaults chose no master for its fp32 parameters; BF16's default keeps one.
  spec.mutable_precision()->clear_master_weights();
  ApplyJobDefaults(&spec);
  ASSERT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);

  spec.mutable_precision()->set_param_dtype(zerotrain::PrecisionConfig::FP16);
  spec.mutable_precision()->set_master_weights(false);
  spec.mutable_precision()->set_stochastic_rounding(true);
  const absl::Status s = ValidateJobSpec(spec);
  for (const char* rule :
       {"precision.split_master_weights: requires precision.param_dtype BF16 (got FP16)",
        "precision.split_master_weights: requires precision.master_weights (it is false)",
        "precision.split_master_weights: cannot be combined with precision.stochastic_rounding"}) {
    EXPECT_NE(s.message().find(rule), std::string::npos) << rule << "\n" << s.message();
  }
}

TEST(MemoryTechniqueValidationTest, DefaultsFollowTheParameterDtype) {
  zerotrain::JobSpec spec;
  spec.mutable_precision()->set_param_dtype(zerotrain::PrecisionConfig::BF16);
  ApplyJobDefaults(&spec);
  EXPECT_EQ(spec.precision().compute_dtype(), zerotrain::PrecisionConfig::BF16);
  EXPECT_EQ(spec.precision().grad_dtype(), zerotrain::PrecisionConfig::FP32);
  EXPECT_EQ(spec.precision().reduce_dtype(), zerotrain::PrecisionConfig::FP32);
  EXPECT_TRUE(spec.precision().master_weights());
  EXPECT_EQ(spec.precision().loss_scale().initial_power(), 16);
  EXPECT_EQ(spec.precision().loss_scale().window(), 1000);
  EXPECT_EQ(spec.precision().loss_scale().hysteresis(), 2);
  EXPECT_EQ(spec.memory().activation_checkpointing(), zerotrain::MemoryConfig::NONE);
  EXPECT_EQ(spec.optimizer().quant_block_size(), 2048);
}

}  // namespace
}  // namespace zt
