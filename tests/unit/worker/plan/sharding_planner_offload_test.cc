// The sharding planner's offload (worker/plan/sharding_planner.h): considered only when no
// candidate without it fits, one rung at a time (optimizer to the host, to NVMe, then the
// parameters), the cheapest that fits chosen with its reason, every rejection saying why.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/job/job_loading.h"
#include "worker/model/param_layout.h"
#include "worker/plan/memory_plan.h"
#include "worker/plan/sharding_planner.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using Ckpt = zerotrain::MemoryConfig;
using zerotrain::OffloadConfig;

// Model states outweigh activations (a short sequence, one sequence a micro-batch), so
// offloading them is what makes the job fit: GPT-2, 4 blocks of C = 256, 2 ranks, bf16
// parameters and gradients with fp32 master weights and AdamW, on CPU devices with a budget
// of their own.
zerotrain::JobSpec StatesHeavyJob() {
  zerotrain::JobSpec job;
  job.set_name("states");
  auto* m = job.mutable_model();
  m->set_family(zerotrain::ModelConfig::GPT2);
  m->set_n_layer(4);
  m->set_n_head(4);
  m->set_d_model(256);
  m->set_vocab_size(256);
  m->set_max_seq_len(64);
  job.mutable_data()->add_train("train.bin");
  job.mutable_data()->set_seq_len(16);
  job.mutable_train()->set_micro_batch_size(1);
  job.mutable_train()->set_max_steps(10);
  job.mutable_optimizer()->set_lr(1e-3);
  job.mutable_precision()->set_param_dtype(zerotrain::PrecisionConfig::BF16);
  job.mutable_precision()->set_grad_dtype(zerotrain::PrecisionConfig::BF16);
  job.mutable_parallel()->set_world_size(2);
  job.mutable_resources()->set_cpu_threads(1);
  // Each ring buffer holds a block's fp32 master shard: 789760 / 2 · 4 = 1579520 bytes.
  job.mutable_offload()->set_buffer_size(2 << 20);
  return job;
}

zerotrain::JobSpec PlannerInput(zerotrain::JobSpec parsed) {
  absl::StatusOr<zerotrain::JobSpec> job =
      JobForPlanning(std::move(parsed), {.check_paths = false, .check_engine_support = false});
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? *job : zerotrain::JobSpec();
}

zerotrain::ShardingPlan Plan(const zerotrain::JobSpec& job, const PlannerOptions& options) {
  absl::StatusOr<zerotrain::ShardingPlan> plan = PlanSharding(job, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : zerotrain::ShardingPlan();
}

constexpr int64_t kHuge = int64_t{1} << 50;

// The device bytes of the smallest candidate with this offload: FULL recompute, at the
// stage the offload allows that needs least (stage 3's gather buffers can outweigh what it
// shards on 2 ranks).
int64_t SmallestDevice(zerotrain::JobSpec job, OffloadConfig::Device optimizer,
                       OffloadConfig::Device params) {
  job.mutable_memory()->set_activation_checkpointing(Ckpt::FULL);
  job.mutable_offload()->set_optimizer(optimizer);
  job.mutable_offload()->set_params(params);
  const int lowest = params != OffloadConfig::NONE ? 3 : optimizer != OffloadConfig::NONE ? 1 : 0;
  int64_t smallest = std::numeric_limits<int64_t>::max();
  for (int stage = lowest; stage <= 3; ++stage) {
    job.mutable_parallel()->set_zero_stage(stage);
    smallest = std::min(smallest, PlanMemory(job, 0).DeviceBytes());
  }
  return smallest;
}

bool Offloaded(const zerotrain::PlanCandidate& c) {
  return c.offload_optimizer() != OffloadConfig::NONE || c.offload_params() != OffloadConfig::NONE;
}

TEST(ShardingPlannerOffloadTest, NotConsideredWhileSomethingFitsWithoutIt) {
  zerotrain::JobSpec job = StatesHeavyJob();
  job.mutable_offload()->set_nvme_path("/swap");
  const zerotrain::ShardingPlan plan = Plan(PlannerInput(job), {.device_memory_bytes = kHuge});
  EXPECT_EQ(plan.candidates_size(), 12);
  for (const auto& c : plan.candidates()) EXPECT_FALSE(Offloaded(c));
  EXPECT_EQ(plan.reason(), "the cheapest candidate that fits; no offload needed");
  EXPECT_EQ(plan.chosen().pinned_host_bytes_per_rank(), 0);
}

TEST(ShardingPlannerOffloadTest, OptimizerToTheHostWhenNothingElseFits) {
  const zerotrain::JobSpec parsed = StatesHeavyJob();
  const zerotrain::JobSpec job = PlannerInput(parsed);
  const int64_t none = SmallestDevice(job, OffloadConfig::NONE, OffloadConfig::NONE);
  const int64_t cpu = SmallestDevice(job, OffloadConfig::CPU, OffloadConfig::NONE);
  ASSERT_LT(cpu, none) << "offloading the optimizer must shrink the device's share";
  // A budget of the job's own between the two: the device is that budget (the planner takes
  // the smaller of the job's and the node's), and the pinned pool is outside it.
  zerotrain::JobSpec budgeted = parsed;
  budgeted.mutable_resources()->set_device_memory_bytes((none + cpu) / 2);
  const zerotrain::ShardingPlan plan =
      Plan(PlannerInput(budgeted), {.device_memory_bytes = kHuge, .safety_margin = 0.0});
  EXPECT_EQ(plan.device_memory_bytes(), (none + cpu) / 2);
  const zerotrain::PlanCandidate& chosen = plan.chosen();
  ASSERT_TRUE(chosen.fits()) << plan.reason();
  EXPECT_EQ(chosen.offload_optimizer(), OffloadConfig::CPU);
  EXPECT_EQ(chosen.offload_params(), OffloadConfig::NONE);
  EXPECT_GE(chosen.zero_stage(), 1);
  EXPECT_LE(chosen.peak_bytes_per_rank(), (none + cpu) / 2);
  EXPECT_GT(chosen.pinned_host_bytes_per_rank(), 0);
  EXPECT_EQ(chosen.nvme_bytes_per_rank(), 0);
  EXPECT_THAT(plan.reason(), HasSubstr("no candidate without offload fits (the smallest, stage "));
  EXPECT_THAT(plan.reason(), HasSubstr("offload.optimizer CPU, offload.params NONE is the first "
                                       "offload that fits"));
  // Every candidate without offload is listed as rejected, with its numbers; the next rungs
  // were not needed.
  int without = 0;
  for (const auto& c : plan.candidates()) {
    if (!Offloaded(c)) {
      ++without;
      EXPECT_FALSE(c.fits());
      EXPECT_THAT(c.rejected_because(),
                  HasSubstr(std::to_string(c.peak_bytes_per_rank()) + " bytes) per rank"));
    } else {
      EXPECT_EQ(c.offload_optimizer(), OffloadConfig::CPU);
      EXPECT_EQ(c.offload_params(), OffloadConfig::NONE);
      EXPECT_GE(c.zero_stage(), 1) << "optimizer offload needs a ZeRO stage";
    }
  }
  EXPECT_EQ(without, 12);
  // The reason names the smallest of them.
  const auto smallest = std::min_element(
      plan.candidates().begin(), plan.candidates().end(), [](const auto& a, const auto& b) {
        return std::make_pair(Offloaded(a), a.peak_bytes_per_rank()) <
               std::make_pair(Offloaded(b), b.peak_bytes_per_rank());
      });
  EXPECT_THAT(
      plan.reason(),
      HasSubstr(absl::StrCat(
          "(the smallest, stage ", smallest->zero_stage(), " with ",
          Ckpt::ActivationCheckpointing_Name(smallest->activation_checkpointing()), ", needs")));
  // The chosen is the cheapest that fits.
  for (const auto& c : plan.candidates()) {
    if (c.fits()) EXPECT_GE(c.cost(), chosen.cost());
  }
  // Its transfers: gradient shards down and parameter shards up, 2 + 2 bytes an element.
  const ShardGeometry geometry = ParallelLayout::ForJob(job, 0).shard();
  int64_t shards = 0;
  for (const UnitLayout& u : BuildModelLayout(job.model()).units) {
    shards += ShardOf(u.numel, geometry).shard_numel;
  }
  EXPECT_EQ(chosen.host_transfer_bytes_per_step(), shards * (2 + 2));
  EXPECT_EQ(chosen.nvme_transfer_bytes_per_step(), 0);

  // WithPlan writes the choice into the unpinned offload fields.
  const zerotrain::JobSpec planned = WithPlan(PlannerInput(budgeted), plan);
  EXPECT_EQ(planned.offload().optimizer(), OffloadConfig::CPU);
  EXPECT_EQ(planned.offload().params(), OffloadConfig::NONE);
}

TEST(ShardingPlannerOffloadTest, ParametersFollowWhenTheOptimizerAloneDoesNotFit) {
  zerotrain::JobSpec parsed = StatesHeavyJob();  // no nvme_path: NVMe rungs are refused
  const zerotrain::JobSpec job = PlannerInput(parsed);
  const int64_t cpu = SmallestDevice(job, OffloadConfig::CPU, OffloadConfig::NONE);
  const int64_t both = SmallestDevice(job, OffloadConfig::CPU, OffloadConfig::CPU);
  ASSERT_LT(both, cpu);
  parsed.mutable_resources()->set_device_memory_bytes((cpu + both) / 2);
  const zerotrain::ShardingPlan plan =
      Plan(PlannerInput(parsed), {.device_memory_bytes = kHuge, .safety_margin = 0.0});
  ASSERT_TRUE(plan.chosen().fits()) << plan.reason();
  EXPECT_EQ(plan.chosen().offload_optimizer(), OffloadConfig::CPU);
  EXPECT_EQ(plan.chosen().offload_params(), OffloadConfig::CPU);
  EXPECT_EQ(plan.chosen().zero_stage(), 3);
  bool saw_nvme = false;
  for (const auto& c : plan.candidates()) {
    if (c.offload_optimizer() != OffloadConfig::NVME) continue;
    saw_nvme = true;
    EXPECT_FALSE(c.fits());
    EXPECT_THAT(c.rejected_because(),
                HasSubstr("offloading to NVME needs offload.nvme_path, which the job does not "
                          "set"));
  }
  EXPECT_TRUE(saw_nvme) << "the NVMe rung is tried before the parameters";
}

TEST(ShardingPlannerOffloadTest, AHostTooSmallForTheStatesSendsThemToNvme) {
  zerotrain::JobSpec parsed = StatesHeavyJob();
  parsed.mutable_offload()->set_nvme_path("/swap");
  const zerotrain::JobSpec job = PlannerInput(parsed);
  const int64_t none = SmallestDevice(job, OffloadConfig::NONE, OffloadConfig::NONE);
  const int64_t cpu = SmallestDevice(job, OffloadConfig::CPU, OffloadConfig::NONE);
  parsed.mutable_resources()->set_device_memory_bytes((none + cpu) / 2);
  // The gradient shards' host copies: what the host step reads at any stage ≥ 1 (each unit's
  // shard, whatever the stage), planned beside the ring.
  zerotrain::JobSpec nvme_job = job;
  nvme_job.mutable_offload()->set_optimizer(OffloadConfig::NVME);
  nvme_job.mutable_parallel()->set_zero_stage(1);
  int64_t host_grads = 0;
  for (const BufferSpec& b : PlanMemory(nvme_job).buffers) {
    if (b.name.ends_with(".grads.host")) host_grads += b.bytes();
  }
  EXPECT_GT(host_grads, 0);
  // Room for the ring (4 buffers of 2 MiB) and the gradients but not for the states beside
  // them.
  const PlannerOptions options{.device_memory_bytes = kHuge,
                               .safety_margin = 0.0,
                               .host_memory_bytes = (9 << 20) + host_grads};
  const zerotrain::ShardingPlan plan = Plan(PlannerInput(parsed), options);
  ASSERT_TRUE(plan.chosen().fits()) << plan.reason();
  EXPECT_EQ(plan.chosen().offload_optimizer(), OffloadConfig::NVME);
  EXPECT_GT(plan.chosen().nvme_bytes_per_rank(), 0);
  EXPECT_GT(plan.chosen().nvme_transfer_bytes_per_step(), 0);
  EXPECT_EQ(plan.chosen().pinned_host_bytes_per_rank(), 4 * (2 << 20) + host_grads);
  for (const auto& c : plan.candidates()) {
    if (c.offload_optimizer() != OffloadConfig::CPU) continue;
    EXPECT_THAT(c.rejected_because(), HasSubstr("of pinned host memory per rank, hosts have"));
  }
}

TEST(ShardingPlannerOffloadTest, ARingTooSmallForAUnitsShardIsRejected) {
  zerotrain::JobSpec parsed = StatesHeavyJob();
  parsed.mutable_parallel()->set_zero_stage(1);
  parsed.mutable_offload()->set_optimizer(OffloadConfig::CPU);
  parsed.mutable_offload()->set_buffer_size(4096);
  const zerotrain::JobSpec job = PlannerInput(parsed);
  zerotrain::JobSpec concrete = job;
  concrete.mutable_memory()->set_activation_checkpointing(Ckpt::NONE);
  concrete.mutable_offload()->set_params(OffloadConfig::NONE);
  const int64_t transfer = LargestOffloadTransferBytes(concrete, 0);
  const zerotrain::ShardingPlan plan = Plan(job, {.device_memory_bytes = kHuge});
  EXPECT_FALSE(plan.chosen().fits());
  EXPECT_THAT(plan.chosen().rejected_because(),
              HasSubstr("offload.buffer_size 4096 is smaller than its largest transfer, " +
                        std::to_string(transfer) + " bytes"));
  EXPECT_THAT(plan.reason(), HasSubstr("nothing fits, offload included"));
}

TEST(ShardingPlannerOffloadTest, APinnedOffloadIsTheOnlyRungAndLimitsTheStages) {
  zerotrain::JobSpec parsed = StatesHeavyJob();
  parsed.mutable_offload()->set_params(OffloadConfig::NVME);
  parsed.mutable_offload()->set_nvme_path("/swap");
  // The stage is left to the planner: validation checks it at the lowest that allows the
  // offload (3), and only stage 3 is planned.
  const zerotrain::JobSpec job = PlannerInput(parsed);
  EXPECT_FALSE(job.parallel().has_zero_stage());
  EXPECT_EQ(job.offload().params(), OffloadConfig::NVME);
  EXPECT_EQ(job.offload().optimizer(), OffloadConfig::DEVICE_UNSPECIFIED);
  const zerotrain::ShardingPlan plan = Plan(job, {.device_memory_bytes = kHuge});
  ASSERT_TRUE(plan.chosen().fits()) << plan.reason();
  for (const auto& c : plan.candidates()) {
    EXPECT_EQ(c.zero_stage(), 3);
    EXPECT_EQ(c.offload_params(), OffloadConfig::NVME);
  }
  // The ladder's only rung with parameters on NVMe keeps the optimizer there too.
  EXPECT_EQ(plan.chosen().offload_optimizer(), OffloadConfig::NVME);
  EXPECT_EQ(plan.candidates_size(), 3);
  EXPECT_THAT(plan.pinned(), ::testing::Contains("offload.params"));
  EXPECT_THAT(plan.reason(), HasSubstr("the job pins its offload"));

  // A stage that forbids the pinned offload is refused at validation, naming both.
  parsed.mutable_parallel()->set_zero_stage(2);
  absl::StatusOr<zerotrain::JobSpec> refused =
      JobForPlanning(parsed, {.check_paths = false, .check_engine_support = false});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("offload.params: NVME needs parallel.zero_stage 3 (got 2)"));
}

}  // namespace
}  // namespace zt
