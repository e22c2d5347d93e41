// Whole-model checks: the loss at initialisation and the analytic gradient of every tensor
// against central finite differences, for both families (Llama with grouped KV heads).
#include "worker/model/transformer.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "worker/plan/arena.h"
#include "worker/plan/memory_plan.h"

namespace zt {
namespace {

zerotrain::JobSpec TinyJob(zerotrain::ModelConfig::Family family, int micro_batch = 2) {
  zerotrain::JobSpec job;
  auto* m = job.mutable_model();
  m->set_family(family);
  const bool gpt2 = family == zerotrain::ModelConfig::GPT2;
  m->set_n_layer(2);
  m->set_n_head(4);
  m->set_n_kv_head(gpt2 ? 4 : 2);
  m->set_d_model(16);
  m->set_d_ff(gpt2 ? 64 : 24);
  m->set_vocab_size(11);
  m->set_max_seq_len(8);
  m->set_tie_embeddings(gpt2);
  m->set_norm_eps(1e-5f);
  m->set_rope_theta(10000.0f);
  m->set_init_std(0.02f);
  job.mutable_data()->set_seq_len(7);
  job.mutable_train()->set_micro_batch_size(micro_batch);
  job.mutable_train()->set_grad_accum_steps(1);
  job.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAMW);
  return job;
}

struct Bound {
  std::unique_ptr<Arenas> arenas;
  std::optional<Transformer> model;
};

Bound BindJob(const zerotrain::JobSpec& job) {
  Bound b;
  b.arenas = std::move(Arenas::Create(PlanMemory(job))).value();
  b.model.emplace(Transformer::Bind(job.model(), *b.arenas, *b.arenas,
                                    job.train().micro_batch_size(), job.data().seq_len())
                      .value());
  return b;
}

// The context the plan sized "gemm_workspace" for (JobDeviceContext), pointed at that buffer.
DeviceContext PlannedContext(const Bound& b, const zerotrain::JobSpec& job) {
  DeviceContext ctx = JobDeviceContext(job);
  const Tensor workspace = b.arenas->Get("gemm_workspace").value();
  ctx.workspace = {.data = workspace.raw(), .bytes = workspace.size_bytes()};
  return ctx;
}

void FillTokens(Transformer& m, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t n = m.batch() * m.seq_len();
  for (int64_t i = 0; i < n; ++i) {
    m.tokens().data<int32_t>()[i] = static_cast<int32_t>(rng() % vocab);
    m.targets().data<int32_t>()[i] = static_cast<int32_t>(rng() % vocab);
  }
}

class TransformerTest : public ::testing::TestWithParam<zerotrain::ModelConfig::Family> {};

TEST_P(TransformerTest, InitialLossIsNearLogVocab) {
  zerotrain::JobSpec job = TinyJob(GetParam());
  job.mutable_resources()->set_cpu_threads(2);
  Bound b = BindJob(job);
  b.model->InitializeWeights(7);
  FillTokens(*b.model, 11, 3);
  const DeviceContext ctx = PlannedContext(b, job);
  const double loss = b.model->ForwardLoss(ctx, {}).value();
  // With std-0.02 weights the logits are nearly uniform: loss ≈ ln V within a few percent.
  EXPECT_NEAR(loss, std::log(11.0), 0.05 * std::log(11.0));
}

void CheckGradientsAgainstFiniteDifferences(zerotrain::JobSpec job) {
  job.mutable_resources()->set_cpu_threads(1);
  Bound b = BindJob(job);
  Transformer& m = *b.model;
  // Larger weights than the default init make every path carry gradient worth measuring.
  zerotrain::JobSpec big = job;
  big.mutable_model()->set_init_std(0.3f);
  Bound init = BindJob(big);
  init.model->InitializeWeights(11);
  for (size_t u = 0; u < m.unit_params().size(); ++u) {
    std::copy_n(init.model->unit_params()[u].data<float>(), m.unit_params()[u].numel(),
                m.unit_params()[u].data<float>());
  }
  FillTokens(m, 11, 5);
  const DeviceContext ctx = PlannedContext(b, job);
  const float scale = 1.0f / static_cast<float>(m.batch() * m.seq_len());
  for (const Tensor& g : m.unit_grads()) ASSERT_TRUE(Zero(ctx, g).ok());
  ASSERT_TRUE(m.ForwardLoss(ctx, {.write_grad = true, .grad_scale = scale}).ok());
  ASSERT_TRUE(m.Backward(ctx).ok());

  // For every tensor, the coordinates with the largest gradients: central differences in
  // fp32 have ~1e-7·loss/h absolute noise, so small components cannot be checked this way.
  const double h = 1e-2;
  int checked = 0;
  for (size_t u = 0; u < m.layout().units.size(); ++u) {
    for (const ParamSpec& p : m.layout().units[u].params) {
      float* w = m.unit_params()[u].data<float>() + p.offset;
      const float* g = m.unit_grads()[u].data<float>() + p.offset;
      std::vector<int64_t> idx(p.numel);
      for (int64_t i = 0; i < p.numel; ++i) idx[i] = i;
      std::partial_sort(idx.begin(), idx.begin() + std::min<int64_t>(3, p.numel), idx.end(),
                        [&](int64_t a, int64_t c) { return std::abs(g[a]) > std::abs(g[c]); });
      for (int k = 0; k < std::min<int64_t>(3, p.numel); ++k) {
        const int64_t i = idx[k];
        const float saved = w[i];
        w[i] = saved + static_cast<float>(h);
        const double lp = m.ForwardLoss(ctx, {}).value();
        w[i] = saved - static_cast<float>(h);
        const double lm = m.ForwardLoss(ctx, {}).value();
        w[i] = saved;
        const double fd = (lp - lm) / (2 * h);
        // 2% + 2e-4: truncation error O(h²) of the central difference plus fp32 noise of
        // the loss (~1e-6) divided by 2h.
        EXPECT_NEAR(g[i], fd, 0.02 * std::abs(fd) + 2e-4)
            << m.layout().units[u].name << "." << p.name << "[" << i << "]";
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 20);
}

TEST_P(TransformerTest, GradientsMatchFiniteDifferences) {
  CheckGradientsAgainstFiniteDifferences(TinyJob(GetParam()));
}

// 40 × 7 = 280 rows: the loss runs in two chunks (256 + 24 rows), so the output projection's
// weight gradient accumulates across chunks and the norm's input gradient is stitched.
TEST_P(TransformerTest, GradientsMatchFiniteDifferencesAcrossLossChunks) {
  CheckGradientsAgainstFiniteDifferences(TinyJob(GetParam(), 40));
}

INSTANTIATE_TEST_SUITE_P(Families, TransformerTest,
                         ::testing::Values(zerotrain::ModelConfig::GPT2,
                                           zerotrain::ModelConfig::LLAMA),
                         [](const auto& info) {
                           return info.param == zerotrain::ModelConfig::GPT2 ? "Gpt2" : "Llama";
                         });

}  // namespace
}  // namespace zt
