// Tests of the sharding planner's tensor × pipeline layout search
// (worker/plan/sharding_planner.h, "Layouts"): which layouts are planned or rejected with their
// rules, that a layout is chosen when only it fits, and the model-parallel cost terms against
// the header's formulas evaluated by hand.
#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/job/job_loading.h"
#include "worker/model/param_layout.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/memory_plan.h"
#include "worker/plan/parallel_plan.h"
#include "worker/plan/sharding_planner.h"

namespace zt {
namespace {

using ::testing::HasSubstr;

// GPT-2 family: 4 blocks, 4 heads, C 64, V 256; B 2 × T 32, f32.
zerotrain::JobSpec Parsed(int world, int accum) {
  zerotrain::JobSpec job;
  job.set_name("layouts");
  auto* m = job.mutable_model();
  m->set_family(zerotrain::ModelConfig::GPT2);
  m->set_n_layer(4);
  m->set_n_head(4);
  m->set_d_model(64);
  m->set_vocab_size(256);
  m->set_max_seq_len(64);
  job.mutable_data()->add_train("train.bin");
  job.mutable_data()->set_seq_len(32);
  job.mutable_train()->set_micro_batch_size(2);
  job.mutable_train()->set_grad_accum_steps(accum);
  job.mutable_train()->set_max_steps(1);
  job.mutable_optimizer()->set_lr(1e-3f);
  job.mutable_parallel()->set_world_size(world);
  job.mutable_resources()->set_cpu_threads(1);
  return job;
}

zerotrain::JobSpec Input(zerotrain::JobSpec parsed) {
  absl::StatusOr<zerotrain::JobSpec> job =
      JobForPlanning(std::move(parsed), {.check_paths = false, .check_engine_support = false});
  EXPECT_TRUE(job.ok()) << job.status();
  return *job;
}

zerotrain::ShardingPlan Plan(const zerotrain::JobSpec& job, int64_t device_bytes,
                             LayoutSearch layouts) {
  absl::StatusOr<zerotrain::ShardingPlan> plan =
      PlanSharding(job, {.device_memory_bytes = device_bytes, .layouts = layouts});
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

constexpr int64_t kHuge = int64_t{1} << 40;

std::set<std::pair<int, int>> LayoutsOf(const zerotrain::ShardingPlan& plan) {
  std::set<std::pair<int, int>> out;
  for (const auto& c : plan.candidates()) out.insert({c.tensor_parallel(), c.pipeline_parallel()});
  return out;
}

TEST(PlannerLayoutTest, TheCoordinatorsSearchPlansOnlyTheJobsLayout) {
  const zerotrain::ShardingPlan plan = Plan(Input(Parsed(4, 4)), kHuge, LayoutSearch::kJob);
  EXPECT_EQ(LayoutsOf(plan), (std::set<std::pair<int, int>>{{1, 1}}));
  EXPECT_TRUE(plan.rejected_layouts().empty());
}

TEST(PlannerLayoutTest, EveryLayoutOfTheWorldIsPlannedOrRejectedWithItsRule) {
  // 4 ranks, one micro-batch: pipelines of 2 and 4 stages cannot fill under 1F1B.
  const zerotrain::ShardingPlan one = Plan(Input(Parsed(4, 1)), kHuge, LayoutSearch::kAll);
  EXPECT_EQ(LayoutsOf(one), (std::set<std::pair<int, int>>{{1, 1}, {2, 1}, {4, 1}}));
  ASSERT_EQ(one.rejected_layouts_size(), 3);
  EXPECT_THAT(one.rejected_layouts(0),
              HasSubstr("tensor_parallel 1 × pipeline_parallel 2: parallel.micro_batches: 1 is "
                        "fewer than parallel.pipeline_parallel 2"));
  // Four micro-batches: every (t, p) with t · p dividing 4 is planned.
  const zerotrain::ShardingPlan four = Plan(Input(Parsed(4, 4)), kHuge, LayoutSearch::kAll);
  EXPECT_EQ(LayoutsOf(four),
            (std::set<std::pair<int, int>>{{1, 1}, {1, 2}, {1, 4}, {2, 1}, {2, 2}, {4, 1}}));
  EXPECT_TRUE(four.rejected_layouts().empty());
  // 8 ranks: tensor parallel 8 does not divide the 4 heads.
  const zerotrain::ShardingPlan eight = Plan(Input(Parsed(8, 8)), kHuge, LayoutSearch::kAll);
  EXPECT_FALSE(LayoutsOf(eight).contains({8, 1}));
  bool named = false;
  for (const std::string& r : eight.rejected_layouts()) {
    named |= r.starts_with(
        "tensor_parallel 8 × pipeline_parallel 1: parallel.tensor_parallel: "
        "8 does not divide model.n_head 4");
  }
  EXPECT_TRUE(named);
}

TEST(PlannerLayoutTest, APinnedTensorSizeIsKept) {
  zerotrain::JobSpec parsed = Parsed(4, 4);
  parsed.mutable_parallel()->set_tensor_parallel(2);
  const zerotrain::ShardingPlan plan = Plan(Input(parsed), kHuge, LayoutSearch::kAll);
  EXPECT_EQ(LayoutsOf(plan), (std::set<std::pair<int, int>>{{2, 1}, {2, 2}}));
  EXPECT_THAT(plan.pinned(), ::testing::Contains("parallel.tensor_parallel"));
}

TEST(PlannerLayoutTest, ALayoutIsChosenWhenOnlyItFits) {
  const zerotrain::JobSpec job = Input(Parsed(4, 4));
  const zerotrain::ShardingPlan all = Plan(job, kHuge, LayoutSearch::kAll);
  int64_t flat = INT64_MAX, split = INT64_MAX;
  for (const auto& c : all.candidates()) {
    const bool one = c.tensor_parallel() * c.pipeline_parallel() == 1;
    (one ? flat : split) = std::min(one ? flat : split, c.peak_bytes_per_rank());
  }
  // Splitting layers and stages leaves each rank less of the model and its activations.
  ASSERT_LT(split, flat);
  const double between = (static_cast<double>(flat) + static_cast<double>(split)) / 2.0;
  const int64_t device = static_cast<int64_t>(between / 0.9);
  const zerotrain::ShardingPlan tight = Plan(job, device, LayoutSearch::kAll);
  ASSERT_TRUE(tight.chosen().fits()) << tight.reason();
  EXPECT_GT(tight.chosen().tensor_parallel() * tight.chosen().pipeline_parallel(), 1);
  for (const auto& c : tight.candidates()) {
    if (c.tensor_parallel() * c.pipeline_parallel() == 1) {
      EXPECT_FALSE(c.fits());
      EXPECT_THAT(c.rejected_because(), HasSubstr("per rank, devices have"));
    }
  }
  // WithPlan writes the layout into the fields the job left to the planner.
  const zerotrain::JobSpec planned = WithPlan(job, tight);
  EXPECT_EQ(planned.parallel().tensor_parallel(), tight.chosen().tensor_parallel());
  EXPECT_EQ(planned.parallel().pipeline_parallel(), tight.chosen().pipeline_parallel());
}

const zerotrain::PlanCandidate* Find(const zerotrain::ShardingPlan& plan, int tp, int pp,
                                     int stage) {
  for (const auto& c : plan.candidates()) {
    if (c.tensor_parallel() == tp && c.pipeline_parallel() == pp && c.zero_stage() == stage &&
        c.activation_checkpointing() == zerotrain::MemoryConfig::NONE) {
      return &c;
    }
  }
  return nullptr;
}

TEST(PlannerLayoutTest, ModelParallelCommunicationAndBubbleFollowTheFormulas) {
  // 2 ranks, so each layout leaves one data-parallel rank and ZeRO sends nothing. One
  // micro-batch's activations B·T·C·4 = 2·32·64·4 = 16384 bytes.
  const zerotrain::ShardingPlan accum1 = Plan(Input(Parsed(2, 1)), kHuge, LayoutSearch::kAll);
  const zerotrain::PlanCandidate* tp2 = Find(accum1, 2, 1, 0);
  ASSERT_NE(tp2, nullptr);
  // A·(4·⌈L/p⌉ + 2)·2·(t − 1)/t·B·T·C·4 = 1·(4·4 + 2)·2·(1/2)·16384: the blocks' four
  // all-reduces and the embedding's and the head's one each.
  EXPECT_EQ(tp2->comm_bytes_per_step(), (4 * 4 + 2) * 2 * 16384 / 2);
  EXPECT_EQ(tp2->bubble_fraction(), 0.0);
  const zerotrain::ShardingPlan accum2 = Plan(Input(Parsed(2, 2)), kHuge, LayoutSearch::kAll);
  const zerotrain::PlanCandidate* pp2 = Find(accum2, 1, 2, 0);
  ASSERT_NE(pp2, nullptr);
  EXPECT_EQ(pp2->comm_bytes_per_step(), 2 * 2 * 16384);  // 2·A·B·T·C·c
  EXPECT_DOUBLE_EQ(pp2->bubble_fraction(), 1.0 / 2.0);   // (p − 1)/(v·m)
  // The cost carries the bubble.
  EXPECT_GE(pp2->cost(), pp2->bubble_fraction());
}

TEST(PlannerLayoutTest, SequenceParallelAddsItsNormRegathersAndNormGradientSums) {
  // The engine's bytes (TensorParallelTrainingTest.SequenceParallelSendsTensorParallelBytes…):
  // tensor parallelism's, plus per micro-batch and block two norm-output regathers, plus once a
  // step the norms' gradient sums. GPT-2's norms: ln1 and ln2 per block and ln_f, each a
  // weight and a bias of C = 64: 4 blocks · 256 + 128 = 1152 elements of 4 bytes.
  for (const int accum : {1, 2}) {
    zerotrain::JobSpec parsed = Parsed(2, accum);
    parsed.mutable_parallel()->set_tensor_parallel(2);
    const zerotrain::ShardingPlan plain = Plan(Input(parsed), kHuge, LayoutSearch::kJob);
    parsed.mutable_parallel()->set_sequence_parallel(true);
    const zerotrain::ShardingPlan sequence = Plan(Input(parsed), kHuge, LayoutSearch::kJob);
    const zerotrain::PlanCandidate* tp = Find(plain, 2, 1, 0);
    const zerotrain::PlanCandidate* sp = Find(sequence, 2, 1, 0);
    ASSERT_NE(tp, nullptr);
    ASSERT_NE(sp, nullptr);
    EXPECT_EQ(tp->comm_bytes_per_step(), accum * (4 * 4 + 2) * 2 * 16384 / 2)
        << "accum " << accum;
    // A·⌈L/p⌉·2·(t − 1)/t·B·T·C·c + 2·(t − 1)/t·N·g.
    EXPECT_EQ(sp->comm_bytes_per_step() - tp->comm_bytes_per_step(),
              accum * 4 * 2 * 16384 / 2 + 2 * 1152 * 4 / 2)
        << "accum " << accum;
    EXPECT_GT(sp->cost(), tp->cost()) << "accum " << accum;
  }
}

TEST(PlannerLayoutTest, Bf16TensorParallelReductionsCountGloosF32AndGathersTheirOwnWidth) {
  // What the engine sends (TensorParallelTrainingTest.PlannedTensorParallelBytesAreTheEngines…):
  // on CPU ranks Gloo reduces 16-bit data in f32, so a bf16 job's all-reduces send the f32
  // job's bytes; with sequence parallelism its all-gathers (the forward's four and the
  // backward's two regathers per block) send half of theirs, the reduce-scatters and the norms'
  // gradient sums f32's. On CUDA ranks NCCL reduces in bf16: everything at two bytes.
  for (const bool cuda : {false, true}) {
    for (const bool sequence : {false, true}) {
      zerotrain::JobSpec parsed = Parsed(2, 1);
      parsed.mutable_parallel()->set_tensor_parallel(2);
      parsed.mutable_parallel()->set_sequence_parallel(sequence);
      if (cuda) parsed.mutable_resources()->set_device(zerotrain::ResourceConfig::CUDA);
      const zerotrain::ShardingPlan f32 = Plan(Input(parsed), kHuge, LayoutSearch::kJob);
      auto* precision = parsed.mutable_precision();
      precision->set_param_dtype(zerotrain::PrecisionConfig::BF16);
      precision->set_compute_dtype(zerotrain::PrecisionConfig::BF16);
      precision->set_grad_dtype(zerotrain::PrecisionConfig::BF16);
      const zerotrain::ShardingPlan bf16 = Plan(Input(parsed), kHuge, LayoutSearch::kJob);
      const zerotrain::PlanCandidate* a = Find(f32, 2, 1, 0);
      const zerotrain::PlanCandidate* b = Find(bf16, 2, 1, 0);
      ASSERT_NE(a, nullptr);
      ASSERT_NE(b, nullptr);
      const std::string what = absl::StrCat(cuda ? "cuda" : "cpu", sequence ? " sp" : "");
      // f32: (4·4 + 2)·2·(1/2)·16384, plus with sequence parallelism the regathers and norm
      // sums.
      const int64_t regathers = 4 * 2 * 16384 / 2, norms = 2 * 1152 * 4 / 2;
      EXPECT_EQ(a->comm_bytes_per_step(),
                (4 * 4 + 2) * 2 * 16384 / 2 + (sequence ? regathers + norms : 0)) << what;
      int64_t halved = 0;  // the f32 bytes a bf16 job sends at half width
      if (cuda) {
        halved = a->comm_bytes_per_step();
      } else if (sequence) {
        halved = (4 * 4 + 2) * 16384 / 2 + regathers;  // the all-gathers
      }
      EXPECT_EQ(b->comm_bytes_per_step(), a->comm_bytes_per_step() - halved / 2) << what;
    }
  }
}

// A ZeRO-3 pipeline stage's gathers per step (ShardingEngine::BeginStagePass): each of its units
// once with reshard_after_forward false, and with it m times in the forwards and m in the
// backwards but the embedding's and the head's; with it the stage also reduce-scatters every
// micro-batch's gradients (m times a step, not once) and gathers the tied embedding's reduced
// gradient once to sum its two copies. PP2 × DP2 on 4 ranks (G = 2, f32): a gather or a
// reduce-scatter of a unit sends half its padded elements; everything else the candidate counts
// is the same at both settings.
TEST(PlannerLayoutTest, PipelineZeroThreeGathersFollowTheStagesUses) {
  int64_t comm[2] = {};
  zerotrain::JobSpec job;
  for (const bool reshard : {false, true}) {
    zerotrain::JobSpec parsed = Parsed(4, 4);
    parsed.mutable_parallel()->set_reshard_after_forward(reshard);
    job = Input(parsed);
    const zerotrain::ShardingPlan plan = Plan(job, kHuge, LayoutSearch::kAll);
    const zerotrain::PlanCandidate* pp2 = Find(plan, 1, 2, 3);
    ASSERT_NE(pp2, nullptr);
    comm[reshard] = pp2->comm_bytes_per_step();
  }
  // The planner counts rank 0's stage.
  job.mutable_parallel()->set_pipeline_parallel(2);
  job.mutable_parallel()->set_zero_stage(3);
  const ModelLayout stage = RankModelLayout(job, ParallelLayout::ForJob(job, 0));
  int64_t extra = 0;
  for (const UnitLayout& u : stage.units) {
    const int64_t uses = 4 * (2 - (u.kind == UnitKind::kEmbedding) - (u.kind == UnitKind::kHead));
    extra += (uses - 1) * PaddedUnitNumel(u.numel, 2) / 2 * 4;
    extra += (4 - 1) * PaddedUnitNumel(u.numel, 2) / 2 * 4;  // reduce-scatters
    // Rank 0's stage holds the tied embedding: its gradient's all-gather.
    if (u.kind == UnitKind::kEmbedding) extra += PaddedUnitNumel(u.numel, 2) / 2 * 4;
  }
  EXPECT_GT(extra, 0);
  EXPECT_EQ(comm[1] - comm[0], extra);
}

}  // namespace
}  // namespace zt
