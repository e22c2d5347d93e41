#include "worker/job/job_defaults.h"

#include <cmath>
#include <cstdint>

#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/job/test_jobs.h"

namespace zt {
namespace {

using google::protobuf::util::MessageDifferencer;
using zerotrain::JobSpec;
using zerotrain::ModelConfig;
using zerotrain::OptimizerConfig;
using zerotrain::PrecisionConfig;
using zerotrain::ResourceConfig;

JobSpec Minimal(ModelConfig::Family family) {
  JobSpec spec;
  spec.mutable_model()->set_family(family);
  spec.mutable_model()->set_n_head(6);
  spec.mutable_model()->set_d_model(384);
  return spec;
}

TEST(JobDefaultsTest, FillsEveryDocumentedDefault) {
  JobSpec spec = Minimal(ModelConfig::GPT2);
  ApplyJobDefaults(&spec);
  const ModelConfig& m = spec.model();
  EXPECT_EQ(m.n_kv_head(), 6);
  EXPECT_EQ(m.d_ff(), 4 * 384);
  EXPECT_TRUE(m.has_tie_embeddings());
  EXPECT_TRUE(m.tie_embeddings());
  // Float defaults are compared with the float the .proto's decimal rounds to: exact.
  EXPECT_EQ(m.norm_eps(), 1e-5f);
  EXPECT_EQ(m.rope_theta(), 10000.0f);
  EXPECT_EQ(m.init_std(), 0.02f);
  EXPECT_EQ(spec.train().grad_accum_steps(), 1);
  EXPECT_EQ(spec.train().eval_steps(), 20);
  EXPECT_EQ(spec.train().log_interval(), 1);
  EXPECT_EQ(spec.train().seed(), 1337u);
  EXPECT_TRUE(spec.data().has_seed());
  EXPECT_EQ(spec.data().seed(), 1337u);
  const OptimizerConfig& o = spec.optimizer();
  EXPECT_EQ(o.type(), OptimizerConfig::ADAMW);
  EXPECT_EQ(o.beta1(), 0.9f);
  EXPECT_EQ(o.beta2(), 0.999f);
  EXPECT_EQ(o.eps(), 1e-8f);
  EXPECT_EQ(o.weight_decay(), 0.01f);
  EXPECT_EQ(o.grad_clip(), 1.0f);
  EXPECT_EQ(o.schedule().decay(), OptimizerConfig::CONSTANT);
  EXPECT_EQ(spec.precision().param_dtype(), PrecisionConfig::FP32);
  EXPECT_EQ(spec.precision().compute_dtype(), PrecisionConfig::FP32);
  EXPECT_EQ(spec.precision().grad_dtype(), PrecisionConfig::FP32);
  EXPECT_EQ(spec.parallel().world_size(), 1);
  EXPECT_EQ(spec.resources().device(), ResourceConfig::CPU);
}

TEST(JobDefaultsTest, LlamaDefaultsDiffer) {
  JobSpec spec = Minimal(ModelConfig::LLAMA);
  ApplyJobDefaults(&spec);
  // 8·384/3 = 1024 is already a multiple of 64.
  EXPECT_EQ(spec.model().d_ff(), 1024);
  EXPECT_TRUE(spec.model().has_tie_embeddings());
  EXPECT_FALSE(spec.model().tie_embeddings());
}

TEST(JobDefaultsTest, LlamaDffMatchesAFloat64Reference) {
  for (int64_t c = 1; c <= 8192; ++c) {
    // 8·C/3/64 = C/24 is exact in double for these C, so ceil rounds the true quotient.
    const double reference = std::ceil(8.0 * static_cast<double>(c) / 3.0 / 64.0) * 64.0;
    ASSERT_EQ(DefaultDff(ModelConfig::LLAMA, c), static_cast<int64_t>(reference)) << "C " << c;
    ASSERT_EQ(DefaultDff(ModelConfig::GPT2, c), 4 * c) << "C " << c;
  }
  // Llama-7B's 11008 rounds to a multiple of 256; the schema's rule rounds to 64.
  EXPECT_EQ(DefaultDff(ModelConfig::LLAMA, 4096), 10944);
  EXPECT_EQ(DefaultDff(ModelConfig::LLAMA, 256), 704);
  EXPECT_EQ(DefaultDff(ModelConfig::FAMILY_UNSPECIFIED, 256), 0);
  // Widths past int32 have no default; validation reports them.
  EXPECT_EQ(DefaultDff(ModelConfig::GPT2, int64_t{1} << 30), 0);
  EXPECT_EQ(DefaultDff(ModelConfig::GPT2, -5), 0);
}

TEST(JobDefaultsTest, KeepsValuesThatAreSet) {
  JobSpec spec = Minimal(ModelConfig::GPT2);
  spec.mutable_model()->set_n_kv_head(2);
  spec.mutable_model()->set_d_ff(100);
  spec.mutable_model()->set_tie_embeddings(false);
  spec.mutable_model()->set_norm_eps(0.0f);  // Set to zero is set: validation rejects it.
  spec.mutable_train()->set_seed(5);
  spec.mutable_data()->set_seed(0);
  spec.mutable_train()->set_eval_steps(0);
  spec.mutable_optimizer()->set_type(OptimizerConfig::SGD);
  spec.mutable_optimizer()->set_weight_decay(0.0f);
  spec.mutable_optimizer()->mutable_schedule()->set_decay(OptimizerConfig::COSINE);
  spec.mutable_precision()->set_param_dtype(PrecisionConfig::BF16);
  spec.mutable_parallel()->set_world_size(0);
  spec.mutable_resources()->set_device(ResourceConfig::CUDA);
  ApplyJobDefaults(&spec);
  EXPECT_EQ(spec.model().n_kv_head(), 2);
  EXPECT_EQ(spec.model().d_ff(), 100);
  EXPECT_FALSE(spec.model().tie_embeddings());
  EXPECT_EQ(spec.model().norm_eps(), 0.0f);
  EXPECT_EQ(spec.train().seed(), 5u);
  EXPECT_EQ(spec.data().seed(), 0u);
  EXPECT_EQ(spec.train().eval_steps(), 0);
  EXPECT_EQ(spec.optimizer().type(), OptimizerConfig::SGD);
  EXPECT_EQ(spec.optimizer().weight_decay(), 0.0f);
  EXPECT_EQ(spec.optimizer().schedule().decay(), OptimizerConfig::COSINE);
  EXPECT_EQ(spec.precision().param_dtype(), PrecisionConfig::BF16);
  // compute_dtype follows an explicit param_dtype.
  EXPECT_EQ(spec.precision().compute_dtype(), PrecisionConfig::BF16);
  EXPECT_EQ(spec.parallel().world_size(), 0);
  EXPECT_EQ(spec.resources().device(), ResourceConfig::CUDA);
}

TEST(JobDefaultsTest, DataSeedFollowsAnExplicitTrainSeed) {
  JobSpec spec = Minimal(ModelConfig::GPT2);
  spec.mutable_train()->set_seed(99);
  ApplyJobDefaults(&spec);
  EXPECT_EQ(spec.data().seed(), 99u);
}

TEST(JobDefaultsTest, FamilyDependentDefaultsWaitForAFamily) {
  JobSpec spec = Minimal(ModelConfig::FAMILY_UNSPECIFIED);
  ApplyJobDefaults(&spec);
  EXPECT_FALSE(spec.model().has_d_ff());
  EXPECT_FALSE(spec.model().has_tie_embeddings());
  EXPECT_EQ(spec.model().n_kv_head(), 6);
}

TEST(JobDefaultsTest, IsIdempotent) {
  for (const char* yaml : {testing::kMinimalYaml, testing::kFullYaml}) {
    JobSpec once = testing::JobWithDefaults(yaml);
    JobSpec twice = once;
    ApplyJobDefaults(&twice);
    EXPECT_TRUE(MessageDifferencer::Equals(once, twice)) << yaml;
  }
  // A fully specified job is left as it was.
  absl::StatusOr<JobSpec> full = ParseJobText(testing::kFullYaml, JobFormat::kYaml, "full.yaml");
  ASSERT_TRUE(full.ok()) << full.status();
  JobSpec completed = *full;
  ApplyJobDefaults(&completed);
  EXPECT_TRUE(MessageDifferencer::Equals(*full, completed));
}

}  // namespace
}  // namespace zt
