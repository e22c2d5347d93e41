// Packed documents (data.packing) on CUDA ranks: the document starts and positions cross with
// each micro-batch's tokens into the plan's batch buffers on the GPU (Trainer::UploadBatch),
// where the attention keeps each query inside its document, RoPE or the learned position
// embedding restart at each document, and the vocabulary-parallel embedding adds the packed
// positions. One rank, TP2 and PP2 (1F1B) ranks sharing the GPU (threads; collectives staged
// through the host, as tensor_parallel_gpu_test.cc's) train the same packed job as CPU ranks,
// in fp32 with TF32 off: one step and 20 steps, losses, gradient norms and the whole model
// (FullWeights). GPT-2 (learned positions, tied) and Llama (RoPE, GQA, untied), head size 64
// (the CUDA attention kernels take D = 64 and 128), on document shards of 2..30 tokens
// (tests/unit/worker/trainer/document_corpus.h) packed into rows of 32 with prompts masked.
// Jobs are validated as CPU jobs, then moved to CUDA, as trainer_gpu_test.cc's.
#if ZT_HAVE_CUDA

#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/worker/train/gpu_train_runs.h"
#include "tests/unit/worker/trainer/document_corpus.h"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "worker/job/job_loading.h"

namespace zt {
namespace {

using gpu_test::MaxAbsDiff;
using gpu_test::RelativeL2;
using gpu_test::RunResult;
using gpu_test::TrainRanks;
using zerotrain::JobSpec;
using zerotrain::ResourceConfig;

enum class Layout { kOneRank, kTensorParallel, kPipeline };

// (llama, layout)
class PackedGpuTest : public ::testing::TestWithParam<std::tuple<bool, Layout>> {
 protected:
  void SetUp() override {
    if (gpu_test::SkipReason()) return;
    dir_ = testing::TestScratchDir("zt-packed-gpu-test");
    testing::WriteDocumentShard((dir_ / "docs.bin").string(), 30);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  JobSpec Job(ResourceConfig::DeviceKind device, int steps) const {
    const bool llama = std::get<0>(GetParam());
    const Layout layout = std::get<1>(GetParam());
    JobSpec job = gpu_test::GpuTestJob("packed-gpu", (dir_ / "docs.bin").string());
    auto* m = job.mutable_model();
    m->set_n_head(4);
    m->set_d_model(256);  // head size 64
    if (llama) {
      m->set_family(zerotrain::ModelConfig::LLAMA);
      m->set_n_kv_head(2);
      m->set_d_ff(512);
      m->set_tie_embeddings(false);
    }
    job.mutable_data()->set_packing(true);
    job.mutable_train()->set_micro_batch_size(4);
    job.mutable_train()->set_grad_accum_steps(2);
    job.mutable_train()->set_max_steps(steps);
    if (layout != Layout::kOneRank) job.mutable_parallel()->set_world_size(2);
    if (layout == Layout::kTensorParallel) job.mutable_parallel()->set_tensor_parallel(2);
    if (layout == Layout::kPipeline) job.mutable_parallel()->set_pipeline_parallel(2);
    JobSpec valid = ValidatedJob(job).value();
    valid.mutable_resources()->set_device(device);
    return valid;
  }

  std::filesystem::path dir_;
};

TEST_P(PackedGpuTest, CudaRanksMatchCpuRanks) {
  ZT_SKIP_WITHOUT_GPU();
  // One step: every GPU op is its CPU twin up to the order of its f32 sums (~1e-7 relative an
  // op, docs/cuda.md): the loss within 1e-5 relative (100× the noise; a position not restarted
  // or attention across documents changes it at the percent level). The weights moved by one
  // Adam step of lr 3e-3 whose update m/√v is ±1 for nearly every weight, so reordered sums
  // change them only through ε and the clipping factor: 1e-6 absolute, three orders below lr.
  const RunResult cpu1 = TrainRanks(Job(ResourceConfig::CPU, 1), 1);
  const RunResult gpu1 = TrainRanks(Job(ResourceConfig::CUDA, 1), 1);
  ASSERT_EQ(gpu1.losses.size(), 1u);
  ASSERT_EQ(cpu1.losses.size(), 1u);
  EXPECT_NEAR(gpu1.losses[0], cpu1.losses[0], 1e-5 * cpu1.losses[0]);
  EXPECT_NEAR(gpu1.grad_norms[0], cpu1.grad_norms[0], 1e-5 * cpu1.grad_norms[0]);
  for (size_t r = 0; r < gpu1.all_weights.size(); ++r) {
    EXPECT_LT(MaxAbsDiff(gpu1.all_weights[r], cpu1.weights), 1e-6) << "rank " << r << "'s whole";
  }

  // 20 steps: Adam amplifies the reordering noise of gradients near zero, so the runs drift
  // apart slowly, as tensor_parallel_gpu_test.cc's do: 1e-4 relative on the losses and on the
  // weights' L2, 100× that drift and 30× below one wrong update (lr / |w| ≈ 3e-2).
  const RunResult cpu = TrainRanks(Job(ResourceConfig::CPU, 20), 20);
  const RunResult gpu = TrainRanks(Job(ResourceConfig::CUDA, 20), 20);
  ASSERT_EQ(gpu.losses.size(), 20u);
  ASSERT_EQ(cpu.losses.size(), 20u);
  EXPECT_LT(gpu.losses.back(), gpu.losses.front() - 0.3) << "the model learns on the GPU";
  for (size_t s = 0; s < 20; ++s) {
    EXPECT_NEAR(gpu.losses[s], cpu.losses[s], 1e-4 * cpu.losses[s]) << "step " << s + 1;
  }
  EXPECT_LT(RelativeL2(gpu.weights, cpu.weights), 1e-4);
  for (size_t r = 1; r < gpu.all_weights.size(); ++r) {
    EXPECT_EQ(gpu.all_weights[r], gpu.weights) << "rank " << r << " joins the same whole model";
  }
}

// The suite's test names: "<family>_<layout>" (a lambda's structured binding would not pass
// through the macro's commas).
std::string CaseName(const ::testing::TestParamInfo<std::tuple<bool, Layout>>& info) {
  const char* layouts[] = {"one_rank", "tp2", "pp2"};
  return absl::StrCat(std::get<0>(info.param) ? "llama_" : "gpt2_",
                      layouts[static_cast<int>(std::get<1>(info.param))]);
}

INSTANTIATE_TEST_SUITE_P(All, PackedGpuTest,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(Layout::kOneRank,
                                                              Layout::kTensorParallel,
                                                              Layout::kPipeline)),
                         CaseName);

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
