// Packed sequences through the whole model (data.packing): each document of a packed row gets
// the loss and the gradients it gets alone, for GPT-2 (learned positions) and Llama (RoPE),
// and a poisoned document stays out of its neighbours' losses.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/packing.h"
#include "tests/unit/worker/model/lora_test_model.h"

namespace zt {
namespace {

using testing::BindJob;
using testing::Bound;
using zerotrain::ModelConfig;

constexpr uint64_t kSeed = 7;

zerotrain::JobSpec Job(ModelConfig::Family family, int seq) {
  zerotrain::JobSpec job = testing::TinyLoraJob(family);
  job.mutable_model()->clear_lora();
  job.mutable_train()->set_micro_batch_size(1);
  job.mutable_data()->set_seq_len(seq);
  return job;
}

struct Doc {
  std::vector<int32_t> tokens;
  std::vector<int32_t> targets;  // -1: ignored
};

Doc MakeDoc(int length, uint32_t seed, int32_t lo, int32_t hi) {
  std::mt19937 rng(seed);
  Doc d;
  for (int i = 0; i < length; ++i) {
    d.tokens.push_back(lo + static_cast<int32_t>(rng() % (hi - lo)));
    d.targets.push_back(static_cast<int32_t>(rng() % 11));
  }
  d.targets.back() = -1;  // a document's last token predicts nothing
  return d;
}

struct Result {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // per unit
};

// One forward + backward of `model` on its current tokens/targets with grad_scale 1, from
// zeroed gradients.
Result ForwardBackward(Bound& b) {
  Transformer& m = *b.model;
  for (const Tensor& g : m.unit_grads()) std::memset(g.raw(), 0, g.size_bytes());
  auto loss = m.ForwardLoss(b.ctx, {.write_grad = true, .grad_scale = 1.0f});
  EXPECT_TRUE(loss.ok()) << loss.status();
  EXPECT_TRUE(m.Backward(b.ctx).ok());
  Result r{.loss = loss.ok() ? *loss : 0.0};
  for (const Tensor& g : m.unit_grads()) {
    r.grads.emplace_back(g.data<float>(), g.data<float>() + g.numel());
  }
  return r;
}

Result Alone(ModelConfig::Family family, const Doc& d) {
  Bound b = BindJob(Job(family, static_cast<int>(d.tokens.size())));
  b.model->InitializeWeights(kSeed);
  std::copy(d.tokens.begin(), d.tokens.end(), b.model->tokens().data<int32_t>());
  std::copy(d.targets.begin(), d.targets.end(), b.model->targets().data<int32_t>());
  return ForwardBackward(b);
}

// The documents laid end to end in one row of T tokens with their starts and positions;
// `counted[i]` false masks document i's targets.
struct Packed {
  Bound b;
  std::vector<int32_t> doc_starts, positions;
};
Packed Pack(ModelConfig::Family family, const std::vector<Doc>& docs,
            const std::vector<bool>& counted) {
  int T = 0;
  for (const Doc& d : docs) T += static_cast<int>(d.tokens.size());
  Packed p{.b = BindJob(Job(family, T))};
  p.b.model->InitializeWeights(kSeed);
  int32_t* tokens = p.b.model->tokens().data<int32_t>();
  int32_t* targets = p.b.model->targets().data<int32_t>();
  int pos = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    p.doc_starts.push_back(pos);
    for (size_t j = 0; j < docs[i].tokens.size(); ++j, ++pos) {
      tokens[pos] = docs[i].tokens[j];
      targets[pos] = counted[i] ? docs[i].targets[j] : -1;
    }
  }
  p.positions.resize(T);
  const Tensor starts(p.doc_starts.data(), DType::kI32, {1, static_cast<int64_t>(docs.size())});
  const Tensor positions(p.positions.data(), DType::kI32, {1, T});
  EXPECT_TRUE(DocumentPositions(p.b.ctx, {.doc_starts = starts, .positions = positions}).ok());
  p.b.model->SetDocuments(starts, positions);
  return p;
}

double MaxAbsDiff(const Result& a, const Result& b) {
  double worst = 0;
  for (size_t u = 0; u < a.grads.size(); ++u) {
    for (size_t i = 0; i < a.grads[u].size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(a.grads[u][i]) - b.grads[u][i]));
    }
  }
  return worst;
}

double MaxAbs(const Result& a) {
  double worst = 0;
  for (const auto& g : a.grads) {
    for (float x : g) worst = std::max(worst, std::abs(static_cast<double>(x)));
  }
  return worst;
}

class TransformerPackingTest : public ::testing::TestWithParam<ModelConfig::Family> {};

// The tolerance: the packed run sums the same products in another blocking (attention tiles,
// GEMM rows of another M), so fp32 reordering noise of a few ulps of the largest gradient
// element, relative 1e-5 with margin; a document that read its neighbour would be off by
// O(1) relative.
TEST_P(TransformerPackingTest, EachDocumentGetsTheLossAndGradientsItGetsAlone) {
  const std::vector<Doc> docs = {MakeDoc(3, 1, 0, 11), MakeDoc(4, 2, 0, 11), MakeDoc(1, 3, 0, 11)};
  std::vector<Result> alone;
  for (const Doc& d : docs) alone.push_back(Alone(GetParam(), d));
  for (size_t i = 0; i + 1 < docs.size(); ++i) {  // the 1-token document has no target
    std::vector<bool> counted(docs.size(), false);
    counted[i] = true;
    Packed p = Pack(GetParam(), docs, counted);
    const Result packed = ForwardBackward(p.b);
    EXPECT_NEAR(packed.loss, alone[i].loss, 1e-5 * std::abs(alone[i].loss)) << "document " << i;
    EXPECT_LE(MaxAbsDiff(packed, alone[i]), 1e-5 * MaxAbs(alone[i])) << "document " << i;
  }
  // All counted: the gradient (grad_scale 1 sums over targets) is the documents' sum.
  Packed all = Pack(GetParam(), docs, {true, true, true});
  const Result packed = ForwardBackward(all.b);
  Result sum = alone[0];
  for (size_t u = 0; u < sum.grads.size(); ++u) {
    for (size_t k = 0; k < sum.grads[u].size(); ++k) {
      sum.grads[u][k] += alone[1].grads[u][k] + alone[2].grads[u][k];
    }
  }
  EXPECT_LE(MaxAbsDiff(packed, sum), 1e-5 * MaxAbs(sum));
  // The mean loss over the 2 + 3 counted targets.
  EXPECT_NEAR(packed.loss, (alone[0].loss * 2 + alone[1].loss * 3) / 5, 1e-5 * packed.loss);
}

TEST_P(TransformerPackingTest, WithoutDocumentStartsTheSecondDocumentReadsTheFirst) {
  // The control that shows the test above can fail: the same row as one plain sequence.
  const std::vector<Doc> docs = {MakeDoc(3, 1, 0, 11), MakeDoc(4, 2, 0, 11)};
  const Result alone = Alone(GetParam(), docs[1]);
  Packed p = Pack(GetParam(), docs, {false, true});
  p.b.model->SetDocuments(Tensor(), Tensor());
  const Result plain = ForwardBackward(p.b);
  EXPECT_GT(std::abs(plain.loss - alone.loss), 1e-3 * std::abs(alone.loss));
}

// Llama's head is untied, so a poisoned embedding row reaches only the positions that hold its
// token: the other document's, which attention must never read.
TEST(TransformerPackingNanTest, APoisonedDocumentStaysOutOfItsNeighboursLoss) {
  const Doc a = MakeDoc(4, 1, 0, 6), b = MakeDoc(3, 2, 6, 11);  // disjoint token ids
  const Result alone = Alone(ModelConfig::LLAMA, a);
  Packed p = Pack(ModelConfig::LLAMA, {b, a}, {false, true});
  Transformer& m = *p.b.model;
  const Tensor& embedding = m.unit_params().front();  // wte (V, C) first
  const int64_t C = 16;
  float* wte = embedding.data<float>();
  for (int32_t tok = 6; tok < 11; ++tok) {
    std::fill(wte + tok * C, wte + (tok + 1) * C, std::numeric_limits<float>::quiet_NaN());
  }
  auto loss = m.ForwardLoss(p.b.ctx, {});
  ASSERT_TRUE(loss.ok()) << loss.status();
  ASSERT_TRUE(std::isfinite(*loss));
  EXPECT_NEAR(*loss, alone.loss, 1e-5 * std::abs(alone.loss));
  // Without the document starts the poison reaches document a.
  m.SetDocuments(Tensor(), Tensor());
  auto leaked = m.ForwardLoss(p.b.ctx, {});
  ASSERT_TRUE(leaked.ok());
  EXPECT_TRUE(std::isnan(*leaked));
}

INSTANTIATE_TEST_SUITE_P(Families, TransformerPackingTest,
                         ::testing::Values(ModelConfig::GPT2, ModelConfig::LLAMA),
                         [](const auto& info) {
                           return info.param == ModelConfig::GPT2 ? "Gpt2" : "Llama";
                         });

}  // namespace
}  // namespace zt
