// Tests of the sharding planner (worker/plan/sharding_planner.h): candidates follow what the
// job pins, peaks are the memory plan's, the choice is the cheapest that fits and moves
// towards smaller plans as the device shrinks, and communication and recompute figures match
// a float64 evaluation of the documented formulas.
#include "worker/plan/sharding_planner.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <tuple>

#include "gtest/gtest.h"
#include "worker/job/job_loading.h"
#include "worker/model/param_layout.h"
#include "worker/plan/memory_plan.h"

namespace zt {
namespace {

using Ckpt = zerotrain::MemoryConfig;

// examples/tiny.yaml's GPT-2 (4 blocks, d_model 256, 8 × 256 tokens) on 4 ranks: its
// activations outweigh its model states, so recompute and sharding both move the peak.
zerotrain::JobSpec ParsedTinyJob() {
  zerotrain::JobSpec job;
  job.set_name("tiny");
  auto* m = job.mutable_model();
  m->set_family(zerotrain::ModelConfig::GPT2);
  m->set_n_layer(4);
  m->set_n_head(4);
  m->set_d_model(256);
  m->set_vocab_size(256);
  m->set_max_seq_len(256);
  job.mutable_data()->add_train("train.bin");
  job.mutable_data()->set_seq_len(256);
  job.mutable_train()->set_micro_batch_size(8);
  job.mutable_train()->set_max_steps(10);
  job.mutable_optimizer()->set_lr(1e-3);
  job.mutable_parallel()->set_world_size(4);
  job.mutable_resources()->set_cpu_threads(1);
  return job;
}

zerotrain::JobSpec PlannerInput(zerotrain::JobSpec parsed) {
  absl::StatusOr<zerotrain::JobSpec> job =
      JobForPlanning(std::move(parsed), {.check_paths = false, .check_engine_support = false});
  EXPECT_TRUE(job.ok()) << job.status();
  return *job;
}

zerotrain::ShardingPlan Plan(const zerotrain::JobSpec& job, int64_t device_bytes,
                             double margin = 0.10) {
  absl::StatusOr<zerotrain::ShardingPlan> plan =
      PlanSharding(job, {.device_memory_bytes = device_bytes, .safety_margin = margin});
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

constexpr int64_t kHuge = int64_t{1} << 50;

int RecomputeOrder(Ckpt::ActivationCheckpointing c) {
  return c == Ckpt::NONE ? 0 : c == Ckpt::SELECTIVE ? 1 : 2;
}

TEST(JobForPlanningTest, LeavesThePlannersFieldsUnsetAndAppliesTheOtherDefaults) {
  const zerotrain::JobSpec job = PlannerInput(ParsedTinyJob());
  EXPECT_FALSE(job.parallel().has_zero_stage());
  EXPECT_EQ(job.memory().activation_checkpointing(), Ckpt::CHECKPOINTING_UNSPECIFIED);
  // The layout is the planner's too, and the shard group's default follows it.
  EXPECT_FALSE(job.parallel().has_tensor_parallel());
  EXPECT_FALSE(job.parallel().has_pipeline_parallel());
  EXPECT_FALSE(job.parallel().has_shard_group_size());
  EXPECT_TRUE(job.parallel().reshard_after_forward());

  zerotrain::JobSpec pinned = ParsedTinyJob();
  pinned.mutable_parallel()->set_zero_stage(0);
  pinned.mutable_memory()->set_activation_checkpointing(Ckpt::SELECTIVE);
  const zerotrain::JobSpec kept = PlannerInput(pinned);
  EXPECT_TRUE(kept.parallel().has_zero_stage());
  EXPECT_EQ(kept.parallel().zero_stage(), 0);
  EXPECT_EQ(kept.memory().activation_checkpointing(), Ckpt::SELECTIVE);
}

TEST(ShardingPlannerTest, PinnedFieldsStay) {
  zerotrain::JobSpec stage_pinned = ParsedTinyJob();
  stage_pinned.mutable_parallel()->set_zero_stage(2);
  const zerotrain::ShardingPlan by_stage = Plan(PlannerInput(stage_pinned), 1 << 20);
  // Nothing fits 1 MiB, so the planner tried offload too; every candidate keeps the stage.
  std::set<int> policies;
  int without_offload = 0;
  for (const auto& c : by_stage.candidates()) {
    EXPECT_EQ(c.zero_stage(), 2);
    if (c.offload_optimizer() != zerotrain::OffloadConfig::NONE) continue;
    ++without_offload;
    policies.insert(c.activation_checkpointing());
  }
  EXPECT_EQ(without_offload, 3);
  EXPECT_EQ(policies, (std::set<int>{Ckpt::NONE, Ckpt::SELECTIVE, Ckpt::FULL}));
  EXPECT_EQ(by_stage.chosen().zero_stage(), 2);
  ASSERT_EQ(by_stage.pinned_size(), 1);
  EXPECT_EQ(by_stage.pinned(0), "parallel.zero_stage");

  zerotrain::JobSpec both = stage_pinned;
  both.mutable_memory()->set_activation_checkpointing(Ckpt::EVERY_K);
  both.mutable_memory()->set_checkpoint_every_k(2);
  const zerotrain::ShardingPlan by_both = Plan(PlannerInput(both), kHuge);
  ASSERT_EQ(by_both.candidates_size(), 1);
  EXPECT_EQ(by_both.chosen().zero_stage(), 2);
  EXPECT_EQ(by_both.chosen().activation_checkpointing(), Ckpt::EVERY_K);
  EXPECT_EQ(by_both.pinned_size(), 2);

  zerotrain::JobSpec policy_pinned = ParsedTinyJob();
  policy_pinned.mutable_memory()->set_activation_checkpointing(Ckpt::FULL);
  const zerotrain::ShardingPlan by_policy = Plan(PlannerInput(policy_pinned), kHuge);
  ASSERT_EQ(by_policy.candidates_size(), 4);
  for (const auto& c : by_policy.candidates()) {
    EXPECT_EQ(c.activation_checkpointing(), Ckpt::FULL);
  }
  ASSERT_EQ(by_policy.pinned_size(), 1);
  EXPECT_EQ(by_policy.pinned(0), "memory.activation_checkpointing");
}

TEST(ShardingPlannerTest, BigDevicePicksStageZeroWithoutRecompute) {
  const zerotrain::ShardingPlan plan = Plan(PlannerInput(ParsedTinyJob()), kHuge);
  EXPECT_EQ(plan.world_size(), 4);
  EXPECT_EQ(plan.candidates_size(), 12);
  EXPECT_TRUE(plan.chosen().fits());
  EXPECT_EQ(plan.chosen().zero_stage(), 0);
  EXPECT_EQ(plan.chosen().activation_checkpointing(), Ckpt::NONE);
  EXPECT_TRUE(plan.chosen().rejected_because().empty());
  // Cheapest first, as the proto documents.
  for (int i = 1; i < plan.candidates_size(); ++i) {
    EXPECT_LE(plan.candidates(i - 1).cost(), plan.candidates(i).cost());
  }
}

TEST(ShardingPlannerTest, FitsIsThePlansTotalAgainstTheMargin) {
  const zerotrain::JobSpec job = PlannerInput(ParsedTinyJob());
  const zerotrain::ShardingPlan plan = Plan(job, kHuge);
  for (const zerotrain::PlanCandidate& c : plan.candidates()) {
    zerotrain::JobSpec concrete = job;
    concrete.mutable_parallel()->set_zero_stage(c.zero_stage());
    concrete.mutable_memory()->set_activation_checkpointing(c.activation_checkpointing());
    const int64_t total = PlanMemory(concrete, 0).TotalBytes();
    EXPECT_EQ(c.peak_bytes_per_rank(), total);
    // No other rank plans more than rank 0, whose peak the planner reports.
    for (int r = 1; r < 4; ++r) EXPECT_LE(PlanMemory(concrete, r).TotalBytes(), total);

    // Margins of 0 and 1/2 keep the limit exact in double, so the boundary byte decides.
    auto fits = [&](int64_t device, double margin) {
      const zerotrain::ShardingPlan p = Plan(job, device, margin);
      for (const auto& d : p.candidates()) {
        if (d.zero_stage() == c.zero_stage() &&
            d.activation_checkpointing() == c.activation_checkpointing() &&
            d.offload_optimizer() == zerotrain::OffloadConfig::NONE) {
          return d.fits();
        }
      }
      ADD_FAILURE() << "candidate missing";
      return false;
    };
    EXPECT_TRUE(fits(total, 0.0));
    EXPECT_FALSE(fits(total - 1, 0.0));
    EXPECT_TRUE(fits(2 * total, 0.5));
    EXPECT_FALSE(fits(2 * total - 1, 0.5));
  }
}

TEST(ShardingPlannerTest, ShrinkingTheDeviceWalksTowardsStageThreeAndFullRecompute) {
  const zerotrain::JobSpec job = PlannerInput(ParsedTinyJob());
  const zerotrain::ShardingPlan all = Plan(job, kHuge);
  std::set<int64_t, std::greater<>> peaks;
  for (const auto& c : all.candidates()) peaks.insert(c.peak_bytes_per_rank());
  ASSERT_GT(peaks.size(), 3u);

  int64_t last_peak = std::numeric_limits<int64_t>::max();
  double last_cost = -1;
  int changes = 0;
  for (const int64_t device : peaks) {
    const zerotrain::ShardingPlan plan = Plan(job, device, 0.0);
    const zerotrain::PlanCandidate& chosen = plan.chosen();
    ASSERT_TRUE(chosen.fits()) << device;
    EXPECT_LE(chosen.peak_bytes_per_rank(), device);
    // The reference rule: the cheapest candidate that fits, ties to lower stage, then to
    // lighter recompute.
    const zerotrain::PlanCandidate* best = nullptr;
    auto key = [](const zerotrain::PlanCandidate& c) {
      return std::make_tuple(c.cost(), c.zero_stage(),
                             RecomputeOrder(c.activation_checkpointing()));
    };
    for (const auto& c : all.candidates()) {
      if (c.peak_bytes_per_rank() <= device && (best == nullptr || key(c) < key(*best))) {
        best = &c;
      }
    }
    ASSERT_NE(best, nullptr);
    EXPECT_EQ(chosen.zero_stage(), best->zero_stage());
    EXPECT_EQ(chosen.activation_checkpointing(), best->activation_checkpointing());
    EXPECT_LE(chosen.peak_bytes_per_rank(), last_peak);
    EXPECT_GE(chosen.cost(), last_cost);
    if (chosen.peak_bytes_per_rank() != last_peak) ++changes;
    last_peak = chosen.peak_bytes_per_rank();
    last_cost = chosen.cost();
  }
  EXPECT_GE(changes, 3);
  // The smallest device that fits anything gets the smallest plan: everything sharded and
  // every block recomputed.
  const zerotrain::ShardingPlan tightest = Plan(job, *peaks.rbegin(), 0.0);
  EXPECT_EQ(tightest.chosen().zero_stage(), 3);
  EXPECT_EQ(tightest.chosen().activation_checkpointing(), Ckpt::FULL);
}

TEST(ShardingPlannerTest, NothingFitsChoosesTheSmallestAndSaysWhy) {
  const zerotrain::JobSpec job = PlannerInput(ParsedTinyJob());
  const zerotrain::ShardingPlan plan = Plan(job, 4096);
  EXPECT_FALSE(plan.chosen().fits());
  int64_t smallest = std::numeric_limits<int64_t>::max();
  for (const auto& c : plan.candidates()) {
    EXPECT_FALSE(c.fits());
    smallest = std::min(smallest, c.peak_bytes_per_rank());
  }
  EXPECT_EQ(plan.chosen().peak_bytes_per_rank(), smallest);
  const std::string& why = plan.chosen().rejected_because();
  EXPECT_NE(why.find(std::to_string(smallest) + " bytes"), std::string::npos) << why;
  EXPECT_NE(why.find("4096 bytes"), std::string::npos) << why;
  EXPECT_NE(why.find("10% kept free"), std::string::npos) << why;
}

TEST(ShardingPlannerTest, CommunicationAndRecomputeMatchTheFormulas) {
  zerotrain::JobSpec parsed = ParsedTinyJob();
  parsed.mutable_train()->set_grad_accum_steps(2);
  const zerotrain::JobSpec job = PlannerInput(parsed);
  const zerotrain::ShardingPlan plan = Plan(job, kHuge);

  // float64 evaluation from the model's dimensions, independent of the planner's code.
  const double N = 4, B = 8, T = 256, C = 256, F = 1024, V = 256, L = 4, A = 2;
  const ModelLayout layout = BuildModelLayout(job.model());
  const double psi = static_cast<double>(layout.total_numel);
  double padded = 0, padded_ends = 0;  // padded_ends: the embedding's and the head's
  for (const UnitLayout& u : layout.units) {
    const double p = std::ceil(static_cast<double>(u.numel) / (64 * N)) * 64 * N;
    padded += p;
    if (u.kind == UnitKind::kEmbedding || u.kind == UnitKind::kHead) padded_ends += p;
  }
  // GPT-2 block weights: qkv (3C, C), proj (C, C), fc (F, C), proj (C, F).
  const double block = 2 * B * T * (3 * C * C + C * C + 2 * F * C) + 4 * B * T * T * C +
                       kActivationFlopsPerElement * B * T * F;
  const double core = 4 * B * T * T * C + kActivationFlopsPerElement * B * T * F;
  const double forward = L * block + 2 * B * T * C * V;

  for (const zerotrain::PlanCandidate& c : plan.candidates()) {
    const double ring = (N - 1) / N * padded * 4;  // fp32 parameters and gradients
    double comm = 0;
    switch (c.zero_stage()) {
      case 0:
        comm = 2 * (N - 1) / N * psi * 4;
        break;
      case 1:
      case 2:
        comm = 2 * ring;
        break;
      default:
        // Each micro-batch gathers every unit for its forward and the blocks again for their
        // backward: the embedding's backward reads no parameters and the head stays gathered
        // from its forward to its backward (ShardingEngine::ForwardBackward), so the engine
        // sends A·(2P − P_ends), not the 2·A·P counted before.
        comm = ring + A * (2 * ring - (N - 1) / N * padded_ends * 4);
    }
    double recompute = 0;
    if (c.activation_checkpointing() == Ckpt::FULL) recompute = L * block / (3 * forward);
    if (c.activation_checkpointing() == Ckpt::SELECTIVE) recompute = L * core / (3 * forward);
    // Integer division of byte counts truncates below one byte per term (a few terms).
    EXPECT_NEAR(static_cast<double>(c.comm_bytes_per_step()), comm, 4.0);
    // A few dozen float64 operations on values below 2^40: relative error ~1e-15.
    EXPECT_NEAR(c.recompute_fraction(), recompute, 1e-12);
    EXPECT_NEAR(c.cost(), recompute + kCommCostPerStepOfCompute * comm / (8 * psi), 1e-9);
  }

  zerotrain::JobSpec single = parsed;
  single.mutable_parallel()->set_world_size(1);
  const zerotrain::ShardingPlan single_plan = Plan(PlannerInput(single), kHuge);
  for (const auto& c : single_plan.candidates()) {
    EXPECT_EQ(c.comm_bytes_per_step(), 0);
  }
}

TEST(ShardingPlannerTest, Bf16GradientReductionsCountGloosF32AndGathersTheirOwnWidth) {
  // What the engine sends (ShardedTrainingTest.PlannedDataParallelBytesAreTheEnginesInBf16):
  // on CPU ranks Gloo reduces 16-bit data in f32, so a bf16 job's gradient all-reduce
  // (stage 0) and reduce-scatter (stages 1–3) send the f32 job's bytes and only its parameter
  // all-gathers half of theirs; on CUDA ranks NCCL reduces in bf16: everything at two bytes.
  const double N = 4;
  const ModelLayout layout = BuildModelLayout(PlannerInput(ParsedTinyJob()).model());
  double padded = 0;
  for (const UnitLayout& u : layout.units) {
    padded += std::ceil(static_cast<double>(u.numel) / (64 * N)) * 64 * N;
  }
  const int64_t reduce_scatter = static_cast<int64_t>((N - 1) / N * padded * 4);
  for (const bool cuda : {false, true}) {
    zerotrain::JobSpec parsed = ParsedTinyJob();
    if (cuda) parsed.mutable_resources()->set_device(zerotrain::ResourceConfig::CUDA);
    const zerotrain::ShardingPlan f32 = Plan(PlannerInput(parsed), kHuge);
    auto* precision = parsed.mutable_precision();
    precision->set_param_dtype(zerotrain::PrecisionConfig::BF16);
    precision->set_compute_dtype(zerotrain::PrecisionConfig::BF16);
    precision->set_grad_dtype(zerotrain::PrecisionConfig::BF16);
    const zerotrain::ShardingPlan bf16 = Plan(PlannerInput(parsed), kHuge);
    int compared = 0;
    for (const zerotrain::PlanCandidate& a : f32.candidates()) {
      for (const zerotrain::PlanCandidate& b : bf16.candidates()) {
        if (a.zero_stage() != b.zero_stage() ||
            a.activation_checkpointing() != b.activation_checkpointing()) {
          continue;
        }
        ++compared;
        // The f32 bytes a bf16 job sends at half width.
        int64_t halved = 0;
        if (cuda) {
          halved = a.comm_bytes_per_step();
        } else if (a.zero_stage() > 0) {
          halved = a.comm_bytes_per_step() - reduce_scatter;  // the all-gathers
        }
        EXPECT_EQ(b.comm_bytes_per_step(), a.comm_bytes_per_step() - halved / 2)
            << (cuda ? "cuda" : "cpu") << " stage " << a.zero_stage();
      }
    }
    EXPECT_EQ(compared, 4 * 3) << "every stage at every checkpointing policy";
  }
}

TEST(ShardingPlannerTest, WithPlanWritesOnlyUnpinnedFields) {
  zerotrain::ShardingPlan plan;
  plan.mutable_chosen()->set_zero_stage(3);
  plan.mutable_chosen()->set_activation_checkpointing(Ckpt::FULL);

  const zerotrain::JobSpec open = WithPlan(PlannerInput(ParsedTinyJob()), plan);
  EXPECT_EQ(open.parallel().zero_stage(), 3);
  EXPECT_EQ(open.memory().activation_checkpointing(), Ckpt::FULL);

  zerotrain::JobSpec parsed = ParsedTinyJob();
  parsed.mutable_parallel()->set_zero_stage(0);
  const zerotrain::JobSpec stage_kept = WithPlan(PlannerInput(parsed), plan);
  EXPECT_EQ(stage_kept.parallel().zero_stage(), 0);
  EXPECT_EQ(stage_kept.memory().activation_checkpointing(), Ckpt::FULL);

  parsed = ParsedTinyJob();
  parsed.mutable_memory()->set_activation_checkpointing(Ckpt::SELECTIVE);
  const zerotrain::JobSpec policy_kept = WithPlan(PlannerInput(parsed), plan);
  EXPECT_EQ(policy_kept.parallel().zero_stage(), 3);
  EXPECT_EQ(policy_kept.memory().activation_checkpointing(), Ckpt::SELECTIVE);
}

TEST(ShardingPlannerTest, RefusesDeviceSizesAndMarginsOutsideTheirRange) {
  const zerotrain::JobSpec job = PlannerInput(ParsedTinyJob());
  const absl::StatusOr<zerotrain::ShardingPlan> zero = PlanSharding(job, {});
  ASSERT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(zero.status().message().find("device_memory_bytes"), std::string::npos);
  const absl::StatusOr<zerotrain::ShardingPlan> margin =
      PlanSharding(job, {.device_memory_bytes = kHuge, .safety_margin = 1.0});
  ASSERT_EQ(margin.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(margin.status().message().find("safety_margin"), std::string::npos);
}

}  // namespace
}  // namespace zt
