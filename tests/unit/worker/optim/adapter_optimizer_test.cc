// The optimizer over a LoRA model's adapters (worker/plan/lora_plan.h's LoraAdapterLayout):
// AdamW and 8-bit AdamW find the adapters' planned states, train them, and leave the frozen
// base as it was, bit for bit.
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "tests/unit/worker/model/lora_test_model.h"
#include "worker/optim/optimizer.h"
#include "worker/plan/lora_plan.h"

namespace zt {
namespace {

using zerotrain::ModelConfig;
using zerotrain::OptimizerConfig;

class AdapterOptimizerTest
    : public ::testing::TestWithParam<std::tuple<ModelConfig::Family, OptimizerConfig::Type>> {};

TEST_P(AdapterOptimizerTest, TrainsTheAdaptersAndNothingElse) {
  const auto [family, type] = GetParam();
  zerotrain::JobSpec job = testing::TinyLoraJob(family, 0.1f);
  auto* opt = job.mutable_optimizer();
  opt->set_type(type);
  opt->set_beta1(0.9f);
  opt->set_beta2(0.999f);
  opt->set_eps(1e-8f);
  opt->set_weight_decay(0.0f);
  opt->set_quant_block_size(64);
  opt->set_min_quantized_numel(0);  // every adapter matrix 8-bit, however small
  testing::Bound b = testing::BindJob(job);
  Transformer& m = *b.model;
  m.InitializeWeights(3);
  m.InitializeLora(4);
  testing::FillTokens(m, 6);

  const ModelLayout adapters = LoraAdapterLayout(m.layout());
  ASSERT_EQ(adapters.units.size(), 2u);
  zerotrain::PrecisionConfig precision;
  precision.set_master_weights(false);  // the adapters are f32
  absl::StatusOr<Optimizer> optimizer =
      Optimizer::Create(job.optimizer(), precision, adapters, *b.arenas);
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  std::vector<Tensor> params, grads;
  for (size_t u = 0; u < m.unit_lora().size(); ++u) {
    if (m.unit_lora()[u].empty()) continue;
    params.push_back(m.unit_lora()[u]);
    grads.push_back(m.unit_lora_grads()[u]);
  }
  std::vector<std::vector<char>> base_before;
  for (const Tensor& p : m.unit_params()) {
    base_before.emplace_back(static_cast<char*>(p.raw()),
                             static_cast<char*>(p.raw()) + p.size_bytes());
  }
  const float grad_scale = 1.0f / static_cast<float>(m.batch() * m.seq_len());
  double first = 0, last = 0;
  for (int step = 1; step <= 30; ++step) {
    m.SetLoraDropoutSeed(static_cast<uint64_t>(step));
    for (const Tensor& g : grads) ASSERT_TRUE(Zero(b.ctx, g).ok());
    const double loss =
        m.ForwardLoss(b.ctx, {.write_grad = true, .grad_scale = grad_scale}).value();
    ASSERT_TRUE(m.Backward(b.ctx).ok());
    if (step == 1) first = loss;
    last = loss;
    ASSERT_TRUE(optimizer->Step(b.ctx, params, grads, /*lr=*/1e-2f, /*grad_scale=*/1.0f).ok());
  }
  // One fixed batch: 30 steps on the adapters alone fit it measurably, 8-bit states included.
  EXPECT_LT(last, first - 0.05) << first << " -> " << last;
  for (size_t u = 0; u < m.unit_params().size(); ++u) {
    const Tensor& p = m.unit_params()[u];
    EXPECT_EQ(std::memcmp(p.raw(), base_before[u].data(), p.size_bytes()), 0)
        << m.layout().units[u].name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    FamiliesAndOptimizers, AdapterOptimizerTest,
    ::testing::Combine(::testing::Values(ModelConfig::GPT2, ModelConfig::LLAMA),
                       ::testing::Values(OptimizerConfig::ADAMW, OptimizerConfig::ADAMW_8BIT)));

}  // namespace
}  // namespace zt
