// Stop requests (worker/train/stop_request.h): a request raised on one rank ends every rank after
// the same step; kCheckpointThenStop saves that step first, and a resume from the save goes on
// exactly as the run that never stopped.
#include "worker/train/stop_request.h"

#include <filesystem>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "tests/unit/worker/trainer/small_sharded_job.h"
#include "worker/checkpoint/checkpoint_directory.h"
#include "worker/comm/store.h"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"
#include "worker/train/trainer.h"

namespace zt {
namespace {

using zerotrain::JobSpec;

struct RankRun {
  absl::Status status;
  std::vector<double> losses;    // of the steps this run took
  std::vector<StopKind> agreed;  // each step's agreed stop kind
  int64_t last_step = 0;
  bool stopped_early = false;
};

// Runs both ranks; rank `raiser` raises `kind` on its own StopRequest in its on_step at step
// `raise_at` (0: never).
std::vector<RankRun> RunRanks(const JobSpec& job, const std::string& resume, int raiser,
                              int64_t raise_at, StopKind kind) {
  InProcessStore store;
  std::vector<RankRun> runs(2);
  std::vector<StopRequest> requests(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      TrainOptions options{.rank = r, .store = &store, .resume_dir = resume, .stop = &requests[r]};
      absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(job, options);
      if (!t.ok()) {
        runs[r].status = t.status();
        return;
      }
      runs[r].status = (*t)->Run([&](const StepRecord& s) {
        runs[r].losses.push_back(s.loss);
        runs[r].agreed.push_back(s.stop);
        if (r == raiser && s.step == raise_at) requests[r].Request(kind);
      });
      runs[r].last_step = (*t)->step();
      runs[r].stopped_early = (*t)->stopped_early();
    });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

class StopRequestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TestScratchDir("zt-stop-test");
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), testing::PatternTokens(), 32).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  JobSpec Job(const std::string& checkpoints) {
    JobSpec job = testing::SmallShardedJob((dir_ / "train.bin").string(), 2, 3, 2);
    job.mutable_train()->set_max_steps(10);
    job.mutable_checkpoint()->set_dir((dir_ / checkpoints).string());
    job.mutable_checkpoint()->set_interval_steps(100);
    return ValidatedJob(job).value();
  }

  std::filesystem::path dir_;
};

TEST(StopRequest, AWeakerRequestNeverLowersAStrongerOne) {
  StopRequest request;
  EXPECT_EQ(request.kind(), StopKind::kNone);
  request.Request(StopKind::kCheckpointThenStop);
  request.Request(StopKind::kStop);
  EXPECT_EQ(request.kind(), StopKind::kCheckpointThenStop);
}

TEST_F(StopRequestTest, OneRanksCheckpointRequestStopsEveryRankAfterTheSameStep) {
  const JobSpec job = Job("ckpt");
  const std::vector<RankRun> stopped = RunRanks(job, "", 1, 3, StopKind::kCheckpointThenStop);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(stopped[r].status.ok()) << stopped[r].status;
    // Raised after step 3's agreement: step 4 is the first to see it, on both ranks.
    EXPECT_EQ(stopped[r].last_step, 4) << "rank " << r;
    EXPECT_TRUE(stopped[r].stopped_early) << "rank " << r;
    EXPECT_THAT(stopped[r].agreed,
                ::testing::ElementsAre(StopKind::kNone, StopKind::kNone, StopKind::kNone,
                                       StopKind::kCheckpointThenStop))
        << "rank " << r;
  }
  absl::StatusOr<std::string> latest = FindLatest(job.checkpoint().dir());
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(std::filesystem::path(*latest).filename().string(), CheckpointStepDirName(4));

  // The uninterrupted run, and the resumed one: bit for bit the same losses (the same
  // computation in the same order on the same bytes).
  JobSpec straight_job = job;
  straight_job.mutable_checkpoint()->set_dir((dir_ / "straight").string());
  const std::vector<RankRun> straight = RunRanks(straight_job, "", 0, 0, StopKind::kNone);
  ASSERT_TRUE(straight[0].status.ok()) << straight[0].status;
  ASSERT_EQ(straight[0].losses.size(), 10u);
  EXPECT_FALSE(straight[0].stopped_early);
  const std::vector<RankRun> resumed = RunRanks(job, job.checkpoint().dir(), 0, 0, StopKind::kNone);
  ASSERT_TRUE(resumed[0].status.ok()) << resumed[0].status;
  ASSERT_EQ(resumed[0].losses.size(), 6u);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(stopped[0].losses[s], straight[0].losses[s]);
  for (int s = 0; s < 6; ++s) {
    EXPECT_EQ(resumed[0].losses[s], straight[0].losses[4 + s]) << "step " << 5 + s;
  }
}

TEST_F(StopRequestTest, APlainStopSavesNothing) {
  const JobSpec job = Job("plain");
  const std::vector<RankRun> stopped = RunRanks(job, "", 0, 2, StopKind::kStop);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(stopped[r].status.ok()) << stopped[r].status;
    EXPECT_EQ(stopped[r].last_step, 3);
    EXPECT_TRUE(stopped[r].stopped_early);
  }
  EXPECT_FALSE(FindLatest(job.checkpoint().dir()).ok());
}

}  // namespace
}  // namespace zt
