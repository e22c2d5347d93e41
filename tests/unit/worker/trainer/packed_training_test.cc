// Document shards (`zt prepare --format jsonl`) through the step loop: packed and padded runs
// train, the training and validation losses are token-level means over micro-batches and
// ranks, a packed run resumes bit for bit, prompt-only documents carry no loss, and the job's
// data.packing / data.overlong refusals name their fields.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/status_macros.h"
#include "tests/unit/worker/trainer/document_corpus.h"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "tests/unit/worker/trainer/rank_threads.h"
#include "worker/comm/store.h"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"
#include "worker/train/micro_batches.h"
#include "worker/train/trainer.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using zerotrain::JobSpec;
using zerotrain::ModelConfig;

class PackedTrainingTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::TestScratchDir("zt-packed-training-test"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The shared document corpus (document_corpus.h) at dir_/name.
  std::string WriteDocuments(const std::string& name, int max_length, bool all_prompt = false) {
    const std::string path = (dir_ / name).string();
    testing::WriteDocumentShard(path, max_length, all_prompt);
    return path;
  }

  JobSpec Job(ModelConfig::Family family, const std::string& shard, bool packing) {
    JobSpec job;
    job.set_name("packed");
    auto* m = job.mutable_model();
    m->set_family(family);
    m->set_n_layer(2);
    m->set_n_head(4);
    if (family == ModelConfig::LLAMA) m->set_n_kv_head(2);
    m->set_d_model(32);
    m->set_vocab_size(32);
    m->set_max_seq_len(16);
    job.mutable_data()->add_train(shard);
    job.mutable_data()->set_seq_len(16);
    job.mutable_data()->set_packing(packing);
    job.mutable_data()->set_shuffle(true);
    job.mutable_train()->set_micro_batch_size(2);
    job.mutable_train()->set_grad_accum_steps(2);
    job.mutable_train()->set_max_steps(8);
    job.mutable_optimizer()->set_lr(3e-3f);
    job.mutable_resources()->set_cpu_threads(2);
    return ValidatedJob(job).value();
  }

  struct RunResult {
    absl::Status status;
    std::vector<double> losses;
    std::vector<double> grad_norms;
    std::vector<std::vector<uint8_t>> params;
  };

  static RunResult Train(const JobSpec& job, int stop_after, TrainOptions options = {}) {
    RunResult r;
    options.stop_after_step = stop_after;
    absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(job, options);
    if (!t.ok()) {
      r.status = t.status();
      return r;
    }
    r.status = (*t)->Run([&](const StepRecord& rec) {
      r.losses.push_back(rec.loss);
      r.grad_norms.push_back(rec.grad_norm);
    });
    for (const Tensor& p : (*t)->model().unit_params()) {
      const auto* bytes = static_cast<const uint8_t*>(p.raw());
      r.params.emplace_back(bytes, bytes + p.size_bytes());
    }
    return r;
  }

  std::filesystem::path dir_;
};

TEST_F(PackedTrainingTest, PackedAndPaddedRunsLearnForBothFamilies) {
  const std::string shard = WriteDocuments("docs.bin", 14);
  for (const auto family : {ModelConfig::GPT2, ModelConfig::LLAMA}) {
    for (const bool packing : {true, false}) {
      JobSpec job = Job(family, shard, packing);
      job.mutable_train()->set_max_steps(30);
      const RunResult r = Train(job, 30);
      ASSERT_TRUE(r.status.ok()) << r.status;
      ASSERT_EQ(r.losses.size(), 30u);
      for (double l : r.losses) ASSERT_TRUE(std::isfinite(l));
      // The documents are arithmetic progressions: 30 steps at lr 3e-3 take the loss well
      // below its start (ln 32 ≈ 3.47); a model that saw no targets would not move.
      EXPECT_LT(r.losses.back(), 0.8 * r.losses.front())
          << ModelConfig::Family_Name(family) << (packing ? " packed" : " padded");
    }
  }
}

// One step of 4 rows, split three ways: one micro-batch of 4 rows, 2 accumulated micro-batches
// of 2, and 2 data-parallel ranks of 2. The rows are the same (row k·B + b of the plan), but
// prompts and padding leave each micro-batch a different number of counted targets, so only a
// token-level mean over the whole step gives the three the same loss and gradients (the mean
// of micro-batch means, the gradient-accumulation slip Hugging Face fixed in 2024, weighs a
// target of a sparse micro-batch more).
TEST_F(PackedTrainingTest, AccumulationAndDataParallelismGiveTheLargeBatchLoss) {
  const std::string shard = WriteDocuments("docs.bin", 14);
  for (const bool packing : {true, false}) {
    JobSpec large = Job(ModelConfig::LLAMA, shard, packing);
    large.mutable_train()->set_micro_batch_size(4);
    large.mutable_train()->set_grad_accum_steps(1);
    large.mutable_parallel()->set_micro_batches(1);
    large.mutable_train()->set_max_steps(6);
    JobSpec accumulated = large;
    accumulated.mutable_train()->set_micro_batch_size(2);
    accumulated.mutable_train()->set_grad_accum_steps(2);
    accumulated.mutable_parallel()->set_micro_batches(2);
    JobSpec data_parallel = large;
    data_parallel.mutable_train()->set_micro_batch_size(2);
    data_parallel.mutable_parallel()->set_world_size(2);
    data_parallel.mutable_resources()->set_cpu_threads(1);

    const RunResult one = Train(ValidatedJob(large).value(), 6);
    const RunResult acc = Train(ValidatedJob(accumulated).value(), 6);
    ASSERT_TRUE(one.status.ok()) << one.status;
    ASSERT_TRUE(acc.status.ok()) << acc.status;
    const JobSpec dp = ValidatedJob(data_parallel).value();
    InProcessStore store;
    std::vector<std::vector<double>> dp_losses(2);
    ASSERT_TRUE(testing::RunRankThreads(2, [&](int r) -> absl::Status {
                  TrainOptions options;
                  options.rank = r;
                  options.store = &store;
                  options.stop_after_step = 6;
                  ZT_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(dp, options));
                  return t->Run([&](const StepRecord& rec) { dp_losses[r].push_back(rec.loss); });
                }).ok());
    ASSERT_EQ(one.losses.size(), 6u);
    ASSERT_EQ(acc.losses.size(), 6u);
    ASSERT_EQ(dp_losses[0].size(), 6u);
    // The 2-row micro-batches' counted targets must differ within a step, or a mean of means
    // would pass too.
    auto batches = MicroBatches::Open(
        {shard}, "data.train", dp.data(),
        {.B = 2, .T = 16, .shuffle = true, .seed = dp.data().seed(), .vocab_size = 32});
    ASSERT_TRUE(batches.ok()) << batches.status();
    int uneven_steps = 0;
    for (int64_t step = 0; step < 6; ++step) {
      uneven_steps += (*batches)->CountedTargets(2 * step).value() !=
                      (*batches)->CountedTargets(2 * step + 1).value();
    }
    EXPECT_GE(uneven_steps, 4);
    // The same sums in another blocking (rows per GEMM, a ring all-reduce): fp32 reordering
    // noise, compounded over 6 Adam steps; a mean of means is off by percents.
    for (size_t s = 0; s < 6; ++s) {
      EXPECT_NEAR(acc.losses[s], one.losses[s], 1e-5 * one.losses[s])
          << (packing ? "packed" : "padded") << " accumulated, step " << s + 1;
      EXPECT_NEAR(dp_losses[0][s], one.losses[s], 1e-5 * one.losses[s])
          << (packing ? "packed" : "padded") << " 2 ranks, step " << s + 1;
      EXPECT_NEAR(acc.grad_norms[s], one.grad_norms[s], 1e-4 * one.grad_norms[s])
          << (packing ? "packed" : "padded") << " accumulated, step " << s + 1;
    }
  }
}

// The validation loss is the same token-level mean: 4 validation rows evaluated as one
// micro-batch of 4, as 2 micro-batches of 2 (eval_steps 2), and as 2 data-parallel ranks of 2
// give one loss, though the 2-row micro-batches count different numbers of targets (checked),
// where a mean of micro-batch means would differ by percents.
TEST_F(PackedTrainingTest, ValidationLossIsTheTokenLevelMeanOverMicroBatchesAndRanks) {
  const std::string train = WriteDocuments("docs.bin", 14);
  const std::string val = WriteDocuments("val.bin", 14);
  for (const bool packing : {true, false}) {
    const std::string what = packing ? "packed" : "padded";
    JobSpec large = Job(ModelConfig::LLAMA, train, packing);
    large.mutable_data()->add_val(val);
    large.mutable_train()->set_micro_batch_size(4);
    large.mutable_train()->set_grad_accum_steps(1);
    large.mutable_parallel()->set_micro_batches(1);
    large.mutable_train()->set_eval_steps(1);
    JobSpec split = large;
    split.mutable_train()->set_micro_batch_size(2);
    split.mutable_train()->set_eval_steps(2);
    JobSpec data_parallel = large;
    data_parallel.mutable_train()->set_micro_batch_size(2);
    data_parallel.mutable_parallel()->set_world_size(2);
    data_parallel.mutable_resources()->set_cpu_threads(1);

    // Before any step every job holds the same seeded weights.
    auto evaluate = [](const JobSpec& job) -> absl::StatusOr<double> {
      ZT_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(job, {}));
      return t->Evaluate();
    };
    const absl::StatusOr<double> one = evaluate(ValidatedJob(large).value());
    const absl::StatusOr<double> two_batches = evaluate(ValidatedJob(split).value());
    ASSERT_TRUE(one.ok()) << what << ": " << one.status();
    ASSERT_TRUE(two_batches.ok()) << what << ": " << two_batches.status();
    const JobSpec dp = ValidatedJob(data_parallel).value();
    InProcessStore store;
    std::vector<double> dp_loss(2);
    ASSERT_TRUE(testing::RunRankThreads(2, [&](int r) -> absl::Status {
                  TrainOptions options;
                  options.rank = r;
                  options.store = &store;
                  ZT_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(dp, options));
                  ZT_ASSIGN_OR_RETURN(dp_loss[r], t->Evaluate());
                  return absl::OkStatus();
                }).ok());

    // The two 2-row micro-batches must count different numbers of targets, or a mean of
    // means would pass too.
    auto batches = MicroBatches::Open(
        {val}, "data.val", dp.data(),
        {.B = 2, .T = 16, .shuffle = false, .seed = dp.data().seed(), .vocab_size = 32});
    ASSERT_TRUE(batches.ok()) << batches.status();
    const int64_t c0 = (*batches)->CountedTargets(0).value();
    const int64_t c1 = (*batches)->CountedTargets(1).value();
    EXPECT_NE(c0, c1) << what;
    // And the old mean of means is measurably off: micro-batch 0 alone gives its mean m0, the
    // token-level mean gives m1 = (one·(c0 + c1) − c0·m0) / c1.
    JobSpec first_only = split;
    first_only.mutable_train()->set_eval_steps(1);
    const absl::StatusOr<double> m0 = evaluate(ValidatedJob(first_only).value());
    ASSERT_TRUE(m0.ok()) << m0.status();
    const double m1 = (*one * static_cast<double>(c0 + c1) - static_cast<double>(c0) * *m0) /
                      static_cast<double>(c1);
    EXPECT_GT(std::abs((*m0 + m1) / 2 - *one), 1e-4 * *one) << what;
    // The same sums in another blocking (rows per GEMM, the ranks' sum): fp32 noise.
    EXPECT_NEAR(*two_batches, *one, 1e-5 * *one) << what << ": 2 micro-batches";
    EXPECT_NEAR(dp_loss[0], *one, 1e-5 * *one) << what << ": 2 ranks";
    EXPECT_EQ(dp_loss[1], dp_loss[0]) << what << ": every rank reports the same loss";
  }
}

TEST_F(PackedTrainingTest, PackedRunResumesBitForBit) {
  const std::string shard = WriteDocuments("docs.bin", 14);
  for (const auto family : {ModelConfig::GPT2, ModelConfig::LLAMA}) {
    JobSpec job = Job(family, shard, /*packing=*/true);
    const RunResult uninterrupted = Train(job, 8);
    ASSERT_TRUE(uninterrupted.status.ok()) << uninterrupted.status;
    const std::filesystem::path ckpt = dir_ / ("ckpt-" + ModelConfig::Family_Name(family));
    job.mutable_checkpoint()->set_dir(ckpt.string());
    job.mutable_checkpoint()->set_interval_steps(4);
    const RunResult first = Train(job, 4);
    ASSERT_TRUE(first.status.ok()) << first.status;
    TrainOptions resume;
    resume.resume_dir = ckpt.string();
    const RunResult second = Train(job, 8, resume);
    ASSERT_TRUE(second.status.ok()) << second.status;
    ASSERT_EQ(first.losses.size(), 4u);
    ASSERT_EQ(second.losses.size(), 4u);
    // Exact: the batch is a pure function of the step (DocumentSampler), the rest is saved.
    for (size_t s = 0; s < 4; ++s) {
      EXPECT_EQ(first.losses[s], uninterrupted.losses[s]) << "step " << s + 1;
      EXPECT_EQ(second.losses[s], uninterrupted.losses[4 + s]) << "step " << s + 5;
    }
    EXPECT_TRUE(second.params == uninterrupted.params) << ModelConfig::Family_Name(family);
  }
}

TEST_F(PackedTrainingTest, PromptOnlyDocumentsCarryNoLossAndNoGradient) {
  const std::string shard = WriteDocuments("prompts.bin", 14, /*all_prompt=*/true);
  for (const bool packing : {true, false}) {
    JobSpec job = Job(ModelConfig::GPT2, shard, packing);
    const RunResult r = Train(job, 2);
    ASSERT_TRUE(r.status.ok()) << r.status;
    ASSERT_EQ(r.losses.size(), 2u);
    for (size_t s = 0; s < 2; ++s) {
      EXPECT_EQ(r.losses[s], 0.0);
      EXPECT_EQ(r.grad_norms[s], 0.0);
    }
  }
}

TEST_F(PackedTrainingTest, PackingComposesWithLoraAdapters) {
  const std::string shard = WriteDocuments("docs.bin", 14);
  JobSpec spec = Job(ModelConfig::LLAMA, shard, /*packing=*/true);
  auto* lora = spec.mutable_model()->mutable_lora();
  lora->set_rank(4);
  lora->set_alpha(8.0f);
  for (const char* m : {"q_proj", "k_proj", "v_proj", "o_proj"}) lora->add_target_modules(m);
  spec.mutable_train()->set_max_steps(6);
  absl::StatusOr<JobSpec> job = ValidatedJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const RunResult r = Train(*job, 6);
  ASSERT_TRUE(r.status.ok()) << r.status;
  ASSERT_EQ(r.losses.size(), 6u);
  for (size_t s = 0; s < r.losses.size(); ++s) {
    EXPECT_TRUE(std::isfinite(r.losses[s]));
    EXPECT_GT(r.grad_norms[s], 0.0) << "step " << s + 1;  // the adapters get gradient
  }
}

TEST_F(PackedTrainingTest, PackingPlainShardsIsRefusedByName) {
  const std::string plain = (dir_ / "plain.bin").string();
  ASSERT_TRUE(WriteTokenShard(plain, testing::PatternTokens(), 32).ok());
  const RunResult r = Train(Job(ModelConfig::GPT2, plain, /*packing=*/true), 1);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status.message(), HasSubstr("data.packing: data.train[0] '" + plain + "'"));
  EXPECT_THAT(r.status.message(), HasSubstr("no document index"));
}

TEST_F(PackedTrainingTest, OverlongDocumentsAreRefusedByNameOrTruncated) {
  const std::string shard = WriteDocuments("long.bin", 30);  // up to 30 tokens > seq_len 16
  JobSpec job = Job(ModelConfig::LLAMA, shard, /*packing=*/true);
  const RunResult refused = Train(job, 1);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status.message(), HasSubstr("data.train[0] '" + shard + "': document "));
  EXPECT_THAT(refused.status.message(), HasSubstr("> data.seq_len 16"));
  job.mutable_data()->set_overlong(zerotrain::DataConfig::TRUNCATE);
  const RunResult truncated = Train(job, 2);
  ASSERT_TRUE(truncated.status.ok()) << truncated.status;
  EXPECT_EQ(truncated.losses.size(), 2u);
}

}  // namespace
}  // namespace zt
