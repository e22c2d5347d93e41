// The job files under examples/ are what a new user runs first: they must parse and validate.
// Their data is made by the demo, so paths are not checked here.
#include <string>

#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "worker/job/job_defaults.h"
#include "worker/job/job_file.h"
#include "worker/job/job_validation.h"

namespace zt {
namespace {

using zerotrain::JobSpec;
using zerotrain::ModelConfig;
using zerotrain::OptimizerConfig;

JobSpec LoadExample(const std::string& name) {
  absl::StatusOr<JobSpec> spec = LoadJobFile(std::string(ZT_SOURCE_DIR) + "/examples/" + name);
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return JobSpec();
  ApplyJobDefaults(&*spec);
  const absl::Status valid = ValidateJobSpec(*spec);
  EXPECT_TRUE(valid.ok()) << name << ": " << valid;
  const absl::Status supported = CheckEngineSupport(*spec);
  EXPECT_TRUE(supported.ok()) << name << ": " << supported;
  return *spec;
}

void ExpectTinyTraining(const JobSpec& spec) {
  EXPECT_EQ(spec.model().n_layer(), 4);
  EXPECT_EQ(spec.model().n_head(), 4);
  EXPECT_EQ(spec.model().d_model(), 256);
  EXPECT_EQ(spec.model().vocab_size(), 256);
  EXPECT_EQ(spec.model().max_seq_len(), 256);
  ASSERT_EQ(spec.data().train_size(), 1);
  EXPECT_EQ(spec.data().train(0), ".demo/train.bin");
  ASSERT_EQ(spec.data().val_size(), 1);
  EXPECT_EQ(spec.data().val(0), ".demo/val.bin");
  EXPECT_EQ(spec.data().seq_len(), 256);
  EXPECT_EQ(spec.train().micro_batch_size(), 8);
  EXPECT_EQ(spec.train().max_steps(), 300);
  EXPECT_EQ(spec.train().eval_interval(), 50);
  EXPECT_EQ(spec.train().eval_steps(), 10);
  EXPECT_EQ(spec.train().log_interval(), 10);
  const OptimizerConfig& o = spec.optimizer();
  EXPECT_EQ(o.type(), OptimizerConfig::ADAMW);
  // The file's decimals round to these floats exactly as the literals do.
  EXPECT_EQ(o.lr(), 1e-3f);
  EXPECT_EQ(o.beta2(), 0.95f);
  EXPECT_EQ(o.weight_decay(), 0.1f);
  EXPECT_EQ(o.schedule().warmup_steps(), 20);
  EXPECT_EQ(o.schedule().decay(), OptimizerConfig::COSINE);
  EXPECT_EQ(o.schedule().min_lr_ratio(), 0.1f);
}

TEST(ExamplesTest, TinyGpt2) {
  const JobSpec spec = LoadExample("tiny.yaml");
  EXPECT_EQ(spec.model().family(), ModelConfig::GPT2);
  EXPECT_EQ(spec.model().n_kv_head(), 4);
  EXPECT_EQ(spec.model().d_ff(), 1024);
  EXPECT_TRUE(spec.model().tie_embeddings());
  ExpectTinyTraining(spec);
}

TEST(ExamplesTest, TinyLlama) {
  const JobSpec spec = LoadExample("tiny-llama.yaml");
  EXPECT_EQ(spec.model().family(), ModelConfig::LLAMA);
  EXPECT_EQ(spec.model().n_kv_head(), 2);
  EXPECT_EQ(spec.model().d_ff(), 704);
  EXPECT_FALSE(spec.model().tie_embeddings());
  ExpectTinyTraining(spec);
}

}  // namespace
}  // namespace zt
