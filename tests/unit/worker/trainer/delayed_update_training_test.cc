// ZeRO-Offload's one-step delayed parameter update (offload.delayed_update,
// worker/optim/delayed_host_step.h) on CPU ranks, against a serial reference of its recurrence
// (delayed_update_runs.h says how the reference is driven). Tensor and pipeline parallelism,
// sharded Adafactor and LoRA: delayed_update_parallel_test.cc.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/worker/trainer/delayed_update_runs.h"

namespace zt {
namespace {

using offload_testing::RunResult;
using zerotrain::JobSpec;
using zerotrain::OffloadConfig;
using zerotrain::OptimizerConfig;
using zerotrain::PrecisionConfig;

using delayed_update_testing::DelayedUpdateRunTest;
using delayed_update_testing::Hold;
using delayed_update_testing::kAfterSteps;
using delayed_update_testing::kSteps;
using delayed_update_testing::Overlap;
using delayed_update_testing::SteppedRun;
using delayed_update_testing::TrainByHand;

class DelayedUpdateTest : public DelayedUpdateRunTest {
 protected:
  // `params`: offload.params (stage 3), whose host shards the host step must leave alone
  // until the next backward has ended.
  // `optimizer`: offload.optimizer, CPU or NVME (the states streamed through the swap store on
  // the delayed thread).
  JobSpec Delayed(int world, int stage, OptimizerConfig::Type type, PrecisionConfig::DType dtype,
                  bool enabled = true, OffloadConfig::Device params = OffloadConfig::NONE,
                  OffloadConfig::Device optimizer = OffloadConfig::CPU) {
    JobSpec job = Job(world, stage, type, dtype, optimizer, params);
    job.mutable_train()->set_max_steps(kSteps);
    job.mutable_offload()->mutable_delayed_update()->set_enabled(enabled);
    job.mutable_offload()->mutable_delayed_update()->set_after_steps(kAfterSteps);
    return job;
  }
  JobSpec Reference(int world, int stage, OptimizerConfig::Type type,
                    PrecisionConfig::DType dtype) {
    JobSpec job = Job(world, stage, type, dtype, OffloadConfig::NONE);
    job.mutable_train()->set_max_steps(kSteps);
    return job;
  }

  // `accum` micro-batches a step (the same 4 sequences a step in all): at ZeRO 2-3 the
  // gradients then accumulate whole and are reduced once, on the last. `hold`: what the
  // delayed run holds back (TrainByHand).
  void ExpectTheStaleRecurrence(int world, int stage, OptimizerConfig::Type type,
                                PrecisionConfig::DType dtype, int accum = 1,
                                OffloadConfig::Device params = OffloadConfig::NONE,
                                OffloadConfig::Device optimizer = OffloadConfig::CPU,
                                Hold hold = Hold::kNothing) {
    const std::string what =
        absl::StrCat(world, " ranks, ZeRO ", stage, ", ", OptimizerConfig::Type_Name(type), ", ",
                     PrecisionConfig::DType_Name(dtype), ", ", accum, " micro-batches, params ",
                     OffloadConfig::Device_Name(params), ", optimizer ",
                     OffloadConfig::Device_Name(optimizer));
    const auto accumulating = [&](JobSpec job) {
      job.mutable_train()->set_micro_batch_size(4 / world / accum);
      job.mutable_train()->set_grad_accum_steps(accum);
      return job;
    };
    const SteppedRun delayed = TrainByHand(
        accumulating(Delayed(world, stage, type, dtype, true, params, optimizer)), false, hold);
    const SteppedRun reference =
        TrainByHand(accumulating(Reference(world, stage, type, dtype)), true, Hold::kNothing);
    delayed_update_testing::ExpectTheReferenceRun(delayed, reference, what);
    if (::testing::Test::HasFatalFailure()) return;
    if (hold == Hold::kNextStepUntilHostStep) {
      for (size_t r = 0; r < delayed.overlap.size(); ++r) {
        // Steps 4..8 each waited for host step 3..7 to return.
        EXPECT_EQ(delayed.overlap[r]->gates_passed, kSteps - kAfterSteps - 1) << what;
        EXPECT_EQ(delayed.overlap[r]->gates_timed_out, 0) << what;
      }
    }
  }
};

TEST_F(DelayedUpdateTest, EqualsTheSerialStaleParameterReferenceAtEveryStage) {
  for (int stage = 1; stage <= 3; ++stage) {
    ExpectTheStaleRecurrence(2, stage, OptimizerConfig::ADAMW, PrecisionConfig::FP32);
  }
}

TEST_F(DelayedUpdateTest, EqualsTheReferenceInBf16AndWithEveryOptimizer) {
  // bf16: master weights on the host, 16-bit parameters uploaded; stochastic rounding's seed is
  // the step's own.
  ExpectTheStaleRecurrence(2, 2, OptimizerConfig::ADAMW, PrecisionConfig::BF16);
  ExpectTheStaleRecurrence(2, 3, OptimizerConfig::ADAMW_8BIT, PrecisionConfig::BF16);
  ExpectTheStaleRecurrence(2, 1, OptimizerConfig::ADAMW_8BIT, PrecisionConfig::FP32);
  // Adafactor on one rank (sharded: delayed_update_parallel_test.cc).
  ExpectTheStaleRecurrence(1, 1, OptimizerConfig::ADAFACTOR, PrecisionConfig::FP32);
  ExpectTheStaleRecurrence(1, 2, OptimizerConfig::ADAFACTOR, PrecisionConfig::BF16);
}

TEST_F(DelayedUpdateTest, EqualsTheReferenceWithGradientAccumulation) {
  for (int stage = 1; stage <= 3; ++stage) {
    ExpectTheStaleRecurrence(2, stage, OptimizerConfig::ADAMW, PrecisionConfig::BF16, 2);
  }
}

// offload.params CPU: the gathers read the rank's host shards, which the host step must not
// write while the next step's forward and backward gather them. It writes the second bank
// ("<unit>.params.host") and the shards take it once the backward has ended: the stale
// recurrence bit for bit, with 1 and 2 micro-batches (the first gathers of each pass upload
// ahead, ShardingEngine::ReadFirstGathersAhead), fp32 and bf16 with 8-bit AdamW.
TEST_F(DelayedUpdateTest, ParamsOnTheHostEqualTheStaleReference) {
  ExpectTheStaleRecurrence(2, 3, OptimizerConfig::ADAMW, PrecisionConfig::FP32, 1,
                           OffloadConfig::CPU);
  ExpectTheStaleRecurrence(2, 3, OptimizerConfig::ADAMW, PrecisionConfig::FP32, 2,
                           OffloadConfig::CPU);
  ExpectTheStaleRecurrence(2, 3, OptimizerConfig::ADAMW_8BIT, PrecisionConfig::BF16, 1,
                           OffloadConfig::CPU);
}

// offload.optimizer NVME: the delayed thread takes its step's gradients from the drained bank
// of host copies (the plan's two banks, as with CPU; the serial NVMe step stages them through
// the ring instead) and streams each unit's master weights and states through the swap store,
// committing the step's generation there. The stale recurrence bit for bit at ZeRO 1-3, with
// 2 micro-batches, in bf16 with 8-bit AdamW, and at 3 with the parameter shards on the host.
TEST_F(DelayedUpdateTest, NvmeOptimizerEqualsTheStaleReferenceAtEveryStage) {
  for (int stage = 1; stage <= 3; ++stage) {
    ExpectTheStaleRecurrence(2, stage, OptimizerConfig::ADAMW, PrecisionConfig::FP32, 1,
                             OffloadConfig::NONE, OffloadConfig::NVME);
  }
  ExpectTheStaleRecurrence(2, 2, OptimizerConfig::ADAMW, PrecisionConfig::FP32, 2,
                           OffloadConfig::NONE, OffloadConfig::NVME);
  ExpectTheStaleRecurrence(2, 3, OptimizerConfig::ADAMW_8BIT, PrecisionConfig::BF16, 1,
                           OffloadConfig::NONE, OffloadConfig::NVME);
  ExpectTheStaleRecurrence(2, 3, OptimizerConfig::ADAMW, PrecisionConfig::FP32, 1,
                           OffloadConfig::CPU, OffloadConfig::NVME);
}

// offload.params NVME (stage 3, beside offload.optimizer NVME, which it needs): the host step
// updates each unit's swapped shard in the ring with its states and writes it into the store's
// next generation, which stays staged while the next step's gathers read the committed one (the
// parameters from before the update); the switch commits it once that step's backward has
// ended. The stale recurrence bit for bit in fp32 and bf16, AdamW and 8-bit AdamW, with 1 and 2
// micro-batches.
TEST_F(DelayedUpdateTest, ParamsOnNvmeEqualTheStaleReference) {
  ExpectTheStaleRecurrence(2, 3, OptimizerConfig::ADAMW, PrecisionConfig::FP32, 1,
                           OffloadConfig::NVME, OffloadConfig::NVME);
  ExpectTheStaleRecurrence(2, 3, OptimizerConfig::ADAMW, PrecisionConfig::FP32, 2,
                           OffloadConfig::NVME, OffloadConfig::NVME);
  ExpectTheStaleRecurrence(2, 3, OptimizerConfig::ADAMW, PrecisionConfig::BF16, 2,
                           OffloadConfig::NVME, OffloadConfig::NVME);
  ExpectTheStaleRecurrence(2, 3, OptimizerConfig::ADAMW_8BIT, PrecisionConfig::BF16, 1,
                           OffloadConfig::NVME, OffloadConfig::NVME);
}

// The other order of the two threads: each step waits, before its forward, until the previous
// step's host step has returned, so the next generation (shards and states) is wholly written
// in the store before the step's first gather reads. Those gathers must still read the
// committed generation, the parameters from before that update: a gather that saw the new
// shards would make the run the serial one, not the reference's.
TEST_F(DelayedUpdateTest, ParamsOnNvmeGathersReadTheCommittedGenerationWhileTheNextIsWritten) {
  ExpectTheStaleRecurrence(2, 3, OptimizerConfig::ADAMW, PrecisionConfig::FP32, 1,
                           OffloadConfig::NVME, OffloadConfig::NVME, Hold::kNextStepUntilHostStep);
  ExpectTheStaleRecurrence(2, 3, OptimizerConfig::ADAMW, PrecisionConfig::BF16, 2,
                           OffloadConfig::NVME, OffloadConfig::NVME, Hold::kNextStepUntilHostStep);
}

// Before the switch the delayed run is the serial offload run; after it, it is not (so a
// delayed update silently off would fail here and the reference test above both).
TEST_F(DelayedUpdateTest, SerialUntilAfterStepsThenDifferent) {
  const SteppedRun delayed = TrainByHand(
      Delayed(2, 2, OptimizerConfig::ADAMW, PrecisionConfig::FP32), false, Hold::kNothing);
  const SteppedRun serial =
      TrainByHand(Delayed(2, 2, OptimizerConfig::ADAMW, PrecisionConfig::FP32, /*enabled=*/false),
                  false, Hold::kNothing);
  ASSERT_TRUE(delayed.status.ok()) << delayed.status;
  ASSERT_TRUE(serial.status.ok()) << serial.status;
  EXPECT_EQ(serial.delayed_host_steps, 0);
  // Steps 1..after_steps + 1 compute on the same parameters: step after_steps + 1 is the first
  // whose host step is delayed, and it still computed on fresh ones.
  for (int s = 0; s <= kAfterSteps; ++s) {
    EXPECT_EQ(delayed.losses[s], serial.losses[s]) << "step " << s + 1;
  }
  EXPECT_NE(delayed.losses[kAfterSteps + 1], serial.losses[kAfterSteps + 1])
      << "step " << kAfterSteps + 2 << " computes on parameters one update stale";
  EXPECT_NE(delayed.weights, serial.weights);
}

// The overlap is real: every host step t but the last holds its thread until step t+1's
// backward has ended, which a run that waited for host step t before step t+1 could never
// reach; each such backward ended with host step t already started.
TEST_F(DelayedUpdateTest, TheHostStepRunsBesideTheNextStepsForwardAndBackward) {
  // Variant 4: stage 3 with the parameter shards on the host (offload.params CPU); 5: stage 2
  // with the optimizer on NVMe, whose delayed thread swaps the states meanwhile; 6: stage 3
  // with the shards swapped too (offload.params NVME), read by the next step's gathers from
  // the committed generation while the held host step has not written the next.
  for (int variant = 1; variant <= 6; ++variant) {
    const int stage = variant == 5 ? 2 : std::min(variant, 3);
    const OffloadConfig::Device params = variant == 4   ? OffloadConfig::CPU
                                         : variant == 6 ? OffloadConfig::NVME
                                                        : OffloadConfig::NONE;
    const SteppedRun run =
        TrainByHand(Delayed(2, stage, OptimizerConfig::ADAMW, PrecisionConfig::FP32, true, params,
                            variant >= 5 ? OffloadConfig::NVME : OffloadConfig::CPU),
                    false, Hold::kHostStepUntilNextBackward);
    ASSERT_TRUE(run.status.ok()) << run.status;
    // Held until the next backward has written its gradients and copied them down, each host
    // step still read its own step's (the other bank): the run is the reference's.
    const SteppedRun reference = TrainByHand(
        Reference(2, stage, OptimizerConfig::ADAMW, PrecisionConfig::FP32), true, Hold::kNothing);
    ASSERT_TRUE(reference.status.ok()) << reference.status;
    EXPECT_EQ(run.losses, reference.losses) << "variant " << variant;
    EXPECT_EQ(run.weights, reference.weights) << "variant " << variant;
    for (size_t r = 0; r < run.overlap.size(); ++r) {
      const Overlap& o = *run.overlap[r];
      // Host steps 3..7 each waited for backward 4..8 and saw it end.
      EXPECT_EQ(o.gates_passed, kSteps - kAfterSteps - 1) << "stage " << stage << " rank " << r;
      EXPECT_EQ(o.gates_timed_out, 0) << "stage " << stage << " rank " << r;
      EXPECT_EQ(o.host_started, kSteps);
      // Host step t was launched in step t, before step t+1's forward: when backward s
      // ended, host steps 3..s-1 had been launched (none in the serial steps 1..3).
      for (int64_t s = 1; s <= kSteps; ++s) {
        EXPECT_EQ(o.launched_at_backward_end.at(s), std::max<int64_t>(0, s - 1 - kAfterSteps))
            << "stage " << stage << " rank " << r << " step " << s;
      }
    }
  }
}

// A step at which a checkpoint is due drains (Step finishes its host update; Run would then
// save): the step after it computes on fresh parameters, and the overlap starts again. Driven
// by Step alone here (no save), against the reference with the drain at step 4 — and not
// without it, so the drain is what the test sees.
TEST_F(DelayedUpdateTest, ACheckpointStepDrainsAndTheNextStepComputesOnFreshParameters) {
  const JobSpec reference_job = Reference(2, 3, OptimizerConfig::ADAMW, PrecisionConfig::FP32);
  const SteppedRun drained = TrainByHand(reference_job, true, Hold::kNothing, /*drain_every=*/4);
  const SteppedRun undrained = TrainByHand(reference_job, true, Hold::kNothing);
  ASSERT_TRUE(drained.status.ok()) << drained.status;
  ASSERT_TRUE(undrained.status.ok()) << undrained.status;
  const std::vector<std::pair<OffloadConfig::Device, OffloadConfig::Device>> variants = {
      {OffloadConfig::NONE, OffloadConfig::CPU},
      {OffloadConfig::CPU, OffloadConfig::CPU},
      {OffloadConfig::NONE, OffloadConfig::NVME},
      {OffloadConfig::NVME, OffloadConfig::NVME}};
  for (const auto& [params, optimizer] : variants) {
    const std::string what = absl::StrCat("params ", OffloadConfig::Device_Name(params),
                                          ", optimizer ", OffloadConfig::Device_Name(optimizer));
    JobSpec job =
        Delayed(2, 3, OptimizerConfig::ADAMW, PrecisionConfig::FP32, true, params, optimizer);
    job.mutable_checkpoint()->set_dir((dir_ / "unused").string());
    job.mutable_checkpoint()->set_interval_steps(4);
    const SteppedRun delayed = TrainByHand(job, false, Hold::kNothing);
    ASSERT_TRUE(delayed.status.ok()) << what << ": " << delayed.status;
    EXPECT_EQ(delayed.losses, drained.losses) << what;
    EXPECT_EQ(delayed.weights, drained.weights) << what;
    EXPECT_NE(delayed.losses[4], undrained.losses[4])
        << what << ": step 5 computes on step 4's update";
    // Steps 3, 4 (drained at once), 5, 6, 7 and 8 launched a host step.
    EXPECT_EQ(delayed.delayed_host_steps, kSteps - kAfterSteps) << what;
  }
}

// A checkpoint drains: the run stopped at it and resumed equals the run that never stopped,
// bit for bit (both drain at step 4, so step 5 computes on fresh parameters in both).
TEST_F(DelayedUpdateTest, ResumesFromACheckpointBitForBit) {
  ExpectResumesBitForBit(Delayed(2, 2, OptimizerConfig::ADAMW, PrecisionConfig::BF16), "ZeRO 2");
}

// The checkpoint reads the states through the swap store once the drain has committed the
// step's generation, and the resumed run writes them back as its first generation.
TEST_F(DelayedUpdateTest, NvmeOptimizerResumesFromACheckpointBitForBit) {
  ExpectResumesBitForBit(Delayed(2, 2, OptimizerConfig::ADAMW, PrecisionConfig::BF16, true,
                                 OffloadConfig::NONE, OffloadConfig::NVME),
                         "ZeRO 2, optimizer NVME");
  ExpectResumesBitForBit(Delayed(2, 3, OptimizerConfig::ADAMW, PrecisionConfig::FP32, true,
                                 OffloadConfig::CPU, OffloadConfig::NVME),
                         "ZeRO 3, params CPU, optimizer NVME");
}

// The drain commits the generation the host step staged, the checkpoint reads the shards and
// states from it, and the resumed run writes them back as its first generation.
TEST_F(DelayedUpdateTest, ParamsOnNvmeResumeFromACheckpointBitForBit) {
  ExpectResumesBitForBit(Delayed(2, 3, OptimizerConfig::ADAMW, PrecisionConfig::FP32, true,
                                 OffloadConfig::NVME, OffloadConfig::NVME),
                         "ZeRO 3, params NVME, fp32");
  ExpectResumesBitForBit(Delayed(2, 3, OptimizerConfig::ADAMW, PrecisionConfig::BF16, true,
                                 OffloadConfig::NVME, OffloadConfig::NVME),
                         "ZeRO 3, params NVME, bf16");
}

// The arenas are the plan, category by category: with the shards swapped the host step needs
// no "<unit>.params.host" (the plan holds none and nothing asks for one); pinned_host is the
// ring and the two banks of gradient copies, the device the gather buffers and what the
// compute uses, nvme nothing of the arenas.
TEST_F(DelayedUpdateTest, ParamsOnNvmeArenasAreThePlan) {
  const JobSpec spec = Delayed(2, 3, OptimizerConfig::ADAMW, PrecisionConfig::BF16, true,
                               OffloadConfig::NVME, OffloadConfig::NVME);
  std::vector<offload_testing::CountedRank> counted(2);
  const RunResult run = Train(spec, kSteps, "", &counted);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_TRUE(run.unclaimed.empty()) << run.unclaimed[0];
  const JobSpec job = ValidatedJob(spec).value();
  for (int r = 0; r < 2; ++r) {
    const MemoryPlan& plan = run.plans[r];
    int64_t banks = 0;
    for (const BufferSpec& b : plan.buffers) {
      EXPECT_FALSE(b.name.ends_with(".params.host")) << b.name;
      if (b.name.ends_with(".grads.host") || b.name.ends_with(".grads.host.1")) {
        EXPECT_EQ(b.category, MemoryCategory::kPinnedHost) << b.name;
        banks += AlignedBytes(b.bytes());
      }
    }
    EXPECT_GT(banks, 0);
    EXPECT_EQ(plan.CategoryBytes(MemoryCategory::kPinnedHost),
              job.offload().buffer_count() * job.offload().buffer_size() + banks)
        << "rank " << r << ": the ring and the two gradient banks";
    for (int c = 0; c < kMemoryCategoryCount; ++c) {
      const auto category = static_cast<MemoryCategory>(c);
      EXPECT_EQ(run.arena_bytes[r][c],
                category == MemoryCategory::kNvme ? 0 : plan.CategoryBytes(category))
          << "rank " << r << " " << MemoryCategoryName(category);
      EXPECT_EQ(counted[r].device_bytes[c],
                IsDeviceCategory(category) ? plan.CategoryBytes(category) : 0)
          << "rank " << r << " " << MemoryCategoryName(category);
    }
  }
}

TEST_F(DelayedUpdateTest, ParamsOnTheHostResumeFromACheckpointBitForBit) {
  ExpectResumesBitForBit(Delayed(2, 3, OptimizerConfig::ADAMW, PrecisionConfig::BF16, true,
                                 OffloadConfig::CPU),
                         "ZeRO 3, params CPU");
}

}  // namespace
}  // namespace zt
