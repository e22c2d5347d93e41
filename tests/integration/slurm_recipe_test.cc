// deploy/slurm/zerotrain.sbatch on a real Slurm (one machine, configured by the test): the
// batch job trains to the weights of `zt train`, and a preempted one checkpoints, is requeued
// by Slurm under the same job id, resumes and ends with the weights of an uninterrupted run.
// Skipped, with the reason, where Slurm cannot start (not root, slurm-wlm or munge absent).
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "tests/integration/daemon_cluster.h"
#include "tests/integration/slurm_cluster.h"

namespace zt::testing {
namespace {

class SlurmRecipeTest : public DaemonClusterTest {
 protected:
  void SetUp() override {
    if (const std::string reason = SlurmCluster::Unavailable(); !reason.empty()) {
      GTEST_SKIP() << reason;
    }
    DaemonClusterTest::SetUp();
    slurm_ = std::make_unique<SlurmCluster>();
    const std::string error = slurm_->Start();
    ASSERT_TRUE(error.empty()) << error;
    // What the batch script reads (sbatch hands the submitting environment to the job).
    const std::string bin = std::string(ZT_BINARY_DIR) + "/bin";
    const char* path = std::getenv("PATH");
    ::setenv("PATH", (bin + ":" + (path ? path : "/usr/bin:/bin")).c_str(), 1);
    ::setenv("ZT_SLURM_STATE", Path("slurm-state").c_str(), 1);
    ::setenv("ZT_PORT", std::to_string(FreePort()).c_str(), 1);
    // The one node is `localhost`, which a fresh root without /etc/hosts cannot resolve.
    ::setenv("ZT_COORDINATOR_HOST", "127.0.0.1", 1);
    ::setenv("ZT_ALLOWED_ROOT", dir_.c_str(), 1);
    ::setenv("ZT_COORDINATOR_ARGS", "--metrics-addr off", 1);
    // Two CPU devices on the one node: the job's two ranks.
    ::setenv("ZT_NODE_ARGS", "--cpu-devices 2 --metrics-addr off", 1);
  }
  void TearDown() override {
    if (IsSkipped() && !slurm_) return;
    slurm_.reset();
    for (const char* name : {"ZT_SLURM_STATE", "ZT_PORT", "ZT_COORDINATOR_HOST", "ZT_ALLOWED_ROOT",
                             "ZT_COORDINATOR_ARGS", "ZT_NODE_ARGS"}) {
      ::unsetenv(name);
    }
    DaemonClusterTest::TearDown();
  }

  // sbatch of the recipe on `job_file`, its GPU and node requests overridden for this one CPU
  // machine (command-line options beat #SBATCH lines); the Slurm job id.
  std::string SubmitBatch(const std::string& job_file) {
    const RunResult r = SlurmCluster::Run(
        "sbatch --parsable --nodes=1 --gpus-per-node=0 --output=" + Path("slurm-%j.out") +
        " --chdir=" + dir_.string() + " " + ZT_SOURCE_DIR + "/deploy/slurm/zerotrain.sbatch " +
        job_file);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::string id = r.output.substr(0, r.output.find_first_of(";\n"));
    return id;
  }

  // Waits until the Slurm job has ended (COMPLETED, FAILED, ...); its last JobState. A job
  // that Slurm requeued waits two minutes before it may start again: it is made eligible at
  // once, so the test does not sit out that delay.
  std::string WaitForBatchEnd(const std::string& id, std::chrono::seconds timeout) {
    const auto deadline = Clock::now() + timeout;
    std::string state;
    while (Clock::now() < deadline) {
      state = SlurmCluster::JobField(id, "JobState");
      if (state == "COMPLETED" || state == "FAILED" || state == "CANCELLED" || state == "TIMEOUT" ||
          state == "NODE_FAIL" || state == "OUT_OF_MEMORY") {
        return state;
      }
      const std::string reason = SlurmCluster::JobField(id, "Reason");
      if (state == "PENDING" && reason.find("held") != std::string::npos)
        return state + " " + reason;
      if (state == "PENDING" && reason == "BeginTime") {
        // A requeued job is held ~2 minutes; the test shortens that to 3 s, not to nothing:
        // slurmd revokes the previous run's credential, with one-second resolution, and a
        // run started within the same second is killed "Job credential revoked" (seen in CI).
        std::this_thread::sleep_for(std::chrono::seconds(3));
        SlurmCluster::Run("scontrol update JobId=" + id + " StartTime=now");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return state;
  }

  // sbatch of a job of `steps` steps, checkpointing every 100, and a wait until it is mid-run,
  // after its first checkpoint; the Slurm job id.
  std::string SubmitAndWaitForCheckpoint(int steps) {
    const std::string id = SubmitBatch(WriteJob("slurm", Path("ckpt"), 2, steps, 100));
    if (id.empty()) return id;
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (!std::filesystem::exists(Path("ckpt/latest"))) {
      if (Clock::now() > deadline) {
        ADD_FAILURE() << "no checkpoint after 60 s\n" << BatchOutputTail(id);
        return "";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return id;
  }

  // The batch job's output file (both runs of a requeued job append to it).
  std::string BatchOutput(const std::string& id) { return ReadText(Path("slurm-" + id + ".out")); }

  // Its last lines: enough to see why a job failed without every progress line.
  std::string BatchOutputTail(const std::string& id) {
    const std::string out = BatchOutput(id);
    return out.size() > 6000 ? out.substr(out.size() - 6000) : out;
  }

  std::unique_ptr<SlurmCluster> slurm_;
};

TEST_F(SlurmRecipeTest, BatchJobSucceedsWithTheWeightsOfZtTrain) {
  const std::string job = WriteJob("slurm", Path("ckpt"), 2, 200, 100);
  const std::string id = SubmitBatch(job);
  ASSERT_FALSE(id.empty());
  const std::string state = WaitForBatchEnd(id, std::chrono::seconds(60));
  ASSERT_EQ(state, "COMPLETED") << BatchOutputTail(id);
  EXPECT_EQ(SlurmCluster::JobField(id, "ExitCode"), "0:0");
  EXPECT_NE(BatchOutput(id).find("SUCCEEDED"), std::string::npos) << BatchOutputTail(id);
  EXPECT_EQ(ExportedWeights(Path("ckpt"), Path("export")), ZtTrainWeights(2, 200, 100));
}

// USR1 to the batch shell (what `--signal=B:USR1@300` sends before the time limit): the node
// daemons checkpoint and exit 75, the script requeues its own job, and the requeued run (same
// Slurm job id, so the same state directory) resumes the coordinator's job from that checkpoint.
TEST_F(SlurmRecipeTest, PreemptedBatchJobIsRequeuedAndEndsWithUninterruptedWeights) {
  constexpr int kSteps = 1500;
  const std::string id = SubmitAndWaitForCheckpoint(kSteps);
  ASSERT_FALSE(id.empty());
  const RunResult signal = SlurmCluster::Run("scancel --signal=USR1 --batch " + id);
  ASSERT_EQ(signal.exit_code, 0) << signal.output;
  // The requeue first: while the first run's allocation is torn down, its state can read as
  // ended before Slurm counts the restart (a loaded CI run once saw FAILED there).
  const auto requeue_deadline = Clock::now() + std::chrono::seconds(60);
  while (SlurmCluster::JobField(id, "Restarts") != "1") {
    ASSERT_LT(Clock::now(), requeue_deadline)
        << "not requeued; state " << SlurmCluster::JobField(id, "JobState") << "\n"
        << BatchOutputTail(id) << ReadText(slurm_->Path("slurmctld.log"));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }

  const std::string state = WaitForBatchEnd(id, std::chrono::seconds(120));
  const std::string output = BatchOutput(id);
  ASSERT_EQ(state, "COMPLETED") << BatchOutputTail(id) << ReadText(slurm_->Path("slurmctld.log"));
  EXPECT_EQ(SlurmCluster::JobField(id, "ExitCode"), "0:0");
  EXPECT_EQ(SlurmCluster::JobField(id, "Restarts"), "1");
  EXPECT_NE(output.find("exit 75"), std::string::npos) << BatchOutputTail(id);
  EXPECT_NE(output.find("restart 1,"), std::string::npos) << BatchOutputTail(id);
  EXPECT_NE(output.find("SUCCEEDED"), std::string::npos) << BatchOutputTail(id);
  EXPECT_EQ(ExportedWeights(Path("ckpt"), Path("export")), ZtTrainWeights(2, kSteps, 100));
}

// scancel (TERM to the job): the nodes checkpoint, and the job ends CANCELLED without requeueing
// itself (a regression: the script once requeued on every signal, so a cancelled job ran again).
TEST_F(SlurmRecipeTest, CancelledBatchJobIsNotRequeued) {
  const std::string id = SubmitAndWaitForCheckpoint(1500);
  ASSERT_FALSE(id.empty());
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  const RunResult cancel = SlurmCluster::Run("scancel " + id);
  ASSERT_EQ(cancel.exit_code, 0) << cancel.output;
  // CANCELLED comes at once; the script's own clean-up (where a requeue would happen) ends
  // when the job leaves the queue.
  while (SlurmCluster::Run("squeue -h -j " + id + " -o %i").output.find(id) != std::string::npos) {
    ASSERT_LT(Clock::now(), deadline) << BatchOutputTail(id);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(SlurmCluster::JobField(id, "JobState"), "CANCELLED") << BatchOutputTail(id);
  EXPECT_EQ(SlurmCluster::JobField(id, "Restarts"), "0") << BatchOutputTail(id);
}

}  // namespace
}  // namespace zt::testing
