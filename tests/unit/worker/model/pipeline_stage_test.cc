// Pipeline stages against the plan and the one-rank model: each stage binds exactly the plan's
// units (RankModelLayout of PipelineChunksOf's partition, the last stage's copy of a tied wte
// included) and starts from the one-rank model's weights; the stages chained in one thread in
// the order of each schedule (PipelineStageOps: GPipe, 1F1B and interleaved with two chunks per
// stage), their boundary tensors copied
// as the sends would carry them and each stage keeping micro-batch k in slot k mod its plan's
// in-flight count, give the one-rank model's loss and accumulated gradients over m
// micro-batches (the two tied copies' gradients summed).
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "kernels/status_macros.h"
#include "worker/model/transformer.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/arena.h"
#include "worker/plan/memory_plan.h"
#include "worker/plan/parallel_plan.h"
#include "worker/plan/pipeline_schedule.h"

namespace zt {
namespace {

constexpr int kBatch = 2, kSeq = 8, kMicroBatches = 4;

// GPT-2 tied; Llama untied with GQA (2 KV heads of 4). Six blocks: eight units, so four
// stages each hold two.
zerotrain::JobSpec Job(zerotrain::ModelConfig::Family family, int pp,
                       zerotrain::ParallelConfig::PipelineSchedule schedule) {
  zerotrain::JobSpec job;
  auto* m = job.mutable_model();
  const bool gpt2 = family == zerotrain::ModelConfig::GPT2;
  m->set_family(family);
  m->set_n_layer(6);
  m->set_n_head(4);
  m->set_n_kv_head(gpt2 ? 4 : 2);
  m->set_d_model(16);
  m->set_d_ff(gpt2 ? 64 : 24);
  m->set_vocab_size(gpt2 ? 32 : 34);
  m->set_max_seq_len(kSeq);
  m->set_tie_embeddings(gpt2);
  m->set_norm_eps(1e-5f);
  m->set_rope_theta(10000.0f);
  // Larger than GPT-2's 0.02 so that every block moves the loss and carries gradient.
  m->set_init_std(0.2f);
  job.mutable_data()->set_seq_len(kSeq);
  job.mutable_train()->set_micro_batch_size(kBatch);
  job.mutable_train()->set_grad_accum_steps(kMicroBatches);
  job.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAMW);
  job.mutable_resources()->set_cpu_threads(1);
  job.mutable_parallel()->set_world_size(pp);
  job.mutable_parallel()->set_pipeline_parallel(pp);
  job.mutable_parallel()->set_pipeline_schedule(schedule);
  job.mutable_parallel()->set_micro_batches(kMicroBatches);
  return job;
}

struct Bound {
  std::unique_ptr<Arenas> arenas;
  std::optional<Transformer> model;
  DeviceContext ctx;
};

absl::StatusOr<Bound> BindRank(const zerotrain::JobSpec& job, const ParallelLayout& layout,
                               bool stage) {
  Bound b;
  ZT_ASSIGN_OR_RETURN(b.arenas, Arenas::Create(PlanMemory(job, layout)));
  absl::StatusOr<Transformer> model =
      stage ? Transformer::BindStage(job, layout, *b.arenas, *b.arenas, kBatch, kSeq)
            : Transformer::Bind(job.model(), *b.arenas, *b.arenas, kBatch, kSeq);
  if (!model.ok()) return model.status();
  b.model.emplace(std::move(*model));
  b.ctx = JobDeviceContext(job);
  ZT_ASSIGN_OR_RETURN(Tensor workspace, b.arenas->Get("gemm_workspace"));
  b.ctx.workspace = {.data = workspace.raw(), .bytes = workspace.size_bytes()};
  return b;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
};

std::vector<Batch> MicroBatches(int vocab) {
  std::mt19937 rng(17);
  std::vector<Batch> out(kMicroBatches);
  for (Batch& b : out) {
    for (int i = 0; i < kBatch * kSeq; ++i) {
      b.tokens.push_back(static_cast<int32_t>(rng() % vocab));
      b.targets.push_back(static_cast<int32_t>(rng() % vocab));
    }
  }
  return out;
}

void Upload(Transformer& m, const Batch& b) {
  std::copy(b.tokens.begin(), b.tokens.end(), m.tokens().data<int32_t>());
  std::copy(b.targets.begin(), b.targets.end(), m.targets().data<int32_t>());
}

std::vector<float> Copy(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

void Paste(const std::vector<float>& v, const Tensor& t) {
  ASSERT_EQ(static_cast<int64_t>(v.size()), t.numel());
  std::copy(v.begin(), v.end(), t.data<float>());
}

const zerotrain::ModelConfig::Family kFamilies[] = {zerotrain::ModelConfig::GPT2,
                                                    zerotrain::ModelConfig::LLAMA};
const zerotrain::ParallelConfig::PipelineSchedule kSchedules[] = {
    zerotrain::ParallelConfig::GPIPE, zerotrain::ParallelConfig::ONE_F_ONE_B};

TEST(PipelineScheduleTest, EachMicroBatchRunsForwardThenBackwardAndInFlightIsThePlans) {
  for (auto schedule : kSchedules) {
    for (int p : {1, 2, 4}) {
      for (int m : {1, 3, 4, 8}) {
        if (schedule == zerotrain::ParallelConfig::ONE_F_ONE_B && m < p) continue;
        zerotrain::JobSpec job = Job(zerotrain::ModelConfig::GPT2, p, schedule);
        job.mutable_parallel()->set_micro_batches(m);
        for (int r = 0; r < p; ++r) {
          const std::vector<PipelineOp> ops = PipelineStageOps(schedule, p, r, m);
          ASSERT_EQ(static_cast<int>(ops.size()), 2 * m);
          std::vector<int> state(m, 0);  // 0 nothing, 1 forward done, 2 backward done
          int forwards = 0, backwards = 0;
          for (const PipelineOp& op : ops) {
            ASSERT_EQ(state[op.micro_batch], op.forward ? 0 : 1);
            state[op.micro_batch] += 1;
            // Micro-batches go forward and come back in order (slot k mod in_flight is free).
            EXPECT_EQ(op.micro_batch, op.forward ? forwards++ : backwards++);
          }
          const int in_flight = PipelineChunksOf(job, ParallelLayout::ForJob(
                                                          job, r * job.parallel().world_size() / p))
                                    .front()
                                    .in_flight;
          if (schedule == zerotrain::ParallelConfig::ONE_F_ONE_B) {
            // Narayanan et al.: stage r holds p − r micro-batches, not m.
            EXPECT_EQ(MaxInFlight(ops), std::min(p - r, m)) << "p " << p << " r " << r;
          }
          EXPECT_LE(MaxInFlight(ops), in_flight) << "p " << p << " r " << r << " m " << m;
        }
      }
    }
  }
}

// The activations a stage is bound to hold: 1F1B keeps p − s micro-batches whatever m is,
// GPipe all m (Narayanan et al.), and every bound stage's slots are exactly the plan's.
TEST(PipelineStageTest, OneFOneBHoldsPMicroBatchesNotM) {
  for (int m : {4, 8}) {
    const zerotrain::JobSpec one_f = [&] {
      zerotrain::JobSpec job =
          Job(zerotrain::ModelConfig::GPT2, 2, zerotrain::ParallelConfig::ONE_F_ONE_B);
      job.mutable_parallel()->set_micro_batches(m);
      job.mutable_train()->set_grad_accum_steps(m);
      return job;
    }();
    zerotrain::JobSpec gpipe = one_f;
    gpipe.mutable_parallel()->set_pipeline_schedule(zerotrain::ParallelConfig::GPIPE);
    const ParallelLayout first = ParallelLayout::ForJob(one_f, 0);
    const int64_t one_f_bytes =
        PlanMemory(one_f, first).CategoryBytes(MemoryCategory::kActivations);
    const int64_t gpipe_bytes =
        PlanMemory(gpipe, first).CategoryBytes(MemoryCategory::kActivations);
    const Bound b = BindRank(one_f, first, true).value();
    EXPECT_EQ(b.model->in_flight(), 2) << "m " << m;
    // The stage's saved activations are (nearly) all per micro-batch: GPipe's m slots against
    // 1F1B's 2 is at least m/2 times the bytes, less the shared one-micro-batch buffers.
    EXPECT_GT(gpipe_bytes, one_f_bytes * m / 2 * 9 / 10) << "m " << m;
    if (m == 8) {
      zerotrain::JobSpec four = one_f;
      four.mutable_parallel()->set_micro_batches(4);
      four.mutable_train()->set_grad_accum_steps(4);
      EXPECT_EQ(one_f_bytes, PlanMemory(four, first).CategoryBytes(MemoryCategory::kActivations));
    }
  }
}

TEST(PipelineStageTest, StagesBindThePlansUnitsAndTheOneRankWeights) {
  for (auto family : kFamilies) {
    for (int p : {2, 4}) {
      const zerotrain::JobSpec job = Job(family, p, zerotrain::ParallelConfig::ONE_F_ONE_B);
      zerotrain::JobSpec one = Job(family, 1, zerotrain::ParallelConfig::ONE_F_ONE_B);
      Bound ref = BindRank(one, ParallelLayout::ForJob(one, 0), false).value();
      ref.model->InitializeWeights(5);
      const int n_units = job.model().n_layer() + 2;
      std::vector<int> held(n_units, 0);
      for (int r = 0; r < p; ++r) {
        const ParallelLayout layout = ParallelLayout::ForJob(job, r);
        absl::StatusOr<Bound> b = BindRank(job, layout, true);
        ASSERT_TRUE(b.ok()) << b.status();
        Transformer& m = *b->model;
        const ModelLayout planned = RankModelLayout(job, layout);
        ASSERT_EQ(m.last_unit() - m.first_unit(), static_cast<int>(planned.units.size()));
        EXPECT_EQ(m.is_first_stage(), r == 0);
        EXPECT_EQ(m.is_last_stage(), r == p - 1);
        m.InitializeWeights(5);
        ASSERT_EQ(m.layout().units.size(), planned.units.size());
        ASSERT_EQ(m.unit_params().size(), planned.units.size());
        for (int u = m.first_unit(); u < m.last_unit(); ++u) {
          ++held[u];
          const int local = u - m.first_unit();
          const UnitLayout& want = planned.units[local];
          const UnitLayout& got = m.layout().units[local];
          EXPECT_EQ(got.name, want.name);
          EXPECT_EQ(got.numel, want.numel) << want.name;
          ASSERT_EQ(m.unit_params()[local].numel(), want.numel) << want.name;
          const std::vector<float> values = Copy(m.unit_params()[local]);
          for (const ParamSpec& spec : want.params) {
            // The last stage's copy of the tied embedding starts as wte itself.
            const bool copy = spec.name == "lm_head.weight" && job.model().tie_embeddings();
            const UnitLayout& ref_unit = ref.model->layout().units[copy ? 0 : u];
            const ParamSpec& ref_spec = *ref_unit.Find(copy ? "wte" : spec.name);
            const float* want_values =
                ref.model->unit_params()[copy ? 0 : u].data<float>() + ref_spec.offset;
            EXPECT_TRUE(
                std::equal(want_values, want_values + ref_spec.numel, values.begin() + spec.offset))
                << want.name << "." << spec.name << " rank " << r;
          }
        }
      }
      // The stages hold every unit exactly once.
      EXPECT_EQ(held, std::vector<int>(n_units, 1));
    }
  }
}

// The one-rank model's summed micro-batch losses and accumulated gradients (each unit's flat
// buffer), the gradient averaged over the step's tokens.
struct Reference {
  double loss = 0;
  std::vector<std::vector<float>> grads;
};

Reference OneRank(zerotrain::ModelConfig::Family family, const std::vector<Batch>& batches) {
  const zerotrain::JobSpec one = Job(family, 1, zerotrain::ParallelConfig::ONE_F_ONE_B);
  Bound b = BindRank(one, ParallelLayout::ForJob(one, 0), false).value();
  Transformer& m = *b.model;
  m.InitializeWeights(5);
  for (const Tensor& g : m.unit_grads()) EXPECT_TRUE(Zero(b.ctx, g).ok());
  Reference r;
  for (const Batch& batch : batches) {
    Upload(m, batch);
    Transformer::LossOptions options{.write_grad = true,
                                     .grad_scale = 1.0f / (kBatch * kSeq * kMicroBatches)};
    r.loss += m.ForwardLoss(b.ctx, options).value();
    EXPECT_TRUE(m.Backward(b.ctx).ok());
  }
  for (const Tensor& g : m.unit_grads()) r.grads.push_back(Copy(g));
  return r;
}

TEST(PipelineStageTest, ChainedStagesGiveTheOneRankLossAndGradients) {
  // INTERLEAVED with v = 2: at p 2 four chunks of the eight units, at p 4 eight chunks of one
  // unit each (a chunk of the embedding alone, one of the head alone).
  struct Layout {
    zerotrain::ParallelConfig::PipelineSchedule schedule;
    int v;
  };
  const Layout layouts[] = {{zerotrain::ParallelConfig::GPIPE, 1},
                            {zerotrain::ParallelConfig::ONE_F_ONE_B, 1},
                            {zerotrain::ParallelConfig::INTERLEAVED, 2}};
  for (auto family : kFamilies) {
    const int vocab = family == zerotrain::ModelConfig::GPT2 ? 32 : 34;
    const std::vector<Batch> batches = MicroBatches(vocab);
    const Reference ref = OneRank(family, batches);
    for (const auto& [schedule, v] : layouts) {
      for (int p : {2, 4}) {
        SCOPED_TRACE(::testing::Message()
                     << "family " << family << " schedule " << schedule << " pp " << p);
        zerotrain::JobSpec job = Job(family, p, schedule);
        if (v > 1) job.mutable_parallel()->set_virtual_stages(v);
        std::vector<Bound> stages;
        for (int r = 0; r < p; ++r) {
          absl::StatusOr<Bound> b = BindRank(job, ParallelLayout::ForJob(job, r), true);
          ASSERT_TRUE(b.ok()) << b.status();
          ASSERT_EQ(b->model->chunks(), v);
          b->model->InitializeWeights(5);
          for (const Tensor& g : b->model->unit_grads()) ASSERT_TRUE(Zero(b->ctx, g).ok());
          stages.push_back(std::move(*b));
        }
        // What the sends carry: activations[C][k] from model chunk C to C + 1, gradients[C][k]
        // from model chunk C to C − 1.
        const int model_chunks = p * v;
        std::vector<std::map<int, std::vector<float>>> activations(model_chunks),
            gradients(model_chunks);
        std::vector<std::vector<PipelineOp>> ops(p);
        std::vector<size_t> next(p, 0);
        for (int r = 0; r < p; ++r) ops[r] = PipelineStageOps(schedule, p, r, kMicroBatches, v);
        double loss_sum[1] = {0};  // an f64 in 2 f32 slots (AccumulateMeanLoss)
        const Tensor loss_tensor(loss_sum, DType::kF32, {2});
        // Run whichever stage's next op has its input, until every stage is done.
        for (bool progressed = true; progressed;) {
          progressed = false;
          for (int r = 0; r < p; ++r) {
            if (next[r] == ops[r].size()) continue;
            const PipelineOp op = ops[r][next[r]];
            Transformer& m = *stages[r].model;
            const int k = op.micro_batch, c = ModelChunk(p, r, op.chunk);
            if (op.forward) {
              if (c > 0 && !activations[c - 1].count(k)) continue;
              ASSERT_TRUE(m.SelectMicroBatch(op.chunk, k % m.in_flight(op.chunk)).ok());
              Upload(m, batches[k]);
              if (c > 0) {
                Paste(activations[c - 1][k], m.stage_input());
                activations[c - 1].erase(k);
              }
              Transformer::LossOptions options{.write_grad = true,
                                               .grad_scale = 1.0f / (kBatch * kSeq * kMicroBatches),
                                               .loss_sum = loss_tensor};
              ASSERT_TRUE(m.StageForward(stages[r].ctx, options).ok());
              if (c < model_chunks - 1) activations[c][k] = Copy(m.stage_output());
            } else {
              if (c < model_chunks - 1 && !gradients[c + 1].count(k)) continue;
              ASSERT_TRUE(m.SelectMicroBatch(op.chunk, k % m.in_flight(op.chunk)).ok());
              Upload(m, batches[k]);  // the embedding's backward reads the tokens again
              if (c < model_chunks - 1) {
                Paste(gradients[c + 1][k], m.residual_grad());
                gradients[c + 1].erase(k);
              }
              const absl::Status s = m.StageBackward(stages[r].ctx);
              ASSERT_TRUE(s.ok()) << s;
              if (c > 0) gradients[c][k] = Copy(m.residual_grad());
            }
            ++next[r];
            progressed = true;
          }
        }
        for (int r = 0; r < p; ++r) ASSERT_EQ(next[r], ops[r].size()) << "stage " << r << " stuck";
        // The same ops on the same values: only the order of the sum of micro-batch losses
        // and of the gradient accumulation could differ, and it does not; fp32 reduction
        // noise is still allowed for (relative 1e-5).
        EXPECT_NEAR(loss_sum[0], ref.loss, 1e-5 * std::abs(ref.loss));
        const int n_units = job.model().n_layer() + 2;
        for (int u = 0; u < n_units; ++u) {
          for (const Bound& b : stages) {
            const Transformer& m = *b.model;
            if (!m.HoldsUnit(u)) continue;
            const int local = static_cast<int>(
                std::find(m.held_units().begin(), m.held_units().end(), u) -
                m.held_units().begin());
            std::vector<float> got = Copy(m.unit_grads()[local]);
            if (u == n_units - 1 && job.model().tie_embeddings() && !m.HoldsUnit(0)) {
              // The head's wte copy: its gradient goes to wte's, compared below.
              const ParamSpec& copy = *m.layout().units[local].Find("lm_head.weight");
              got.resize(copy.offset);
            }
            if (u == 0 && job.model().tie_embeddings()) {
              // wte's gradient is the sum of the two copies' (Megatron's all-reduce between
              // the first and last stage).
              const Transformer& last = *stages.back().model;
              const ParamSpec& copy = *last.layout().units.back().Find("lm_head.weight");
              const ParamSpec& wte = *m.layout().units[0].Find("wte");
              const float* head = last.unit_grads().back().data<float>() + copy.offset;
              for (int64_t i = 0; i < wte.numel; ++i) got[wte.offset + i] += head[i];
            }
            ASSERT_EQ(got.size(), ref.grads[u].size()) << "unit " << u;
            for (size_t i = 0; i < got.size(); ++i) {
              // Equal but for the order of the tied copies' sum: fp32 rounding of a few ulps.
              ASSERT_NEAR(got[i], ref.grads[u][i], 1e-6f + 1e-5f * std::abs(ref.grads[u][i]))
                  << "unit " << u << " element " << i;
            }
          }
        }
      }
    }
  }
}

// A stage of a TP2 × PP2 layout binds its tensor-parallel shares only with the layout's TP
// group (tests/unit/worker/trainer/tensor_pipeline_training_test.cc trains them): without one,
// or with another rank's coordinate, it is refused naming both.
TEST(PipelineStageTest, ATensorParallelStageNeedsTheLayoutsGroup) {
  zerotrain::JobSpec job = Job(zerotrain::ModelConfig::GPT2, 2, zerotrain::ParallelConfig::GPIPE);
  job.mutable_parallel()->set_world_size(4);
  job.mutable_parallel()->set_tensor_parallel(2);
  const ParallelLayout layout = ParallelLayout::ForJob(job, 1);  // tensor 1, stage 0
  auto arenas = Arenas::Create(PlanMemory(job, layout)).value();
  const absl::StatusOr<Transformer> none =
      Transformer::BindStage(job, layout, *arenas, *arenas, kBatch, kSeq);
  ASSERT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument) << none.status();
  EXPECT_NE(none.status().message().find("tensor-parallel group (size 1, rank 0) is not the "
                                         "layout's (size 2, rank 1)"),
            std::string::npos)
      << none.status();
  TensorParallelGroup other{.size = 2, .rank = 0};
  const absl::StatusOr<Transformer> wrong =
      Transformer::BindStage(job, layout, *arenas, *arenas, kBatch, kSeq, other);
  ASSERT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument) << wrong.status();
}

}  // namespace
}  // namespace zt
