// The tensor-parallel model against the plan and the one-rank model: the shares SliceOf
// describes have the plan's shapes (TensorParallelModelLayout), a bound tensor-parallel
// model's layout is the plan's RankModelLayout, each rank initialises exactly its slice of
// the one-rank model's initial weights, and the gradient-norm ranges count every element of
// the model once over the group.
#include "worker/model/tensor_parallel_slice.h"

#include <vector>

#include "gtest/gtest.h"
#include "worker/model/transformer.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/arena.h"
#include "worker/plan/memory_plan.h"
#include "worker/plan/parallel_plan.h"

namespace zt {
namespace {

// GPT-2 tied; Llama untied with 2 KV heads (split at t = 2, replicated at t = 4) and a
// vocabulary that does not divide by 4 (the last rank's shard ends in padding).
zerotrain::JobSpec Job(zerotrain::ModelConfig::Family family, int tp) {
  zerotrain::JobSpec job;
  auto* m = job.mutable_model();
  const bool gpt2 = family == zerotrain::ModelConfig::GPT2;
  m->set_family(family);
  m->set_n_layer(2);
  m->set_n_head(4);
  m->set_n_kv_head(gpt2 ? 4 : 2);
  m->set_d_model(16);
  m->set_d_ff(gpt2 ? 64 : 24);
  m->set_vocab_size(gpt2 ? 32 : 34);
  m->set_max_seq_len(8);
  m->set_tie_embeddings(gpt2);
  m->set_norm_eps(1e-5f);
  m->set_rope_theta(10000.0f);
  m->set_init_std(0.02f);
  job.mutable_data()->set_seq_len(8);
  job.mutable_train()->set_micro_batch_size(2);
  job.mutable_train()->set_grad_accum_steps(1);
  job.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAMW);
  job.mutable_parallel()->set_world_size(tp);
  job.mutable_parallel()->set_tensor_parallel(tp);
  return job;
}

struct Case {
  zerotrain::ModelConfig::Family family;
  int tp;
};
const Case kCases[] = {{zerotrain::ModelConfig::GPT2, 2},
                       {zerotrain::ModelConfig::GPT2, 4},
                       {zerotrain::ModelConfig::LLAMA, 2},
                       {zerotrain::ModelConfig::LLAMA, 4}};

TEST(TensorParallelSliceTest, SlicesHaveThePlansShapes) {
  for (const Case& c : kCases) {
    const zerotrain::JobSpec job = Job(c.family, c.tp);
    const ModelLayout whole = BuildModelLayout(job.model());
    const ModelLayout local = TensorParallelModelLayout(job.model(), c.tp);
    for (int r = 0; r < c.tp; ++r) {
      for (size_t u = 0; u < whole.units.size(); ++u) {
        for (const ParamSpec& p : local.units[u].params) {
          const ParamSpec& w = *whole.units[u].Find(p.name);
          const TensorParallelSlice s = SliceOf(job.model(), p.name, w.shape, c.tp, r);
          EXPECT_EQ(s.local_rows * s.local_cols, p.numel) << p.name << " tp " << c.tp;
          EXPECT_EQ(s.local_rows, p.shape[0]) << p.name;
          int64_t covered = 0;
          for (const auto& run : s.rows) {
            EXPECT_LE(run.local_begin + run.count, s.local_rows) << p.name;
            EXPECT_LE(run.global_begin + run.count, s.global_rows) << p.name;
            covered += run.count;
          }
          EXPECT_LE(covered, s.local_rows) << p.name;
        }
      }
    }
  }
}

// A model bound to rank r's plan: its layout is the plan's, and its initial weights are the
// one-rank model's, sliced.
TEST(TensorParallelSliceTest, BoundModelHasThePlansLayoutAndTheOneRankInitialWeights) {
  for (const Case& c : kCases) {
    const zerotrain::JobSpec job = Job(c.family, c.tp);
    zerotrain::JobSpec one = job;
    one.mutable_parallel()->set_world_size(1);
    one.mutable_parallel()->set_tensor_parallel(1);
    auto one_arenas = Arenas::Create(PlanMemory(one)).value();
    Transformer reference = Transformer::Bind(one.model(), *one_arenas, *one_arenas, 2, 8).value();
    reference.InitializeWeights(5);
    for (int r = 0; r < c.tp; ++r) {
      const ParallelLayout layout = ParallelLayout::ForJob(job, r);
      auto arenas = Arenas::Create(PlanMemory(job, layout)).value();
      TensorParallelGroup tp{.size = c.tp, .rank = r};
      // Binding and initialising call no collective.
      tp.all_reduce = tp.kv_all_reduce = [](const Tensor&, const std::string&) {
        return absl::InternalError("unexpected collective");
      };
      tp.all_gather = [](const Tensor&, const Tensor&, const std::string&) {
        return absl::InternalError("unexpected collective");
      };
      absl::StatusOr<Transformer> model =
          Transformer::Bind(job.model(), *arenas, *arenas, 2, 8, tp);
      ASSERT_TRUE(model.ok()) << model.status();
      const ModelLayout planned = RankModelLayout(job, layout);
      ASSERT_EQ(model->layout().units.size(), planned.units.size());
      for (size_t u = 0; u < planned.units.size(); ++u) {
        const UnitLayout &got = model->layout().units[u], &want = planned.units[u];
        EXPECT_EQ(got.numel, want.numel) << got.name;
        ASSERT_EQ(got.params.size(), want.params.size());
        for (size_t k = 0; k < want.params.size(); ++k) {
          EXPECT_EQ(got.params[k].name, want.params[k].name);
          EXPECT_EQ(got.params[k].shape, want.params[k].shape) << want.params[k].name;
          EXPECT_EQ(got.params[k].offset, want.params[k].offset) << want.params[k].name;
        }
      }
      model->InitializeWeights(5);
      for (size_t u = 0; u < planned.units.size(); ++u) {
        const UnitLayout& unit = model->layout().units[u];
        const float* local = model->unit_params()[u].data<float>();
        const float* whole = reference.unit_params()[u].data<float>();
        for (const ParamSpec& p : unit.params) {
          const ParamSpec& w = *reference.layout().units[u].Find(p.name);
          std::vector<float> want(p.numel);
          ExtractSlice(SliceOf(job.model(), p.name, w.shape, c.tp, r), whole + w.offset,
                       want.data());
          const std::vector<float> got(local + p.offset, local + p.offset + p.numel);
          EXPECT_EQ(got, want) << unit.name << "." << p.name << " rank " << r << " of " << c.tp;
        }
      }
    }
  }
}

TEST(TensorParallelSliceTest, NormRangesCountEveryElementOnce) {
  for (const Case& c : kCases) {
    const zerotrain::JobSpec job = Job(c.family, c.tp);
    const ModelLayout whole = BuildModelLayout(job.model());
    const ModelLayout local = TensorParallelModelLayout(job.model(), c.tp);
    for (size_t u = 0; u < whole.units.size(); ++u) {
      std::vector<int> counted(whole.units[u].numel, 0);
      int64_t padding_counted = 0;
      for (int r = 0; r < c.tp; ++r) {
        const UnitLayout& lu = local.units[u];
        std::vector<bool> in_range(lu.numel, false);
        for (const auto& [b, e] : NormCountedRanges(job.model(), lu, c.tp, r)) {
          for (int64_t i = b; i < e; ++i) in_range[i] = true;
        }
        for (const ParamSpec& p : lu.params) {
          const ParamSpec& w = *whole.units[u].Find(p.name);
          const TensorParallelSlice s = SliceOf(job.model(), p.name, w.shape, c.tp, r);
          std::vector<bool> real(p.numel, false);
          for (const auto& run : s.rows) {
            for (int64_t i = 0; i < run.count; ++i) {
              for (int64_t col = 0; col < s.local_cols; ++col) {
                const int64_t l = (run.local_begin + i) * s.local_cols + col;
                real[l] = true;
                const int64_t g = (run.global_begin + i) * s.global_cols + s.col_begin + col;
                if (in_range[p.offset + l]) ++counted[w.offset + g];
              }
            }
          }
          for (int64_t l = 0; l < p.numel; ++l)
            padding_counted += !real[l] && in_range[p.offset + l];
        }
      }
      for (int64_t g = 0; g < whole.units[u].numel; ++g) {
        ASSERT_EQ(counted[g], 1) << whole.units[u].name << " element " << g << " tp " << c.tp;
      }
      // Padding rows (zero) may be counted: they add nothing to the norm.
      (void)padding_counted;
    }
  }
}

TEST(TensorParallelSliceTest, ReplicatedKvRangesOnlyWhenKvHeadsAreFewerThanRanks) {
  const zerotrain::JobSpec two = Job(zerotrain::ModelConfig::LLAMA, 2);
  const zerotrain::JobSpec four = Job(zerotrain::ModelConfig::LLAMA, 4);
  EXPECT_TRUE(
      ReplicatedKvRanges(two.model(), TensorParallelModelLayout(two.model(), 2).block(0), 2, 1)
          .empty());
  const UnitLayout block = TensorParallelModelLayout(four.model(), 4).block(0);
  const auto ranges = ReplicatedKvRanges(four.model(), block, 4, 3);
  // Rank 3's query head reads KV head 1: its K and V rows (D = 4 each) of the (1 + 2)·4-row
  // slice, i.e. rows 4..11 of qkv.weight, 16 columns each.
  const ParamSpec* qkv = block.Find("attn.qkv.weight");
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0].first, qkv->offset + 4 * 16);
  EXPECT_EQ(ranges[0].second, qkv->offset + 12 * 16);
}

}  // namespace
}  // namespace zt
