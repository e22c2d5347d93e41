// Activation checkpointing: every policy gives gradients bitwise identical to keeping every
// activation (recompute runs the same ops on the same inputs), while planning less memory.
#include <cstring>
#include <random>

#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "worker/model/transformer.h"
#include "worker/plan/arena.h"
#include "worker/plan/memory_plan.h"

namespace zt {
namespace {

using Ckpt = zerotrain::MemoryConfig;

zerotrain::JobSpec Job(zerotrain::ModelConfig::Family family, Ckpt::ActivationCheckpointing policy,
                       int every_k = 1) {
  zerotrain::JobSpec job;
  auto* m = job.mutable_model();
  m->set_family(family);
  const bool gpt2 = family == zerotrain::ModelConfig::GPT2;
  m->set_n_layer(4);
  m->set_n_head(4);
  m->set_n_kv_head(gpt2 ? 4 : 2);
  m->set_d_model(32);
  m->set_d_ff(gpt2 ? 128 : 64);
  m->set_vocab_size(40);
  m->set_max_seq_len(16);
  m->set_tie_embeddings(gpt2);
  m->set_norm_eps(1e-5f);
  m->set_rope_theta(10000.0f);
  m->set_init_std(0.2f);
  job.mutable_data()->set_seq_len(16);
  job.mutable_train()->set_micro_batch_size(3);
  job.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAMW);
  job.mutable_resources()->set_cpu_threads(2);
  job.mutable_memory()->set_activation_checkpointing(policy);
  job.mutable_memory()->set_checkpoint_every_k(every_k);
  return job;
}

struct Result {
  double loss = 0;
  std::vector<std::vector<float>> grads;
  int64_t activation_bytes = 0;
};

Result TrainOneMicroBatch(const zerotrain::JobSpec& job) {
  const MemoryPlan plan = PlanMemory(job);
  auto arenas = Arenas::Create(plan).value();
  Transformer m = Transformer::Bind(job.model(), *arenas, *arenas, job.train().micro_batch_size(),
                                    job.data().seq_len())
                      .value();
  m.InitializeWeights(3);
  std::mt19937 rng(9);
  const int64_t n = m.batch() * m.seq_len();
  for (int64_t i = 0; i < n; ++i) {
    m.tokens().data<int32_t>()[i] = static_cast<int32_t>(rng() % 40);
    m.targets().data<int32_t>()[i] = static_cast<int32_t>(rng() % 40);
  }
  DeviceContext ctx = JobDeviceContext(job);
  const Tensor ws = arenas->Get("gemm_workspace").value();
  ctx.workspace = {.data = ws.raw(), .bytes = ws.size_bytes()};
  for (const Tensor& g : m.unit_grads()) EXPECT_TRUE(Zero(ctx, g).ok());
  Result r;
  r.loss = m.ForwardLoss(ctx, {.write_grad = true, .grad_scale = 1.0f / n}).value();
  EXPECT_TRUE(m.Backward(ctx).ok());
  for (const Tensor& g : m.unit_grads()) {
    r.grads.emplace_back(g.data<float>(), g.data<float>() + g.numel());
  }
  r.activation_bytes = plan.CategoryBytes(MemoryCategory::kActivations);
  return r;
}

bool BitwiseEqual(const std::vector<std::vector<float>>& a,
                  const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t u = 0; u < a.size(); ++u) {
    if (a[u].size() != b[u].size() ||
        std::memcmp(a[u].data(), b[u].data(), a[u].size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

class ActivationCheckpointingTest
    : public ::testing::TestWithParam<zerotrain::ModelConfig::Family> {};

TEST_P(ActivationCheckpointingTest, EveryPolicyGivesBitwiseIdenticalGradients) {
  const Result none = TrainOneMicroBatch(Job(GetParam(), Ckpt::NONE));
  const Result full = TrainOneMicroBatch(Job(GetParam(), Ckpt::FULL));
  const Result every2 = TrainOneMicroBatch(Job(GetParam(), Ckpt::EVERY_K, 2));
  const Result selective = TrainOneMicroBatch(Job(GetParam(), Ckpt::SELECTIVE));
  for (const Result* r : {&full, &every2, &selective}) {
    EXPECT_EQ(r->loss, none.loss);
    EXPECT_TRUE(BitwiseEqual(r->grads, none.grads));
  }
  // Each policy keeps less: FULL keeps the residual stream and one block's set.
  EXPECT_LT(full.activation_bytes, every2.activation_bytes);
  EXPECT_LT(every2.activation_bytes, none.activation_bytes);
  EXPECT_LT(selective.activation_bytes, none.activation_bytes);
  EXPECT_LT(full.activation_bytes, selective.activation_bytes);
}

INSTANTIATE_TEST_SUITE_P(Families, ActivationCheckpointingTest,
                         ::testing::Values(zerotrain::ModelConfig::GPT2,
                                           zerotrain::ModelConfig::LLAMA),
                         [](const auto& info) {
                           return info.param == zerotrain::ModelConfig::GPT2 ? "Gpt2" : "Llama";
                         });

// The plan's activation bytes follow the policy exactly: per block, FULL drops everything
// but the residual, SELECTIVE drops atty + att_lse + fch_act (then adds one shared set).
TEST(ActivationCheckpointingPlanTest, BytesFollowThePolicy) {
  const int64_t BT = 3 * 16, C = 32, F = 128, H = 4, L = 4;
  const int64_t residual = (L + 1) * BT * C * 4;
  // ln1, ln2 (C each), qkv (3C), res2 (C), fch (F) and four stats of BT; core: atty (C),
  // att_lse (H·T per sequence = H·BT/… here B·H·T = H·BT), fch_act (F).
  const int64_t inputs = (BT * (C + C + 3 * C + C + F) + 4 * BT) * 4;
  const int64_t core = (BT * (C + F) + H * BT) * 4;
  const int64_t head = (BT * C + 3 * BT) * 4;
  auto bytes = [&](Ckpt::ActivationCheckpointing p, int k) {
    return PlanMemory(Job(zerotrain::ModelConfig::GPT2, p, k))
        .CategoryBytes(MemoryCategory::kActivations);
  };
  // Every buffer here is a multiple of 64 bytes, so alignment adds nothing.
  EXPECT_EQ(bytes(Ckpt::NONE, 1), residual + L * (inputs + core) + head);
  EXPECT_EQ(bytes(Ckpt::FULL, 1), residual + (inputs + core) + head);
  EXPECT_EQ(bytes(Ckpt::EVERY_K, 2), residual + 2 * (inputs + core) + (inputs + core) + head);
  EXPECT_EQ(bytes(Ckpt::SELECTIVE, 1), residual + L * inputs + core + head);
}

}  // namespace
}  // namespace zt
