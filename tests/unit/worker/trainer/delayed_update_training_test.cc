// ZeRO-Offload's one-step delayed parameter update (offload.delayed_update,
// worker/optim/delayed_host_step.h) on CPU ranks, against a serial reference of its recurrence.
//
// The reference is a run without offload whose step loop is driven by hand: before a step whose
// predecessor's update would still be running under the delayed update, the test writes the
// parameters from before that update back into the device's parameter buffers, and once the
// step's last backward has ended (the trainer's on_backward_ended probe) it puts the current
// ones back, so the device optimizer applies the gradient of the stale parameters to the
// current ones: p_{t+1} = Opt(p_t, g(p_{t-1})). CPU offload is bit for bit the device optimizer
// (offload_training_test.cc), so the delayed run must equal the reference bit for bit.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/worker/trainer/offload_runs.h"
#include "tests/unit/worker/trainer/rank_threads.h"
#include "tests/unit/worker/trainer/test_swap_store.h"

namespace zt {
namespace {

using offload_testing::OffloadRunTest;
using offload_testing::RunResult;
using zerotrain::JobSpec;
using zerotrain::OffloadConfig;
using zerotrain::OptimizerConfig;
using zerotrain::PrecisionConfig;

constexpr int64_t kSteps = 8;
constexpr int kAfterSteps = 2;

// The rank's parameter buffers the forward reads: every "<unit>.params" of the plan (whole
// units at ZeRO 1-2, the rank's shard at 3, which the gathers read).
std::vector<Tensor> ParamBuffers(const Trainer& t) {
  std::vector<Tensor> out;
  for (const BufferSpec& b : t.plan().buffers) {
    if (b.category == MemoryCategory::kParameters && b.name.ends_with(".params")) {
      absl::StatusOr<Tensor> v = t.arenas().Get(b.name);
      if (v.ok()) out.push_back(*v);
    }
  }
  return out;
}

using Snapshot = std::vector<std::vector<uint8_t>>;

Snapshot Take(const std::vector<Tensor>& buffers) {
  Snapshot s;
  for (const Tensor& t : buffers) {
    const auto* p = static_cast<const uint8_t*>(t.raw());
    s.emplace_back(p, p + t.size_bytes());
  }
  return s;
}

void Put(const std::vector<Tensor>& buffers, const Snapshot& s) {
  for (size_t i = 0; i < buffers.size(); ++i)
    std::memcpy(buffers[i].raw(), s[i].data(), s[i].size());
}

// What the overlap probes saw on one rank.
struct Overlap {
  std::mutex mu;
  std::condition_variable cv;
  int64_t backward_ended = 0;   // the last step whose backward has ended
  int64_t host_started = 0;     // the last host step that started
  int64_t gates_passed = 0;     // host steps that waited for the next backward's end
  int64_t gates_timed_out = 0;  // ... and never saw it: the step was not overlapped
  // Per step s: the host steps the trainer had launched when step s's backward ended.
  std::map<int64_t, int64_t> launched_at_backward_end;
};

struct SteppedRun {
  absl::Status status;
  std::vector<double> losses;                     // rank 0's, per step
  std::vector<std::vector<float>> weights;        // FullWeights at the end
  int64_t delayed_host_steps = 0;                 // rank 0's launches beside the next step
  std::vector<std::unique_ptr<Overlap>> overlap;  // per rank, with `gate`
};

// Trains `spec` for kSteps by hand (Trainer::Step) on every rank. `stale_reference`: the
// serial reference above, for a job without offload, the delayed update starting after
// `kAfterSteps`; the last step drains (max_steps), and so does every multiple of `drain_every`
// (> 0: a checkpoint's steps), after which the next step computes on fresh parameters. `gate`:
// each host step t < kSteps holds its thread until step t+1's backward has ended (which only an
// overlapped run reaches).
SteppedRun TrainByHand(const JobSpec& spec, bool stale_reference, bool gate,
                       int64_t drain_every = 0) {
  SteppedRun run;
  absl::StatusOr<JobSpec> validated = ValidatedJob(spec);
  if (!validated.ok()) {
    run.status = validated.status();
    return run;
  }
  const JobSpec job = *validated;
  const int n = job.parallel().world_size();
  for (int r = 0; r < n; ++r) run.overlap.push_back(std::make_unique<Overlap>());
  InProcessStore store;
  // offload.optimizer NVME: the node's one swap store, shared by the ranks.
  absl::StatusOr<std::shared_ptr<offload::SwapStore>> swap = testing::OpenTestSwapStore(job);
  if (!swap.ok()) {
    run.status = swap.status();
    return run;
  }
  run.status = testing::RunRankThreads(n, [&](int r) -> absl::Status {
    Overlap& o = *run.overlap[r];
    // The reference's restore once the backward has ended (null: nothing to restore).
    const Snapshot* restore = nullptr;
    std::vector<Tensor> params;
    const Trainer* trainer = nullptr;
    TrainOptions options;
    options.rank = r;
    options.store = &store;
    options.swap_store = swap->get();
    options.on_backward_ended = [&](int64_t step) {
      if (restore != nullptr) Put(params, *restore);
      std::lock_guard<std::mutex> lock(o.mu);
      o.backward_ended = step;
      o.launched_at_backward_end[step] = trainer->delayed_host_steps();
      o.cv.notify_all();
    };
    if (gate) {
      options.on_host_step_start = [&](int64_t step) {
        std::unique_lock<std::mutex> lock(o.mu);
        o.host_started = step;
        if (step >= kSteps) return;  // the last step drains at once
        // Generous: a step of this model takes milliseconds; a serial run never gets there.
        if (o.cv.wait_for(lock, std::chrono::seconds(30),
                          [&] { return o.backward_ended >= step + 1; })) {
          ++o.gates_passed;
        } else {
          ++o.gates_timed_out;
        }
      };
    }
    absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(job, options);
    if (!t.ok()) return t.status();
    params = ParamBuffers(**t);
    trainer = t->get();
    Snapshot before_previous_update;
    for (int64_t s = 1; s <= kSteps; ++s) {
      Snapshot current = Take(params);
      // Under the delayed update, step s computes on the parameters from before step s-1's
      // update when step s-1's host step was launched beside it: s-1 past the warm-up, and
      // s-1 not a step that drained.
      const bool drained = drain_every > 0 && (s - 1) % drain_every == 0;
      const bool stale = stale_reference && s - 1 > kAfterSteps && !drained;
      if (stale) {
        Put(params, before_previous_update);
        restore = &current;
      }
      absl::StatusOr<StepRecord> rec = (*t)->Step();
      restore = nullptr;
      if (!rec.ok()) return rec.status();
      if (r == 0) run.losses.push_back(rec->loss);
      before_previous_update = std::move(current);
    }
    absl::StatusOr<std::vector<std::vector<float>>> w = (*t)->FullWeights();
    if (!w.ok()) return w.status();
    if (r == 0) {
      run.weights = std::move(*w);
      run.delayed_host_steps = (*t)->delayed_host_steps();
    }
    return absl::OkStatus();
  });
  return run;
}

class DelayedUpdateTest : public OffloadRunTest {
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

  // Stopped at the checkpoint of step 4 and resumed, `job` equals its run that never stopped.
  void ExpectResumesBitForBit(const JobSpec& job, const std::string& what);

  // `accum` micro-batches a step (the same 4 sequences a step in all): at ZeRO 2-3 the
  // gradients then accumulate whole and are reduced once, on the last.
  void ExpectTheStaleRecurrence(int world, int stage, OptimizerConfig::Type type,
                                PrecisionConfig::DType dtype, int accum = 1,
                                OffloadConfig::Device params = OffloadConfig::NONE,
                                OffloadConfig::Device optimizer = OffloadConfig::CPU) {
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
    const SteppedRun delayed =
        TrainByHand(accumulating(Delayed(world, stage, type, dtype, true, params, optimizer)),
                    false, false);
    const SteppedRun reference =
        TrainByHand(accumulating(Reference(world, stage, type, dtype)), true, false);
    ASSERT_TRUE(delayed.status.ok()) << what << ": " << delayed.status;
    ASSERT_TRUE(reference.status.ok()) << what << ": " << reference.status;
    ASSERT_EQ(delayed.losses.size(), static_cast<size_t>(kSteps)) << what;
    EXPECT_EQ(delayed.losses, reference.losses) << what;
    EXPECT_EQ(delayed.weights, reference.weights) << what;
    // Steps 3..7 overlapped the next step; step 8 drained (its launch counts too).
    EXPECT_EQ(delayed.delayed_host_steps, kSteps - kAfterSteps) << what;
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
  // Adafactor on one rank (a sharded one is refused: its statistics' collective).
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

// Before the switch the delayed run is the serial offload run; after it, it is not (so a
// delayed update silently off would fail here and the reference test above both).
TEST_F(DelayedUpdateTest, SerialUntilAfterStepsThenDifferent) {
  const SteppedRun delayed =
      TrainByHand(Delayed(2, 2, OptimizerConfig::ADAMW, PrecisionConfig::FP32), false, false);
  const SteppedRun serial =
      TrainByHand(Delayed(2, 2, OptimizerConfig::ADAMW, PrecisionConfig::FP32, /*enabled=*/false),
                  false, false);
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
  // with the optimizer on NVMe, whose delayed thread swaps the states meanwhile.
  for (int variant = 1; variant <= 5; ++variant) {
    const int stage = variant == 5 ? 2 : std::min(variant, 3);
    const SteppedRun run = TrainByHand(
        Delayed(2, stage, OptimizerConfig::ADAMW, PrecisionConfig::FP32, true,
                variant == 4 ? OffloadConfig::CPU : OffloadConfig::NONE,
                variant == 5 ? OffloadConfig::NVME : OffloadConfig::CPU),
        false, /*gate=*/true);
    ASSERT_TRUE(run.status.ok()) << run.status;
    // Held until the next backward has written its gradients and copied them down, each host
    // step still read its own step's (the other bank): the run is the reference's.
    const SteppedRun reference = TrainByHand(
        Reference(2, stage, OptimizerConfig::ADAMW, PrecisionConfig::FP32), true, false);
    ASSERT_TRUE(reference.status.ok()) << reference.status;
    EXPECT_EQ(run.losses, reference.losses) << "stage " << stage;
    EXPECT_EQ(run.weights, reference.weights) << "stage " << stage;
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
  const SteppedRun drained = TrainByHand(reference_job, true, false, /*drain_every=*/4);
  const SteppedRun undrained = TrainByHand(reference_job, true, false);
  ASSERT_TRUE(drained.status.ok()) << drained.status;
  ASSERT_TRUE(undrained.status.ok()) << undrained.status;
  const std::vector<std::pair<OffloadConfig::Device, OffloadConfig::Device>> variants = {
      {OffloadConfig::NONE, OffloadConfig::CPU},
      {OffloadConfig::CPU, OffloadConfig::CPU},
      {OffloadConfig::NONE, OffloadConfig::NVME}};
  for (const auto& [params, optimizer] : variants) {
    const std::string what = absl::StrCat("params ", OffloadConfig::Device_Name(params),
                                          ", optimizer ", OffloadConfig::Device_Name(optimizer));
    JobSpec job =
        Delayed(2, 3, OptimizerConfig::ADAMW, PrecisionConfig::FP32, true, params, optimizer);
    job.mutable_checkpoint()->set_dir((dir_ / "unused").string());
    job.mutable_checkpoint()->set_interval_steps(4);
    const SteppedRun delayed = TrainByHand(job, false, false);
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

TEST_F(DelayedUpdateTest, ParamsOnTheHostResumeFromACheckpointBitForBit) {
  ExpectResumesBitForBit(Delayed(2, 3, OptimizerConfig::ADAMW, PrecisionConfig::BF16, true,
                                 OffloadConfig::CPU),
                         "ZeRO 3, params CPU");
}

void DelayedUpdateTest::ExpectResumesBitForBit(const JobSpec& job, const std::string& what) {
  SCOPED_TRACE(what);
  const auto with_dir = [&](const std::string& name) {
    JobSpec j = job;
    // One test may resume several jobs: each its own directories.
    j.mutable_checkpoint()->set_dir(
        (dir_ / absl::StrCat(name, "-", std::hash<std::string>{}(what))).string());
    j.mutable_checkpoint()->set_interval_steps(4);
    return j;
  };
  const RunResult straight = Train(with_dir("straight"), kSteps);
  ASSERT_TRUE(straight.status.ok()) << straight.status;
  const JobSpec stopped = with_dir("stopped");
  ASSERT_TRUE(Train(stopped, 4).status.ok());
  const RunResult second = Train(stopped, kSteps, stopped.checkpoint().dir());
  ASSERT_TRUE(second.status.ok()) << second.status;
  ASSERT_EQ(second.losses.size(), 4u);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(second.losses[s], straight.losses[4 + s]) << s + 5;
  EXPECT_EQ(second.weights, straight.weights);
  EXPECT_EQ(second.state, straight.state);
  // And the run is the delayed one: without the delayed update step 6 differs.
  JobSpec serial_job = with_dir("serial");
  serial_job.mutable_offload()->mutable_delayed_update()->set_enabled(false);
  const RunResult serial = Train(serial_job, kSteps);
  ASSERT_TRUE(serial.status.ok()) << serial.status;
  EXPECT_NE(serial.losses, straight.losses);
}

}  // namespace
}  // namespace zt
