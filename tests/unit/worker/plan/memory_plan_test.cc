// Tests of the GEMM workspace in the memory plan (worker/plan/memory_plan.h,
// worker/model/activation_table.h): the plan holds the largest scratch any linear layer's GEMM
// needs on the job's context, and a step run on exactly that buffer succeeds.
#include "worker/plan/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/norm.h"
#include "worker/model/activation_table.h"
#include "worker/model/transformer.h"
#include "worker/plan/arena.h"

namespace zt {
namespace {

zerotrain::JobSpec SmallJob(zerotrain::ModelConfig::Family family, int threads) {
  zerotrain::JobSpec job;
  auto* m = job.mutable_model();
  m->set_family(family);
  const bool gpt2 = family == zerotrain::ModelConfig::GPT2;
  m->set_n_layer(2);
  m->set_n_head(4);
  m->set_n_kv_head(gpt2 ? 4 : 2);
  m->set_d_model(64);
  m->set_d_ff(gpt2 ? 256 : 96);
  m->set_vocab_size(300);  // the widest layer, so the head's GEMMs set the size
  m->set_max_seq_len(32);
  m->set_tie_embeddings(gpt2);
  m->set_norm_eps(1e-5f);
  m->set_rope_theta(10000.0f);
  m->set_init_std(0.02f);
  job.mutable_data()->set_seq_len(32);
  job.mutable_train()->set_micro_batch_size(4);
  job.mutable_train()->set_grad_accum_steps(1);
  job.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAMW);
  job.mutable_resources()->set_cpu_threads(threads);
  return job;
}

const BufferSpec* FindBuffer(const MemoryPlan& plan, const std::string& name) {
  for (const BufferSpec& b : plan.buffers) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

class GemmWorkspacePlanTest : public ::testing::TestWithParam<zerotrain::ModelConfig::Family> {};

TEST_P(GemmWorkspacePlanTest, PlanHoldsTheLargestLinearLayerScratch) {
  const zerotrain::JobSpec job = SmallJob(GetParam(), 2);
  const MemoryPlan plan = PlanMemory(job);
  const BufferSpec* ws = FindBuffer(plan, "gemm_workspace");
  ASSERT_NE(ws, nullptr);
  EXPECT_EQ(ws->category, MemoryCategory::kWorkspace);
  EXPECT_EQ(ws->dtype, DType::kU8);

  const DeviceContext ctx = JobDeviceContext(job);
  EXPECT_EQ(ctx.num_threads, 2);
  const int64_t M = 4 * 32, C = 64, V = 300;
  const bool gpt2 = GetParam() == zerotrain::ModelConfig::GPT2;
  const int64_t F = gpt2 ? 256 : 96;
  const int64_t qkv_out = gpt2 ? 3 * C : (4 + 2 * 2) * (C / 4);  // (H + 2·Hkv)·D
  const int64_t fc_out = gpt2 ? F : 2 * F;                       // [gate|up] for Llama
  int64_t most = 0;
  // (K, N) of qkv, attn.proj, mlp.fc, mlp.proj, lm_head, written out independently of the
  // table's own enumeration.
  for (const auto& [k, n] : {std::pair{C, qkv_out}, {C, C}, {C, fc_out}, {F, C}, {C, V}}) {
    most = std::max(most, LinearWorkspaceBytes(ctx, M, k, n).value());
  }
  // oneDNN's AVX-512 matmuls take scratch at these shapes; its AVX2 ones (a CPU without
  // AVX-512) take none, and then the plan must hold none.
  if (absl::StrContains(CpuGemmDescription(CpuGemm::kOneDnn), "avx512")) EXPECT_GT(most, 0);
  EXPECT_EQ(ws->bytes(), most);
  EXPECT_EQ(GemmWorkspaceBytesFor(job.model(), 4, 32, ctx), most);
}

// On a CUDA device every op's scratch comes from the one workspace: at a long context the
// attention backward's row sums (B·H·T f32: 64 MiB here) outgrow cuBLASLt's 32 MiB, and the
// plan must hold them or the backward fails FailedPrecondition on the GPU. Arithmetic only.
TEST_P(GemmWorkspacePlanTest, ACudaWorkspaceHoldsTheLargestScratchOfAnyOp) {
  zerotrain::JobSpec job = SmallJob(GetParam(), 2);
  job.mutable_model()->set_n_head(32);
  job.mutable_model()->set_n_kv_head(GetParam() == zerotrain::ModelConfig::GPT2 ? 32 : 8);
  job.mutable_model()->set_d_model(32 * 64);
  DeviceContext ctx;
  ctx.device = Device{.kind = DeviceKind::kCuda, .index = 0};
  const int64_t B = 64, T = 8192;
  const int64_t attention = AttentionWorkspaceBytes(DeviceKind::kCuda, B, T, 32);
  ASSERT_GT(attention, int64_t{32} << 20);
  const int64_t ws = GemmWorkspaceBytesFor(job.model(), B, T, ctx);
  EXPECT_GE(ws, attention);
  EXPECT_GE(ws, EmbeddingWorkspaceBytes(DeviceKind::kCuda, B * T, 300));
  EXPECT_GE(ws, LayerNormBackwardWorkspaceBytes(DeviceKind::kCuda, B * T, 32 * 64));
  EXPECT_GE(ws, RmsNormBackwardWorkspaceBytes(DeviceKind::kCuda, B * T, 32 * 64));
}

TEST_P(GemmWorkspacePlanTest, OpenBlasNeedsNoWorkspace) {
  const zerotrain::JobSpec job = SmallJob(GetParam(), 2);
  DeviceContext ctx = JobDeviceContext(job);
  ctx.cpu_gemm = CpuGemm::kOpenBlas;
  EXPECT_EQ(GemmWorkspaceBytesFor(job.model(), 4, 32, ctx), 0);
  const MemoryPlan inference = PlanInference(job, ctx, 1, 32);
  const BufferSpec* ws = FindBuffer(inference, "gemm_workspace");
  ASSERT_NE(ws, nullptr);
  EXPECT_EQ(ws->bytes(), 0);
}

// The plan and the engine agree: a whole training step (forward, loss, backward) runs on
// exactly the planned buffer, for each thread count the job may ask for.
TEST_P(GemmWorkspacePlanTest, StepRunsOnThePlannedWorkspace) {
  for (int threads : {1, 2, 3}) {
    const zerotrain::JobSpec job = SmallJob(GetParam(), threads);
    const MemoryPlan plan = PlanMemory(job);
    std::unique_ptr<Arenas> arenas = Arenas::Create(plan).value();
    Transformer model = Transformer::Bind(job.model(), *arenas, *arenas, 4, 32).value();
    model.InitializeWeights(3);
    std::mt19937 rng(threads);
    for (int64_t i = 0; i < 4 * 32; ++i) {
      model.tokens().data<int32_t>()[i] = static_cast<int32_t>(rng() % 300);
      model.targets().data<int32_t>()[i] = static_cast<int32_t>(rng() % 300);
    }
    DeviceContext ctx = JobDeviceContext(job);
    const Tensor ws = arenas->Get("gemm_workspace").value();
    ctx.workspace = {.data = ws.raw(), .bytes = ws.size_bytes()};
    for (const Tensor& g : model.unit_grads()) ASSERT_TRUE(Zero(ctx, g).ok());
    const absl::StatusOr<double> loss =
        model.ForwardLoss(ctx, {.write_grad = true, .grad_scale = 1.0f / (4 * 32)});
    ASSERT_TRUE(loss.ok()) << threads << " threads: " << loss.status();
    // Near-uniform logits at init: the loss is ln V within a few percent (a sanity check that
    // the GEMMs ran, not a numerics test; kernels/linear_test.cc does those).
    EXPECT_NEAR(*loss, std::log(300.0), 0.05 * std::log(300.0));
    const absl::Status back = model.Backward(ctx);
    EXPECT_TRUE(back.ok()) << threads << " threads: " << back;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, GemmWorkspacePlanTest,
                         ::testing::Values(zerotrain::ModelConfig::GPT2,
                                           zerotrain::ModelConfig::LLAMA),
                         [](const ::testing::TestParamInfo<zerotrain::ModelConfig::Family>& info) {
                           return std::string(info.param == zerotrain::ModelConfig::GPT2 ? "Gpt2"
                                                                                         : "Llama");
                         });

// A GPU rank's plan: the host cannot read device memory, so Gloo's 16-bit conversion buffers
// (the staged communicator converts on the host) are pinned host memory, and every save —
// synchronous too — has page-locked staging to download the state into.
TEST(MemoryPlanTest, ACudaJobPinsWhatTheHostTouches) {
  zerotrain::JobSpec job = SmallJob(zerotrain::ModelConfig::GPT2, 1);
  job.mutable_parallel()->set_world_size(2);
  job.mutable_parallel()->set_zero_stage(2);
  job.mutable_parallel()->set_shard_group_size(2);
  job.mutable_precision()->set_param_dtype(zerotrain::PrecisionConfig::BF16);
  job.mutable_precision()->set_compute_dtype(zerotrain::PrecisionConfig::BF16);
  job.mutable_precision()->set_grad_dtype(zerotrain::PrecisionConfig::BF16);
  job.mutable_precision()->set_master_weights(true);
  job.mutable_checkpoint()->set_dir("/tmp/unused");
  job.mutable_checkpoint()->set_async(false);
  const MemoryPlan cpu = PlanMemory(job, 0);
  job.mutable_resources()->set_device(zerotrain::ResourceConfig::CUDA);
  const MemoryPlan cuda = PlanMemory(job, 0);
  const BufferSpec* cpu_convert = FindBuffer(cpu, "comm.convert.gradients.0");
  const BufferSpec* cuda_convert = FindBuffer(cuda, "comm.convert.gradients.0");
  ASSERT_NE(cpu_convert, nullptr);
  ASSERT_NE(cuda_convert, nullptr);
  EXPECT_EQ(cpu_convert->category, MemoryCategory::kCommunication);
  EXPECT_EQ(cuda_convert->category, MemoryCategory::kPinnedHost);
  EXPECT_EQ(FindBuffer(cpu, "checkpoint.staging"), nullptr) << "a CPU rank saves from its arenas";
  const BufferSpec* staging = FindBuffer(cuda, "checkpoint.staging");
  ASSERT_NE(staging, nullptr);
  EXPECT_EQ(staging->category, MemoryCategory::kPinnedHost);
  EXPECT_EQ(JobDeviceContext(job).device.kind, DeviceKind::kCuda);
}

// precision.reduce_dtype ≠ grad_dtype: one "grad.reduce" buffer in reduce_dtype, exactly one
// reduction's worth (ShardingEngine::ReduceGradients converts into it), and Gloo's f32
// conversion buffers only where the collectives then carry 16-bit data.
TEST(MemoryPlanTest, ReduceDtypeConversionBufferHoldsOneReduction) {
  using P = zerotrain::PrecisionConfig;
  for (int stage = 0; stage <= 2; ++stage) {
    SCOPED_TRACE(stage);
    zerotrain::JobSpec job = SmallJob(zerotrain::ModelConfig::GPT2, 1);
    job.mutable_parallel()->set_world_size(2);
    job.mutable_parallel()->set_zero_stage(stage);
    job.mutable_parallel()->set_bucket_bytes(4096);  // 1024 f32 elements an all-reduce
    job.mutable_precision()->set_grad_dtype(P::FP32);
    job.mutable_precision()->set_reduce_dtype(P::FP32);
    EXPECT_EQ(FindBuffer(PlanMemory(job, 0), "grad.reduce"), nullptr) << "dtypes match";
    job.mutable_precision()->set_reduce_dtype(P::BF16);
    const MemoryPlan plan = PlanMemory(job, 0);
    const BufferSpec* reduce = FindBuffer(plan, "grad.reduce");
    ASSERT_NE(reduce, nullptr);
    EXPECT_EQ(reduce->dtype, DType::kBF16);
    EXPECT_EQ(reduce->category, MemoryCategory::kCommunication);
    // ZeRO 0: one bucket (every unit is larger); 1–2: the largest unit's padded gradient (the
    // reduce-scatter's input) and its shard (the output), a block here, as padded for 2 ranks.
    const ParallelLayout place = ParallelLayout::ForJob(job, 0);
    UnitShard largest;
    for (const UnitLayout& u : BuildModelLayout(job.model()).units) {
      const UnitShard s = ShardOfUnit(u, place.shard());
      if (s.padded > largest.padded) largest = s;
    }
    ASSERT_GT(largest.padded, 2048);
    EXPECT_EQ(largest.shard_numel * 2, largest.padded);
    const int64_t rs = largest.padded + largest.shard_numel;
    EXPECT_EQ(reduce->numel(), stage == 0 ? 1024 : rs);
    // Gloo widens the bf16 collectives to f32: a bucket or a padded unit.
    const BufferSpec* convert = FindBuffer(plan, "comm.convert.gradients.0");
    ASSERT_NE(convert, nullptr);
    EXPECT_EQ(convert->numel(), stage == 0 ? 1024 : largest.padded);
    // bf16 gradients reduced in fp32: the conversion is the engine's, Gloo converts nothing.
    job.mutable_precision()->set_grad_dtype(P::BF16);
    job.mutable_precision()->set_reduce_dtype(P::FP32);
    const MemoryPlan wide = PlanMemory(job, 0);
    ASSERT_NE(FindBuffer(wide, "grad.reduce"), nullptr);
    EXPECT_EQ(FindBuffer(wide, "grad.reduce")->dtype, DType::kF32);
    EXPECT_EQ(FindBuffer(wide, "grad.reduce")->numel(),
              stage == 0 ? 2048 : rs);  // bf16 buckets of 4096 bytes
    EXPECT_EQ(FindBuffer(wide, "comm.convert.gradients.0"), nullptr);
    // One rank reduces nothing: no conversion.
    job.mutable_parallel()->set_world_size(1);
    EXPECT_EQ(FindBuffer(PlanMemory(job, 0), "grad.reduce"), nullptr);
  }
}

}  // namespace
}  // namespace zt
