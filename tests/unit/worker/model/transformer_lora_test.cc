// LoRA in the model (worker/model/transformer_lora.cc): adapter gradients against central
// finite differences, a frozen base that nothing writes, the merged weight W + scale·B·A giving
// the adapter path's forward, and a few optimizer steps that train the adapters alone; NF4 and
// INT8 bases against f32 bases of their dequantized weights.
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "kernels/int8_linear.h"
#include "kernels/nf4.h"
#include "kernels/optimizer.h"
#include "tests/unit/worker/model/lora_test_model.h"
#include "worker/model/lora_merge.h"
#include "worker/model/transformer.h"
#include "worker/plan/arena.h"
#include "worker/plan/memory_plan.h"

namespace zt {
namespace {

using testing::BindJob;
using testing::Bound;
using testing::FillTokens;
using testing::TinyLoraJob;
using zerotrain::ModelConfig;

// Base weights from the seeded init, A from PEFT's init, and B random (a zero B would leave
// A's gradient zero and the adapters invisible in the forward).
void InitWithLiveAdapters(Transformer& m, uint64_t seed) {
  m.InitializeWeights(seed);
  m.InitializeLora(seed + 1);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal(0.0f, 0.3f);
  for (size_t u = 0; u < m.layout().units.size(); ++u) {
    for (const LoraSite& s : m.layout().units[u].lora) {
      float* b = m.unit_lora()[u].data<float>() + s.b.offset;
      for (int64_t i = 0; i < s.b.numel; ++i) b[i] = normal(rng);
    }
  }
}

class TransformerLoraTest : public ::testing::TestWithParam<ModelConfig::Family> {};

TEST_P(TransformerLoraTest, PlanHasNoBaseGradientsOrOptimizerState) {
  const MemoryPlan plan = PlanMemory(TinyLoraJob(GetParam()));
  int adapters = 0;
  for (const BufferSpec& b : plan.buffers) {
    if (b.category == MemoryCategory::kGradients || b.category == MemoryCategory::kOptimizerState) {
      EXPECT_TRUE(b.name.find(".lora") != std::string::npos) << b.name;
    }
    adapters += b.name.ends_with(".lora");
  }
  EXPECT_EQ(adapters, 2);  // one adapter buffer per block
}

TEST_P(TransformerLoraTest, FreshAdaptersFollowPeftsInit) {
  Bound b = BindJob(TinyLoraJob(GetParam()));
  b.model->InitializeLora(5);
  for (size_t u = 0; u < b.model->layout().units.size(); ++u) {
    for (const LoraSite& s : b.model->layout().units[u].lora) {
      const float* a = b.model->unit_lora()[u].data<float>() + s.a.offset;
      const float* bm = b.model->unit_lora()[u].data<float>() + s.b.offset;
      const double bound = 1.0 / std::sqrt(static_cast<double>(s.in));
      double max_abs = 0;
      for (int64_t i = 0; i < s.a.numel; ++i) max_abs = std::max(max_abs, std::abs(double{a[i]}));
      EXPECT_LE(max_abs, bound) << s.hf_path;
      // 32+ uniform draws: the largest lies above half the bound unless the scale is wrong.
      EXPECT_GT(max_abs, 0.5 * bound) << s.hf_path;
      for (int64_t i = 0; i < s.b.numel; ++i) ASSERT_EQ(bm[i], 0.0f) << s.hf_path;
    }
  }
}

void CheckAdapterGradients(const zerotrain::JobSpec& job) {
  Bound b = BindJob(job);
  Transformer& m = *b.model;
  InitWithLiveAdapters(m, 11);
  // A quantized base's weights from the same seeded init (nothing for an unquantized one).
  ASSERT_TRUE(m.InitializeQuantizedBase(b.ctx, 11).ok());
  m.SetLoraDropoutSeed(99);
  FillTokens(m, 5);
  const float scale = 1.0f / static_cast<float>(m.batch() * m.seq_len());
  for (const Tensor& g : m.unit_lora_grads()) {
    if (!g.empty()) ASSERT_TRUE(Zero(b.ctx, g).ok());
  }
  ASSERT_TRUE(m.ForwardLoss(b.ctx, {.write_grad = true, .grad_scale = scale}).ok());
  ASSERT_TRUE(m.Backward(b.ctx).ok());
  // Block 0's adapters are reached only through block 1's input gradient (base and adapters),
  // so checking them checks the adapters' input gradient too.
  const double h = 1e-2;
  int checked = 0;
  for (size_t u = 0; u < m.layout().units.size(); ++u) {
    for (const LoraSite& s : m.layout().units[u].lora) {
      for (const ParamSpec* p : {&s.a, &s.b}) {
        float* w = m.unit_lora()[u].data<float>() + p->offset;
        const float* g = m.unit_lora_grads()[u].data<float>() + p->offset;
        std::vector<int64_t> idx(p->numel);
        for (int64_t i = 0; i < p->numel; ++i) idx[i] = i;
        const int64_t n = std::min<int64_t>(3, p->numel);
        std::partial_sort(idx.begin(), idx.begin() + n, idx.end(),
                          [&](int64_t x, int64_t y) { return std::abs(g[x]) > std::abs(g[y]); });
        for (int k = 0; k < n; ++k) {
          const int64_t i = idx[k];
          const float saved = w[i];
          w[i] = saved + static_cast<float>(h);
          const double lp = m.ForwardLoss(b.ctx, {}).value();
          w[i] = saved - static_cast<float>(h);
          const double lm = m.ForwardLoss(b.ctx, {}).value();
          w[i] = saved;
          const double fd = (lp - lm) / (2 * h);
          // 2% + 2e-4, as the model's own gradient test: O(h²) truncation of the central
          // difference plus the fp32 loss's ~1e-6 noise divided by 2h.
          EXPECT_NEAR(g[i], fd, 0.02 * std::abs(fd) + 2e-4)
              << m.layout().units[u].name << "." << p->name << "[" << i << "]";
          checked += std::abs(fd) > 1e-3;
        }
      }
    }
  }
  EXPECT_GT(checked, 20);  // most coordinates carry gradient: a zero gradient fails here
}

TEST_P(TransformerLoraTest, AdapterGradientsMatchFiniteDifferences) {
  CheckAdapterGradients(TinyLoraJob(GetParam()));
}

TEST_P(TransformerLoraTest, AdapterGradientsMatchFiniteDifferencesWithDropout) {
  // The mask is a function of the seed: the perturbed forwards drop the same elements.
  CheckAdapterGradients(TinyLoraJob(GetParam(), 0.3f));
}

// W' = W + scale·B·A (MergeLoraAdapters, float64), in the fused rows of a model without LoRA.
TEST_P(TransformerLoraTest, MergedWeightsGiveTheAdapterPathsForward) {
  const zerotrain::JobSpec job = TinyLoraJob(GetParam());
  Bound lora = BindJob(job);
  InitWithLiveAdapters(*lora.model, 21);
  FillTokens(*lora.model, 8);
  const double with_adapters = lora.model->ForwardLoss(lora.ctx, {}).value();

  zerotrain::JobSpec plain_job = job;
  plain_job.mutable_model()->clear_lora();
  plain_job.mutable_model()->clear_base_dtype();
  Bound plain = BindJob(plain_job);
  const ModelLayout& layout = lora.model->layout();
  for (size_t u = 0; u < layout.units.size(); ++u) {
    std::memcpy(plain.model->unit_params()[u].raw(), lora.model->unit_params()[u].raw(),
                layout.units[u].numel * sizeof(float));
  }
  ASSERT_TRUE(MergeLoraAdapters(layout, lora.model->unit_lora(), plain.model->unit_params()).ok());
  FillTokens(*plain.model, 8);
  const double merged = plain.model->ForwardLoss(plain.ctx, {}).value();
  // fp32 noise of two different summation orders over a 2-layer model: ~1e-6 relative.
  EXPECT_NEAR(merged, with_adapters, 1e-5 * std::abs(with_adapters));

  // The adapters matter: the base alone is far from both, so the comparison can fail.
  std::memcpy(plain.model->unit_params()[1].raw(), lora.model->unit_params()[1].raw(),
              layout.units[1].numel * sizeof(float));
  std::memcpy(plain.model->unit_params()[2].raw(), lora.model->unit_params()[2].raw(),
              layout.units[2].numel * sizeof(float));
  const double base_only = plain.model->ForwardLoss(plain.ctx, {}).value();
  EXPECT_GT(std::abs(base_only - with_adapters), 1e-3);
}

TEST_P(TransformerLoraTest, TrainingChangesOnlyTheAdapters) {
  const zerotrain::JobSpec job = TinyLoraJob(GetParam(), 0.1f);
  Bound b = BindJob(job);
  Transformer& m = *b.model;
  m.InitializeWeights(3);
  m.InitializeLora(4);
  FillTokens(m, 6);
  std::vector<std::vector<char>> base_before;
  for (const Tensor& p : m.unit_params()) {
    base_before.emplace_back(static_cast<char*>(p.raw()),
                             static_cast<char*>(p.raw()) + p.size_bytes());
  }
  const std::vector<char> lora_before(
      static_cast<char*>(m.unit_lora()[1].raw()),
      static_cast<char*>(m.unit_lora()[1].raw()) + m.unit_lora()[1].size_bytes());
  const float grad_scale = 1.0f / static_cast<float>(m.batch() * m.seq_len());
  double first = 0, last = 0;
  for (int step = 1; step <= 30; ++step) {
    m.SetLoraDropoutSeed(static_cast<uint64_t>(step));
    for (const Tensor& g : m.unit_lora_grads()) {
      if (!g.empty()) ASSERT_TRUE(Zero(b.ctx, g).ok());
    }
    const double loss =
        m.ForwardLoss(b.ctx, {.write_grad = true, .grad_scale = grad_scale}).value();
    ASSERT_TRUE(m.Backward(b.ctx).ok());
    if (step == 1) first = loss;
    last = loss;
    for (size_t u = 0; u < m.unit_lora().size(); ++u) {
      if (m.unit_lora()[u].empty()) continue;
      const std::string unit = m.layout().units[u].name;
      ASSERT_TRUE(AdamWUpdate(b.ctx, {.param = m.unit_lora()[u],
                                      .grad = m.unit_lora_grads()[u],
                                      .m = b.arenas->Get(unit + ".lora.adam_m").value(),
                                      .v = b.arenas->Get(unit + ".lora.adam_v").value(),
                                      .lr = 1e-2f,
                                      .step = step})
                      .ok());
    }
  }
  // One fixed batch: 30 Adam steps on the adapters alone fit it measurably.
  EXPECT_LT(last, first - 0.05) << first << " -> " << last;
  for (size_t u = 0; u < m.unit_params().size(); ++u) {
    const Tensor& p = m.unit_params()[u];
    EXPECT_EQ(std::memcmp(p.raw(), base_before[u].data(), p.size_bytes()), 0)
        << m.layout().units[u].name << ": the frozen base changed";
  }
  EXPECT_NE(std::memcmp(m.unit_lora()[1].raw(), lora_before.data(), lora_before.size()), 0);
}

zerotrain::JobSpec Nf4Job(ModelConfig::Family family) {
  zerotrain::JobSpec job = TinyLoraJob(family);
  job.mutable_model()->set_base_dtype(ModelConfig::NF4);
  return job;
}

// A frozen NF4 base computes what f32 weights equal to its dequantized values compute: the
// tiled dequantization inside the linear layers changes nothing but the GEMM's summation order.
TEST_P(TransformerLoraTest, Nf4ForwardEqualsTheDequantizedFp32Forward) {
  Bound q = BindJob(Nf4Job(GetParam()));
  InitWithLiveAdapters(*q.model, 31);
  ASSERT_TRUE(q.model->InitializeQuantizedBase(q.ctx, 31).ok());
  FillTokens(*q.model, 9);
  const double nf4_loss = q.model->ForwardLoss(q.ctx, {}).value();

  Bound f = BindJob(TinyLoraJob(GetParam()));
  const ModelLayout& ql = q.model->layout();
  const ModelLayout& fl = f.model->layout();
  int dequantized = 0;
  for (size_t u = 0; u < ql.units.size(); ++u) {
    for (size_t k = 0; k < ql.units[u].params.size(); ++k) {
      const ParamSpec& qp = ql.units[u].params[k];
      const ParamSpec& fp = fl.units[u].params[k];
      float* dst = f.model->unit_params()[u].data<float>() + fp.offset;
      if (qp.quantized) {
        const Nf4Tensor* w = q.model->QuantizedWeight(static_cast<int>(u), qp.name);
        ASSERT_NE(w, nullptr);
        ASSERT_TRUE(
            Nf4Dequantize(q.ctx, {.src = *w, .dst = Tensor(dst, DType::kF32, {qp.numel})}).ok());
        ++dequantized;
      } else {
        std::memcpy(dst, q.model->unit_params()[u].data<float>() + qp.offset,
                    qp.numel * sizeof(float));
      }
    }
    if (!q.model->unit_lora()[u].empty()) {
      std::memcpy(f.model->unit_lora()[u].raw(), q.model->unit_lora()[u].raw(),
                  q.model->unit_lora()[u].size_bytes());
    }
  }
  EXPECT_EQ(dequantized, 8);  // four linear weights in each of the two blocks
  FillTokens(*f.model, 9);
  const double f32_loss = f.model->ForwardLoss(f.ctx, {}).value();
  // fp32 noise of two summation orders (tiles of 512 rows vs one GEMM) over two layers.
  EXPECT_NEAR(nf4_loss, f32_loss, 1e-5 * std::abs(f32_loss));
}

TEST_P(TransformerLoraTest, QloraTrainingReducesTheLossAndLeavesTheNf4BaseAlone) {
  Bound b = BindJob(Nf4Job(GetParam()));
  Transformer& m = *b.model;
  m.InitializeWeights(3);
  ASSERT_TRUE(m.InitializeQuantizedBase(b.ctx, 3).ok());
  m.InitializeLora(4);
  FillTokens(m, 6);
  const Nf4Tensor* qkv = m.QuantizedWeight(1, "attn.qkv.weight");
  ASSERT_NE(qkv, nullptr);
  const std::vector<char> codes_before(
      static_cast<char*>(qkv->codes.raw()),
      static_cast<char*>(qkv->codes.raw()) + qkv->codes.size_bytes());
  const float grad_scale = 1.0f / static_cast<float>(m.batch() * m.seq_len());
  double first = 0, last = 0;
  for (int step = 1; step <= 30; ++step) {
    for (const Tensor& g : m.unit_lora_grads()) {
      if (!g.empty()) ASSERT_TRUE(Zero(b.ctx, g).ok());
    }
    const double loss =
        m.ForwardLoss(b.ctx, {.write_grad = true, .grad_scale = grad_scale}).value();
    ASSERT_TRUE(m.Backward(b.ctx).ok());
    if (step == 1) first = loss;
    last = loss;
    for (size_t u = 0; u < m.unit_lora().size(); ++u) {
      if (m.unit_lora()[u].empty()) continue;
      const std::string unit = m.layout().units[u].name;
      ASSERT_TRUE(AdamWUpdate(b.ctx, {.param = m.unit_lora()[u],
                                      .grad = m.unit_lora_grads()[u],
                                      .m = b.arenas->Get(unit + ".lora.adam_m").value(),
                                      .v = b.arenas->Get(unit + ".lora.adam_v").value(),
                                      .lr = 1e-2f,
                                      .step = step})
                      .ok());
    }
  }
  EXPECT_LT(last, first - 0.05) << first << " -> " << last;
  EXPECT_EQ(std::memcmp(qkv->codes.raw(), codes_before.data(), codes_before.size()), 0);
}

zerotrain::JobSpec Int8Job(ModelConfig::Family family, float threshold) {
  zerotrain::JobSpec job = TinyLoraJob(family);
  job.mutable_model()->set_base_dtype(ModelConfig::INT8);
  job.mutable_model()->set_int8_threshold(threshold);
  return job;
}

// The loss of an INT8-base model, and of an FP32-base model whose linear weights are the INT8
// weights read back (Int8DequantizeWeight) and whose other buffers and adapters are the INT8
// model's.
struct Int8AndDequantizedLosses {
  double int8 = 0;
  double dequantized = 0;
};

Int8AndDequantizedLosses Int8AndDequantizedForward(ModelConfig::Family family, float threshold) {
  Bound q = BindJob(Int8Job(family, threshold));
  InitWithLiveAdapters(*q.model, 41);
  EXPECT_TRUE(q.model->InitializeQuantizedBase(q.ctx, 41).ok());
  FillTokens(*q.model, 12);
  Int8AndDequantizedLosses out;
  out.int8 = q.model->ForwardLoss(q.ctx, {}).value();

  Bound f = BindJob(TinyLoraJob(family));
  const ModelLayout& ql = q.model->layout();
  const ModelLayout& fl = f.model->layout();
  int dequantized = 0;
  for (size_t u = 0; u < ql.units.size(); ++u) {
    for (size_t k = 0; k < ql.units[u].params.size(); ++k) {
      const ParamSpec& qp = ql.units[u].params[k];
      const ParamSpec& fp = fl.units[u].params[k];
      float* dst = f.model->unit_params()[u].data<float>() + fp.offset;
      if (qp.quantized) {
        EXPECT_EQ(q.model->QuantizedWeight(static_cast<int>(u), qp.name), nullptr);
        const Int8Weight* w = q.model->Int8QuantizedWeight(static_cast<int>(u), qp.name);
        EXPECT_NE(w, nullptr);
        if (w == nullptr) return out;
        EXPECT_TRUE(
            Int8DequantizeWeight(
                q.ctx, {.src = *w, .dst = Tensor(dst, DType::kF32, {qp.shape[0], qp.shape[1]})})
                .ok());
        ++dequantized;
      } else {
        std::memcpy(dst, q.model->unit_params()[u].data<float>() + qp.offset,
                    qp.numel * sizeof(float));
      }
    }
    if (!q.model->unit_lora()[u].empty()) {
      std::memcpy(f.model->unit_lora()[u].raw(), q.model->unit_lora()[u].raw(),
                  q.model->unit_lora()[u].size_bytes());
    }
  }
  EXPECT_EQ(dequantized, 8);  // four linear weights in each of the two blocks
  FillTokens(*f.model, 12);
  out.dequantized = f.model->ForwardLoss(f.ctx, {}).value();
  return out;
}

// A frozen INT8 base against f32 weights equal to its read-back values. With a threshold below
// every activation each input column is an outlier, computed in f32 against the read-back
// weight: the forward is then the f32 forward up to summation order. At the paper's 6.0 the
// activations (|x| of a few units) are quantized to int8 per token: each input is off by up
// to half a step, x_m/254 (0.4% of the row's largest), which over two blocks moves the loss by
// well under 2% but visibly.
TEST_P(TransformerLoraTest, Int8ForwardEqualsTheDequantizedFp32Forward) {
  const Int8AndDequantizedLosses exact = Int8AndDequantizedForward(GetParam(), 1e-30f);
  // fp32 noise of two summation orders over two layers.
  EXPECT_NEAR(exact.int8, exact.dequantized, 1e-5 * std::abs(exact.dequantized));

  const Int8AndDequantizedLosses rounded = Int8AndDequantizedForward(GetParam(), 6.0f);
  EXPECT_EQ(rounded.dequantized, exact.dequantized);  // the same weights: the same f32 model
  EXPECT_NEAR(rounded.int8, rounded.dequantized, 0.02 * std::abs(rounded.dequantized));
  // ... and the int8 activations are really in use: the loss moved beyond fp32 noise.
  EXPECT_GT(std::abs(rounded.int8 - rounded.dequantized), 1e-5 * std::abs(rounded.dequantized));
}

// The INT8 base's input gradient inside the model: block 0's adapters are reached only through
// block 1's frozen INT8 linears' dinp (Int8LinearBackward). With every column an outlier the
// forward is smooth (f32 against the read-back weight), so central differences of the loss
// check that backward exactly as for an f32 base.
TEST_P(TransformerLoraTest, AdapterGradientsThroughAnInt8BaseMatchFiniteDifferences) {
  CheckAdapterGradients(Int8Job(GetParam(), 1e-30f));
}

TEST_P(TransformerLoraTest, TrainingOverAnInt8BaseReducesTheLossAndLeavesTheBaseAlone) {
  Bound b = BindJob(Int8Job(GetParam(), 6.0f));
  Transformer& m = *b.model;
  m.InitializeWeights(3);
  ASSERT_TRUE(m.InitializeQuantizedBase(b.ctx, 3).ok());
  m.InitializeLora(4);
  FillTokens(m, 6);
  const Int8Weight* qkv = m.Int8QuantizedWeight(1, "attn.qkv.weight");
  ASSERT_NE(qkv, nullptr);
  auto bytes = [](const Tensor& t) {
    return std::vector<char>(static_cast<char*>(t.raw()),
                             static_cast<char*>(t.raw()) + t.size_bytes());
  };
  const std::vector<char> codes_before = bytes(qkv->codes), scales_before = bytes(qkv->scales);
  const float grad_scale = 1.0f / static_cast<float>(m.batch() * m.seq_len());
  double first = 0, last = 0;
  for (int step = 1; step <= 30; ++step) {
    for (const Tensor& g : m.unit_lora_grads()) {
      if (!g.empty()) ASSERT_TRUE(Zero(b.ctx, g).ok());
    }
    const double loss =
        m.ForwardLoss(b.ctx, {.write_grad = true, .grad_scale = grad_scale}).value();
    ASSERT_TRUE(m.Backward(b.ctx).ok());
    if (step == 1) first = loss;
    last = loss;
    for (size_t u = 0; u < m.unit_lora().size(); ++u) {
      if (m.unit_lora()[u].empty()) continue;
      const std::string unit = m.layout().units[u].name;
      ASSERT_TRUE(AdamWUpdate(b.ctx, {.param = m.unit_lora()[u],
                                      .grad = m.unit_lora_grads()[u],
                                      .m = b.arenas->Get(unit + ".lora.adam_m").value(),
                                      .v = b.arenas->Get(unit + ".lora.adam_v").value(),
                                      .lr = 1e-2f,
                                      .step = step})
                      .ok());
    }
  }
  // One fixed batch: 30 Adam steps on the adapters alone fit it measurably.
  EXPECT_LT(last, first - 0.05) << first << " -> " << last;
  EXPECT_EQ(bytes(qkv->codes), codes_before);
  EXPECT_EQ(bytes(qkv->scales), scales_before);
}

INSTANTIATE_TEST_SUITE_P(Families, TransformerLoraTest,
                         ::testing::Values(ModelConfig::GPT2, ModelConfig::LLAMA),
                         [](const auto& info) {
                           return info.param == ModelConfig::GPT2 ? "Gpt2" : "Llama";
                         });

}  // namespace
}  // namespace zt
