// Offload through a device whose memory is its own (offload_runs.h, kSeparateDeviceMemory): a
// CPU rank whose arenas and context say cpu:1 while the pinned host pool and the host buffers
// say cpu:0, and whose memory the trainer is told the host cannot address — what a GPU rank
// is, less the streams. Every kernel refuses an argument from the other side by name, so each
// offloaded configuration trained through it shows, on the CPU, that nothing of ZeRO-Offload
// or ZeRO-Infinity reaches device memory from the host, or host memory from a device op,
// except through the rank's copy engine: the optimizer offloaded to CPU and NVMe at ZeRO
// stages 1–3, the parameters offloaded to CPU and NVMe at stage 3, the delayed update, and a
// checkpoint of offloaded states resumed. Each run equals the same job without offload on the
// plain CPU device bit for bit (offload_training_test.cc's rule), and its arenas are the plan.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/trainer/offload_runs.h"
#include "worker/plan/memory_plan.h"

namespace zt {
namespace {

using zerotrain::JobSpec;
using zerotrain::OffloadConfig;
using zerotrain::OptimizerConfig;
using zerotrain::PrecisionConfig;

using namespace offload_testing;  // NOLINT: the harness's names

class OffloadSeparateMemoryTest : public OffloadRunTest {
 protected:
  // Every rank of `job` through a device of its own memory, to `stop_after`; from `resume`.
  static RunResult TrainSeparate(const JobSpec& job, int64_t stop_after,
                                 const std::string& resume = "") {
    std::vector<CountedRank> ranks(job.parallel().world_size());
    for (CountedRank& r : ranks) r.separate_memory = true;
    RunResult run = Train(job, stop_after, resume, &ranks);
    for (size_t r = 0; r < ranks.size() && run.status.ok(); ++r) {
      // The host step's traffic crossed the copy engine: the offloaded run is not a CPU rank
      // reading its own arenas in place.
      EXPECT_GT(ranks[r].crossings.download_bytes, 0) << "rank " << r;
      EXPECT_GT(ranks[r].crossings.upload_bytes, 0) << "rank " << r;
    }
    return run;
  }
};

struct Config {
  int world, stage;
  OptimizerConfig::Type type;
  PrecisionConfig::DType dtype;
  OffloadConfig::Device optimizer, params;
  bool delayed = false;
};

std::string Name(const Config& c) {
  return absl::StrCat(OptimizerConfig::Type_Name(c.type), " ", PrecisionConfig::DType_Name(c.dtype),
                      " stage ", c.stage, " world ", c.world, " optimizer ",
                      OffloadConfig::Device_Name(c.optimizer), " params ",
                      OffloadConfig::Device_Name(c.params), c.delayed ? " delayed" : "");
}

// The arenas the run allocated are the plan's categories, to the byte (nothing staged beside
// the plan on either side of the copy engine).
void ExpectArenasArePlan(const RunResult& run, const std::string& what) {
  for (size_t r = 0; r < run.plans.size(); ++r) {
    for (int c = 0; c < kMemoryCategoryCount; ++c) {
      const auto category = static_cast<MemoryCategory>(c);
      if (category == MemoryCategory::kNvme) continue;  // the swap store's, not an arena's
      EXPECT_EQ(run.arena_bytes[r][c], run.plans[r].CategoryBytes(category))
          << what << " rank " << r << " " << MemoryCategoryName(category);
    }
  }
}

TEST_F(OffloadSeparateMemoryTest, EveryOffloadTrainsThroughTheCopyEngineBitForBit) {
  using O = OptimizerConfig;
  using P = PrecisionConfig;
  using D = OffloadConfig;
  const Config configs[] = {
      {1, 1, O::ADAMW, P::FP32, D::CPU, D::NONE},
      {2, 1, O::ADAMW_8BIT, P::BF16, D::CPU, D::NONE},
      // A sharded Adafactor: its host step sums statistics in host memory, over the host
      // step's own contexts (worker/shard/host_step_sums.h).
      {2, 2, O::ADAFACTOR, P::FP32, D::CPU, D::NONE},
      {2, 1, O::ADAFACTOR, P::BF16, D::NVME, D::NONE},
      {2, 3, O::ADAMW, P::BF16, D::CPU, D::NONE},
      {1, 2, O::ADAMW, P::FP32, D::NVME, D::NONE},
      {2, 3, O::ADAMW_8BIT, P::BF16, D::NVME, D::NONE},
      {2, 3, O::ADAMW, P::FP32, D::CPU, D::CPU},
      {2, 3, O::ADAMW, P::BF16, D::NVME, D::CPU},
      {2, 3, O::ADAMW, P::FP32, D::NVME, D::NVME},
  };
  for (const Config& c : configs) {
    const std::string what = Name(c);
    const RunResult separate =
        TrainSeparate(Job(c.world, c.stage, c.type, c.dtype, c.optimizer, c.params), 4);
    const RunResult plain = Train(Job(c.world, c.stage, c.type, c.dtype, D::NONE, D::NONE), 4);
    ExpectSameRun(separate, plain, what);
    ASSERT_EQ(separate.losses.size(), 4u) << what;
    EXPECT_TRUE(separate.unclaimed.empty()) << what << ": " << separate.unclaimed[0];
    ExpectArenasArePlan(separate, what);
    // The same collectives move the same bytes, whichever communicator carries them: a
    // sharded Adafactor's statistics sums go over the host step's own contexts here and over
    // the rank's communicators on the plain device, and count in the step's comm_bytes on both.
    for (size_t r = 0; r < plain.last_step.size(); ++r) {
      EXPECT_EQ(separate.last_step[r].comm_bytes, plain.last_step[r].comm_bytes)
          << what << " rank " << r;
    }
  }
}

// The delayed update's host step runs on its own thread over host banks; through a device of
// its own memory it equals the delayed run on the plain device bit for bit (the delayed
// update's arithmetic is its own, so the reference is the same delayed job, not the serial one).
TEST_F(OffloadSeparateMemoryTest, TheDelayedUpdateTrainsThroughTheCopyEngineBitForBit) {
  for (const OffloadConfig::Device optimizer : {OffloadConfig::CPU, OffloadConfig::NVME}) {
    for (const int stage : {1, 3}) {
      const std::string what = absl::StrCat(
          "delayed, optimizer ", OffloadConfig::Device_Name(optimizer), " stage ", stage);
      JobSpec job = Job(2, stage, OptimizerConfig::ADAMW, PrecisionConfig::FP32, optimizer);
      job.mutable_offload()->mutable_delayed_update()->set_enabled(true);
      job.mutable_offload()->mutable_delayed_update()->set_after_steps(1);
      const RunResult separate = TrainSeparate(job, 4);
      const RunResult plain = Train(job, 4);
      ExpectSameRun(separate, plain, what);
      ASSERT_EQ(separate.losses.size(), 4u) << what;
      ExpectArenasArePlan(separate, what);
    }
  }
}

// A checkpoint of offloaded states written through a device of its own memory resumes through
// one, and the resumed run continues as the run that never stopped.
TEST_F(OffloadSeparateMemoryTest, OffloadedCheckpointsResumeThroughTheCopyEngine) {
  for (const OffloadConfig::Device params : {OffloadConfig::CPU, OffloadConfig::NVME}) {
    const std::string what = absl::StrCat("params ", OffloadConfig::Device_Name(params));
    JobSpec job =
        Job(2, 3, OptimizerConfig::ADAMW, PrecisionConfig::FP32, OffloadConfig::NVME, params);
    job.mutable_checkpoint()->set_dir(
        (dir_ / absl::StrCat("ckpt-params-", OffloadConfig::Device_Name(params))).string());
    job.mutable_checkpoint()->set_interval_steps(2);
    // A device's state is written from the plan's page-locked staging (on CUDA always; here
    // the plan is a CPU job's, which holds it for asynchronous saves).
    job.mutable_checkpoint()->set_async(true);
    const RunResult straight = TrainSeparate(job, 4);
    ASSERT_TRUE(straight.status.ok()) << what << ": " << straight.status;
    JobSpec stopped = job;
    stopped.mutable_checkpoint()->set_dir(job.checkpoint().dir() + "-stopped");
    ASSERT_TRUE(TrainSeparate(stopped, 2).status.ok()) << what;
    const RunResult second = TrainSeparate(stopped, 4, stopped.checkpoint().dir());
    ASSERT_TRUE(second.status.ok()) << what << ": " << second.status;
    ASSERT_EQ(second.losses.size(), 2u) << what;
    EXPECT_EQ(second.losses[0], straight.losses[2]) << what;
    EXPECT_EQ(second.losses[1], straight.losses[3]) << what;
    EXPECT_EQ(second.weights, straight.weights) << what;
    EXPECT_EQ(second.state, straight.state) << what;
  }
}

}  // namespace
}  // namespace zt
