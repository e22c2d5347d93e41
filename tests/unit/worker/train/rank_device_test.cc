// The trainer's device seam (worker/train/rank_device.h) on the CPU: a RankDevice built from
// host parts that counts every crossing and says the host cannot address its memory, so the
// trainer takes the paths a GPU rank takes (staged uploads of the weights, checkpoints through
// staging, resume through host copies, FullWeights through downloads, staged communicators).
// A step must cross exactly as the design says (one upload per micro-batch buffer, one
// read-back), and the run must be bit for bit the plain CPU run, tensor-parallel ranks too.
#include "worker/train/rank_device.h"

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "tests/unit/worker/trainer/small_sharded_job.h"
#include "worker/comm/store.h"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"
#include "worker/plan/arena.h"
#include "worker/plan/memory_plan.h"
#include "worker/train/stop_request.h"
#include "worker/train/trainer.h"

namespace zt {
namespace {

using zerotrain::JobSpec;

struct Crossings {
  std::atomic<int64_t> uploads{0}, downloads{0}, upload_bytes{0}, download_bytes{0};
  void Reset() {
    uploads = 0;
    downloads = 0;
    upload_bytes = 0;
    download_bytes = 0;
  }
};

// The host copy engine, counting.
class CountingCopyEngine : public DeviceCopyEngine {
 public:
  explicit CountingCopyEngine(Crossings* counts)
      : inner_(MakeHostCopyEngine(Device{})), counts_(counts) {}
  Device device() const override { return inner_->device(); }
  absl::StatusOr<void*> AllocateStaging(int64_t bytes) override {
    return inner_->AllocateStaging(bytes);
  }
  absl::StatusOr<IssueMark> MarkIssue() override { return inner_->MarkIssue(); }
  absl::Status CopyToHost(const IssueMark& mark, void* host, const void* device,
                          int64_t bytes) override {
    ++counts_->downloads;
    counts_->download_bytes += bytes;
    return inner_->CopyToHost(mark, host, device, bytes);
  }
  absl::Status CopyToDevice(const IssueMark& mark, void* device, const void* host,
                            int64_t bytes) override {
    ++counts_->uploads;
    counts_->upload_bytes += bytes;
    return inner_->CopyToDevice(mark, device, host, bytes);
  }

 private:
  std::unique_ptr<DeviceCopyEngine> inner_;
  Crossings* counts_;
};

struct DeviceOptions {
  Crossings* counts = nullptr;  // one per rank
  bool staged_comms = false;    // StagedCommunicators over host copy engines
};

// A factory for TrainOptions::make_device: a CPU rank that routes everything as a GPU rank.
auto CountingDevice(DeviceOptions o) {
  return [o](const JobSpec& job, int rank) -> absl::StatusOr<std::unique_ptr<RankDevice>> {
    RankDevice::Parts parts;
    parts.context = CpuContext(job.resources().cpu_threads());
    parts.allocator = MakeHostArenaAllocator();
    parts.copies = std::make_unique<CountingCopyEngine>(&o.counts[rank]);
    parts.host_addressable = false;
    if (o.staged_comms) {
      parts.comm.make_copy_engine = []() -> absl::StatusOr<std::unique_ptr<DeviceCopyEngine>> {
        return MakeHostCopyEngine(Device{});
      };
    }
    return RankDevice::FromParts(std::move(parts));
  };
}

struct RunResult {
  std::vector<double> losses;
  std::vector<std::vector<float>> weights;  // rank 0's FullWeights
  std::vector<std::vector<std::vector<float>>> all_weights;
};

class RankDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TestScratchDir("zt-rank-device-test");
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), testing::PatternTokens(), 32).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  JobSpec Job(int world, int stage, int micro_batch, int accum = 1) {
    return ValidatedJob(testing::SmallShardedJob((dir_ / "train.bin").string(), world, stage,
                                                 micro_batch, accum))
        .value();
  }

  // Every rank (threads) to `stop_after`; `device` null: the plain CPU device.
  static RunResult Train(const JobSpec& job, int64_t stop_after, const DeviceOptions* device,
                   const std::string& resume = "") {
    const int n = job.parallel().world_size();
    InProcessStore store;
    RunResult run;
    run.all_weights.resize(n);
    std::vector<absl::Status> status(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        status[r] = [&]() -> absl::Status {
          TrainOptions options;
          options.rank = r;
          options.store = &store;
          options.stop_after_step = stop_after;
          options.resume_dir = resume;
          if (device != nullptr) options.make_device = CountingDevice(*device);
          absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(job, options);
          if (!t.ok()) return t.status();
          absl::Status ran = (*t)->Run([&](const StepRecord& rec) {
            if (r == 0) run.losses.push_back(rec.loss);
          });
          if (!ran.ok()) return ran;
          absl::StatusOr<std::vector<std::vector<float>>> w = (*t)->FullWeights();
          if (!w.ok()) return w.status();
          run.all_weights[r] = std::move(*w);
          return absl::OkStatus();
        }();
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < n; ++r) EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
    run.weights = run.all_weights[0];
    return run;
  }

  std::filesystem::path dir_;
};

TEST_F(RankDeviceTest, AStepUploadsEachMicroBatchOnceAndReadsItsStatisticsOnce) {
  const int accum = 3;
  const JobSpec job = Job(1, 0, 2, accum);
  Crossings counts[1];
  TrainOptions options;
  options.make_device = CountingDevice({.counts = counts});
  StopRequest stop;
  options.stop = &stop;
  std::unique_ptr<Trainer> t = Trainer::Create(job, options).value();
  EXPECT_GT(counts[0].uploads.load(), 0) << "the initial weights go up through the device";
  const int64_t batch_bytes = int64_t{2} * 16 * 4;  // B · T i32
  for (int s = 0; s < 2; ++s) {
    counts[0].Reset();
    ASSERT_TRUE(t->Step().ok());
    // Tokens and targets, one copy each per micro-batch; nothing else goes up.
    EXPECT_EQ(counts[0].uploads.load(), 2 * accum) << "step " << s + 1;
    EXPECT_EQ(counts[0].upload_bytes.load(), 2 * accum * batch_bytes);
    // The loss, the gradient norm, the overflow flag and the stop request: one read.
    EXPECT_EQ(counts[0].downloads.load(), 1) << "step " << s + 1;
    EXPECT_EQ(counts[0].download_bytes.load(), ShardingEngine::kScalarSlots * 4);
  }
  // A stop request crosses once more, and the step reports it.
  stop.Request(StopKind::kStop);
  counts[0].Reset();
  absl::StatusOr<StepRecord> r = t->Step();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stop, StopKind::kStop);
  EXPECT_EQ(counts[0].uploads.load(), 2 * accum + 1);
  EXPECT_EQ(counts[0].downloads.load(), 1);
}

TEST_F(RankDeviceTest, TrainingThroughTheSeamIsBitwiseThePlainCpuRun) {
  for (int stage = 0; stage <= 3; ++stage) {
    const JobSpec job = Job(2, stage, 2);
    const RunResult plain = Train(job, 8, nullptr);
    Crossings counts[2];
    const DeviceOptions device{.counts = counts};
    const RunResult seam = Train(job, 8, &device);
    ASSERT_EQ(plain.losses.size(), 8u);
    EXPECT_EQ(seam.losses, plain.losses) << "stage " << stage;
    EXPECT_EQ(seam.weights, plain.weights) << "stage " << stage;
    EXPECT_EQ(seam.all_weights[1], plain.weights) << "stage " << stage;
  }
}

TEST_F(RankDeviceTest, StagedCommunicatorsGiveThePlainRunOnEveryStage) {
  // Ranks whose memory the host cannot address reach Gloo through staging (the GPU ranks'
  // path when they share a GPU). This model's largest collective is far below one staging
  // region, so no operation is chunked and the sums run in Gloo's own order: bitwise equal.
  for (int stage = 0; stage <= 3; ++stage) {
    const JobSpec job = Job(2, stage, 2, /*accum=*/2);
    const RunResult plain = Train(job, 6, nullptr);
    Crossings counts[2];
    const DeviceOptions staged{.counts = counts, .staged_comms = true};
    const RunResult seam = Train(job, 6, &staged);
    EXPECT_EQ(seam.losses, plain.losses) << "stage " << stage;
    EXPECT_EQ(seam.weights, plain.weights) << "stage " << stage;
  }
}

TEST_F(RankDeviceTest, TensorAndSequenceParallelRanksThroughStagingAreThePlainRun) {
  // The tensor-parallel path a GPU rank takes: its shares uploaded at set-up, the model's
  // collectives staged, and FullWeights joining the shares through device scratch (a CUDA
  // rank's communicator moves device buffers, not the host vectors the plain path gathers).
  // Collectives below one staging region run in Gloo's own order: bitwise equal.
  for (const bool sequence_parallel : {false, true}) {
    JobSpec spec = testing::SmallShardedJob((dir_ / "train.bin").string(), 2, 0, 2);
    spec.mutable_parallel()->set_tensor_parallel(2);
    spec.mutable_parallel()->set_sequence_parallel(sequence_parallel);
    const JobSpec job = ValidatedJob(spec).value();
    const RunResult plain = Train(job, 6, nullptr);
    Crossings counts[2];
    const DeviceOptions staged{.counts = counts, .staged_comms = true};
    const RunResult seam = Train(job, 6, &staged);
    ASSERT_EQ(plain.losses.size(), 6u);
    EXPECT_EQ(seam.losses, plain.losses) << "sequence parallel " << sequence_parallel;
    // The whole model, joined from both ranks' shares, on each rank.
    EXPECT_EQ(seam.weights, plain.weights) << "sequence parallel " << sequence_parallel;
    EXPECT_EQ(seam.all_weights[1], plain.weights) << "sequence parallel " << sequence_parallel;
  }
}

TEST_F(RankDeviceTest, MixedPrecisionWithASplitMasterIsBitwiseThePlainRun) {
  // bf16 parameters whose fp32 master is split (FullWeights joins it on the device).
  JobSpec spec = testing::SmallShardedJob((dir_ / "train.bin").string(), 2, 1, 2);
  auto* p = spec.mutable_precision();
  p->set_param_dtype(zerotrain::PrecisionConfig::BF16);
  p->set_compute_dtype(zerotrain::PrecisionConfig::BF16);
  p->set_master_weights(true);
  p->set_split_master_weights(true);
  const JobSpec job = ValidatedJob(spec).value();
  const RunResult plain = Train(job, 6, nullptr);
  Crossings counts[2];
  const DeviceOptions device{.counts = counts};
  const RunResult seam = Train(job, 6, &device);
  EXPECT_EQ(seam.losses, plain.losses);
  EXPECT_EQ(seam.weights, plain.weights);
}

TEST_F(RankDeviceTest, CheckpointsGoThroughStagingAndResumeEitherWay) {
  // Written through the seam (downloaded into staging, written by the background thread),
  // resumed through it (read into host copies, uploaded) and by the plain path: both continue
  // exactly as the uninterrupted plain run.
  JobSpec job = Job(2, 2, 2);
  const RunResult straight = Train(job, 12, nullptr);
  job.mutable_checkpoint()->set_dir((dir_ / "ckpt").string());
  job.mutable_checkpoint()->set_interval_steps(6);
  job.mutable_checkpoint()->set_async(true);
  Crossings counts[2];
  const DeviceOptions device{.counts = counts};
  Train(job, 6, &device);
  for (const DeviceOptions* resume_with : {&device, static_cast<const DeviceOptions*>(nullptr)}) {
    // Each resume starts from the step-6 checkpoint in a copy of the directory.
    const std::filesystem::path copy = dir_ / (resume_with ? "resume-seam" : "resume-plain");
    std::filesystem::copy(dir_ / "ckpt", copy, std::filesystem::copy_options::recursive);
    JobSpec resumed = job;
    resumed.mutable_checkpoint()->set_dir(copy.string());
    const RunResult second = Train(resumed, 12, resume_with, copy.string());
    ASSERT_EQ(second.losses.size(), 6u);
    for (size_t s = 0; s < 6; ++s) {
      EXPECT_EQ(second.losses[s], straight.losses[6 + s]) << "step " << 7 + s;
    }
    EXPECT_EQ(second.weights, straight.weights) << (resume_with ? "seam" : "plain");
  }
}

// precision.allow_tf32 reaches the ops' context (the CUDA GEMMs read it; the CPU ones ignore
// it); the default keeps full fp32.
TEST_F(RankDeviceTest, TheContextCarriesTheJobsTf32Choice) {
  JobSpec job = Job(/*world=*/1, /*stage=*/0, /*micro_batch=*/2);
  EXPECT_FALSE(RankDevice::Create(job, 0, /*cuda_device=*/-1).value()->context().allow_tf32);
  EXPECT_FALSE(JobDeviceContext(job).allow_tf32);
  job.mutable_precision()->set_allow_tf32(true);
  EXPECT_TRUE(RankDevice::Create(job, 0, /*cuda_device=*/-1).value()->context().allow_tf32);
  EXPECT_TRUE(JobDeviceContext(job).allow_tf32);
  job.mutable_resources()->set_device(zerotrain::ResourceConfig::CUDA);
  EXPECT_TRUE(JobDeviceContext(job).allow_tf32) << "the CUDA planning context too";
}

TEST_F(RankDeviceTest, FromPartsRefusesMissingParts) {
  RankDevice::Parts parts;
  parts.allocator = MakeHostArenaAllocator();
  const absl::StatusOr<std::unique_ptr<RankDevice>> d = RankDevice::FromParts(std::move(parts));
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  RankDevice::Parts whole;
  whole.allocator = MakeHostArenaAllocator();
  whole.copies = MakeHostCopyEngine(Device{});
  std::unique_ptr<RankDevice> device = RankDevice::FromParts(std::move(whole)).value();
  EXPECT_TRUE(device->TakeAllocator().ok());
  EXPECT_EQ(device->TakeAllocator().status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace zt
