// LoRA and QLoRA on pipeline stages and tensor-parallel ranks whose memory the host cannot
// address (separate_memory_device.h: arenas on a device of their own, staged communicators for
// the data-, tensor- and pipeline-parallel groups, every kernel and staged collective refusing
// memory from the other side), what CUDA ranks are, less the streams. Each stage's or share's
// adapters are initialised into host staging and uploaded (Transformer::InitializeLora's
// `into`), an NF4 or INT8 base is quantized on the host — a tensor-parallel rank's share of the
// one-rank weight — and uploaded (Transformer::SetQuantizedBaseUpload). Every layout is the same
// job on plain CPU ranks bit for bit: the same ops on the same values in the same order, only
// where the bytes live differs — every rank's losses, gradient norms, exported adapters and
// frozen base.
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/trainer/lora_parallel_runs.h"
#include "tests/unit/worker/trainer/separate_memory_device.h"

namespace zt {
namespace {

using namespace lora_parallel_testing;  // NOLINT: lora_parallel_runs.h's names

void ExpectBitForBit(const Outcome& got, const Outcome& want, const std::string& what) {
  ASSERT_TRUE(want.status.ok()) << what << ": " << want.status;
  ASSERT_TRUE(got.status.ok()) << what << ": " << got.status;
  ASSERT_EQ(got.ranks.size(), want.ranks.size()) << what;
  for (size_t r = 0; r < want.ranks.size(); ++r) {
    const RankRun& g = got.ranks[r];
    const RankRun& w = want.ranks[r];
    ASSERT_EQ(w.losses.size(), 6u) << what << " rank " << r;
    EXPECT_EQ(g.losses, w.losses) << what << " rank " << r;
    EXPECT_EQ(g.grad_norms, w.grad_norms) << what << " rank " << r;
    EXPECT_EQ(g.adapters, w.adapters) << what << " rank " << r;
    EXPECT_FALSE(w.base_after.empty()) << what << " rank " << r;
    EXPECT_EQ(g.base_after, w.base_after) << what << " rank " << r;
    EXPECT_TRUE(g.unclaimed.empty()) << what << " rank " << r;
    EXPECT_TRUE(g.off_plan.empty()) << what << " rank " << r;
  }
  // The adapters trained: a run that never uploaded them (B stays zero) would not move.
  EXPECT_NE(want.ranks[0].losses.front(), want.ranks[0].losses.back()) << what;
}

class LoraParallelSeparateMemoryTest : public LoraParallelTrainingTest {
 protected:
  static TrainOptions Separate() {
    TrainOptions options;
    options.make_device = testing::SeparateMemoryDevice;
    return options;
  }
  void ExpectSeparateIsPlain(JobSpec job, const std::string& what) {
    job.mutable_train()->set_max_steps(6);
    job.mutable_model()->mutable_lora()->set_dropout(0.1f);  // the masks drawn on the device
    ExpectBitForBit(RunAll(job, 6, "", Separate()), RunAll(job, 6), what);
  }
  JobSpec Layout(bool llama, int tp, int pp, int dp, int zero, ModelConfig::BaseDType base) {
    JobSpec job = Job(llama, pp, dp, zero, 1, ParallelConfig::ONE_F_ONE_B, base);
    if (tp > 1) job = Wide(job);  // an NF4 share holds whole 64-element blocks
    job.mutable_parallel()->set_world_size(tp * pp * dp);
    job.mutable_parallel()->set_tensor_parallel(tp);
    return job;
  }
};

TEST_F(LoraParallelSeparateMemoryTest, PipelineStagesTrainTheirAdaptersBitForBit) {
  ExpectSeparateIsPlain(Layout(false, 1, 2, 1, 0, ModelConfig::FP32), "gpt2 fp32 pp2");
  ExpectSeparateIsPlain(Layout(true, 1, 2, 2, 1, ModelConfig::NF4), "llama nf4 pp2 x dp2 zero-1");
  ExpectSeparateIsPlain(Layout(true, 1, 2, 2, 3, ModelConfig::INT8), "llama int8 pp2 x dp2 zero-3");
}

TEST_F(LoraParallelSeparateMemoryTest, TensorParallelSharesTrainBitForBit) {
  ExpectSeparateIsPlain(Layout(true, 2, 1, 1, 0, ModelConfig::FP32), "llama fp32 tp2");
  ExpectSeparateIsPlain(Layout(false, 2, 1, 1, 0, ModelConfig::NF4), "gpt2 nf4 tp2");
  ExpectSeparateIsPlain(Layout(true, 2, 1, 2, 3, ModelConfig::NF4), "llama nf4 tp2 x dp2 zero-3");
  ExpectSeparateIsPlain(Layout(true, 2, 2, 1, 0, ModelConfig::INT8), "llama int8 tp2 x pp2");
}

// A TP2 × PP2 checkpoint of adapter shares and their states written from ranks of their own
// memory resumes on them as the run that never stopped, over an NF4 base quantized and uploaded
// again at the start.
TEST_F(LoraParallelSeparateMemoryTest, TensorParallelStagesResumeBitForBit) {
  JobSpec job = Layout(true, 2, 2, 1, 0, ModelConfig::NF4);
  job.mutable_train()->set_max_steps(6);
  const Outcome straight = RunAll(job, 6);
  job.mutable_checkpoint()->set_dir((dir_ / "ckpt").string());
  job.mutable_checkpoint()->set_interval_steps(3);
  job.mutable_checkpoint()->set_async(true);  // a device's state leaves through page-locked staging
  const Outcome first = RunAll(job, 3, "", Separate());
  const Outcome second = RunAll(job, 6, job.checkpoint().dir(), Separate());
  ASSERT_TRUE(straight.status.ok()) << straight.status;
  ASSERT_TRUE(first.status.ok()) << first.status;
  ASSERT_TRUE(second.status.ok()) << second.status;
  for (size_t r = 0; r < straight.ranks.size(); ++r) {
    const std::vector<double>& all = straight.ranks[r].losses;
    ASSERT_EQ(all.size(), 6u) << r;
    EXPECT_EQ(first.ranks[r].losses, std::vector<double>(all.begin(), all.begin() + 3)) << r;
    EXPECT_EQ(second.ranks[r].losses, std::vector<double>(all.begin() + 3, all.end())) << r;
    EXPECT_EQ(second.ranks[r].adapters, straight.ranks[r].adapters) << r;
    EXPECT_EQ(second.ranks[r].base_after, straight.ranks[r].base_after) << r;
  }
}

}  // namespace
}  // namespace zt
