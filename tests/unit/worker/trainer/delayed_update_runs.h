// The harness of the delayed parameter update's tests (offload.delayed_update,
// worker/optim/delayed_host_step.h; delayed_update_training_test.cc, delayed_update_parallel_
// test.cc): a run driven step by step on every rank (TrainByHand), optionally as the serial
// "stale-parameter reference" of the delayed recurrence, with probes of the overlap; and the
// stop-and-resume comparison.
//
// The reference is a run without offload whose step loop is driven by hand: before a step whose
// predecessor's update would still be running under the delayed update, the harness writes the
// parameters from before that update back into the device's parameter buffers, and once the
// step's last backward has ended (the trainer's on_backward_ended probe) it puts the current
// ones back, so the device optimizer applies the gradient of the stale parameters to the
// current ones: p_{t+1} = Opt(p_t, g(p_{t-1})). CPU offload is bit for bit the device optimizer
// (offload_training_test.cc), so the delayed run must equal the reference bit for bit.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/worker/trainer/offload_runs.h"
#include "tests/unit/worker/trainer/rank_threads.h"
#include "tests/unit/worker/trainer/test_swap_store.h"

namespace zt::delayed_update_testing {

using offload_testing::OffloadRunTest;
using offload_testing::RunResult;
using zerotrain::JobSpec;

constexpr int64_t kSteps = 8;
constexpr int kAfterSteps = 2;

// The rank's parameter buffers the forward reads: every "<unit>.params" of the plan (whole
// units at ZeRO 1-2, the rank's shard at 3, which the gathers read), and a LoRA job's adapters
// ("<block>.lora", the buffers its optimizer steps; its ".params" are the frozen base).
inline std::vector<Tensor> ParamBuffers(const Trainer& t) {
  std::vector<Tensor> out;
  for (const BufferSpec& b : t.plan().buffers) {
    if (b.category == MemoryCategory::kParameters &&
        (b.name.ends_with(".params") || b.name.ends_with(".lora"))) {
      absl::StatusOr<Tensor> v = t.arenas().Get(b.name);
      if (v.ok()) out.push_back(*v);
    }
  }
  return out;
}

using Snapshot = std::vector<std::vector<uint8_t>>;

inline Snapshot Take(const std::vector<Tensor>& buffers) {
  Snapshot s;
  for (const Tensor& t : buffers) {
    const auto* p = static_cast<const uint8_t*>(t.raw());
    s.emplace_back(p, p + t.size_bytes());
  }
  return s;
}

inline void Put(const std::vector<Tensor>& buffers, const Snapshot& s) {
  for (size_t i = 0; i < buffers.size(); ++i)
    std::memcpy(buffers[i].raw(), s[i].data(), s[i].size());
}

// What the overlap probes saw on one rank.
struct Overlap {
  std::mutex mu;
  std::condition_variable cv;
  int64_t backward_ended = 0;   // the last step whose backward has ended
  int64_t host_started = 0;     // the last host step that started
  int64_t host_ended = 0;       // the last host step that returned
  int64_t gates_passed = 0;     // holds that saw what they waited for
  int64_t gates_timed_out = 0;  // ... and holds that never did
  // Per step s: the host steps the trainer had launched when step s's backward ended.
  std::map<int64_t, int64_t> launched_at_backward_end;
};

struct SteppedRun {
  absl::Status status;
  std::vector<double> losses;                     // rank 0's, per step
  std::vector<std::vector<float>> weights;        // FullWeights at the end
  int64_t delayed_host_steps = 0;                 // rank 0's launches beside the next step
  std::vector<std::unique_ptr<Overlap>> overlap;  // per rank
};

// Which side of the overlap a run holds back (TrainByHand).
enum class Hold {
  kNothing,
  // Each host step t < kSteps holds its thread until step t+1's backward has ended (which only
  // an overlapped run reaches): the next step's compute runs before the host step writes.
  kHostStepUntilNextBackward,
  // Each step whose predecessor's host step runs beside it waits, before its forward, until
  // that host step has returned: everything it writes is written before the step's first
  // gather (offload.params NVME: the store's next generation, staged but not yet switched to).
  kNextStepUntilHostStep,
};

// Whether step `s` (1-based) computes beside host step s-1 under the delayed update: s-1 past
// the warm-up, and s-1 not a step that drained (a multiple of `drain_every` > 0).
inline bool BesideHostStep(int64_t s, int64_t drain_every) {
  const bool drained = drain_every > 0 && (s - 1) % drain_every == 0;
  return s - 1 > kAfterSteps && !drained;
}

// Trains `spec` for kSteps by hand (Trainer::Step) on every rank. `stale_reference`: the
// serial reference above, for a job without offload, the delayed update starting after
// `kAfterSteps`; the last step drains (max_steps), and so does every multiple of `drain_every`
// (> 0: a checkpoint's steps), after which the next step computes on fresh parameters.
inline SteppedRun TrainByHand(const JobSpec& spec, bool stale_reference, Hold hold,
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
    options.on_host_step_end = [&](int64_t step) {
      std::lock_guard<std::mutex> lock(o.mu);
      o.host_ended = step;
      o.cv.notify_all();
    };
    if (hold == Hold::kHostStepUntilNextBackward) {
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
      if (hold == Hold::kNextStepUntilHostStep && BesideHostStep(s, drain_every)) {
        std::unique_lock<std::mutex> lock(o.mu);
        // Generous: a host step of this model takes milliseconds.
        if (o.cv.wait_for(lock, std::chrono::seconds(30), [&] { return o.host_ended >= s - 1; })) {
          ++o.gates_passed;
        } else {
          ++o.gates_timed_out;
        }
      }
      // Under the delayed update, step s computes on the parameters from before step s-1's
      // update when step s-1's host step was launched beside it.
      const bool stale = stale_reference && BesideHostStep(s, drain_every);
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
    // A LoRA job's trained weights are its adapters.
    absl::StatusOr<std::vector<std::vector<float>>> w =
        job.model().has_lora() ? (*t)->FullAdapters() : (*t)->FullWeights();
    if (!w.ok()) return w.status();
    if (r == 0) {
      run.weights = std::move(*w);
      run.delayed_host_steps = (*t)->delayed_host_steps();
    }
    return absl::OkStatus();
  });
  return run;
}

// `delayed` (a run with the delayed update after kAfterSteps) equals `reference` (TrainByHand's
// stale reference) bit for bit, and launched its host steps beside the next step: steps 3..7
// overlapped the next step; step 8 drained (its launch counts too).
inline void ExpectTheReferenceRun(const SteppedRun& delayed, const SteppedRun& reference,
                                  const std::string& what) {
  ASSERT_TRUE(delayed.status.ok()) << what << ": " << delayed.status;
  ASSERT_TRUE(reference.status.ok()) << what << ": " << reference.status;
  ASSERT_EQ(delayed.losses.size(), static_cast<size_t>(kSteps)) << what;
  EXPECT_EQ(delayed.losses, reference.losses) << what;
  EXPECT_EQ(delayed.weights, reference.weights) << what;
  EXPECT_EQ(delayed.delayed_host_steps, kSteps - kAfterSteps) << what;
}

class DelayedUpdateRunTest : public OffloadRunTest {
 protected:
  // Stopped at the checkpoint of step 4 and resumed, `job` equals its run that never stopped
  // (bit for bit: both drain at step 4, so step 5 computes on fresh parameters in both), and
  // that run is the delayed one: without the delayed update the losses differ.
  void ExpectResumesBitForBit(const JobSpec& job, const std::string& what) {
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
};

}  // namespace zt::delayed_update_testing
