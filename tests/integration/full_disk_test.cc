// A full disk under a real `zt train` with offload.optimizer NVME (issue 16): a small,
// size-limited tmpfs made by the test (a user and mount namespace of its own, `unshare -rm`,
// so no root and no trace outside the command) holds either the swap store or the checkpoint
// directory. The job must fail with an error naming the path and the bytes it needs, never
// crash, and leave the last checkpoint whole. Skipped, with the reason, where the kernel or the
// container does not allow unprivileged user namespaces.
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/scratch_dir_test.h"
#include "tests/integration/zt_process.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

// Runs `script` (sh) as root of its own user and mount namespace: what it mounts is gone when
// it exits.
testing::RunResult InOwnMountNamespace(const std::string& script) {
  return testing::RunCommand("unshare -rm sh -c '" + script + "'");
}

std::string Zt() { return std::string(ZT_BINARY_DIR) + "/bin/zt"; }

class FullDiskTest : public testing::ScratchDirTest {
 protected:
  FullDiskTest() : ScratchDirTest("zt-full-disk") {}

  void SetUp() override {
    ScratchDirTest::SetUp();
    std::filesystem::create_directories(dir_ / "probe");
    const testing::RunResult probe =
        InOwnMountNamespace("mount -t tmpfs -o size=64k tmpfs " + Path("probe"));
    if (probe.exit_code != 0) {
      GTEST_SKIP() << "cannot mount a tmpfs in a user namespace here (unshare -rm): "
                   << probe.output;
    }
  }

  // ~430 k parameters: a checkpoint of ~5.2 MB (parameters, AdamW moments), swap files of
  // ~9.5 MB (two generations of the moments and master weights, and slack).
  void WriteJob(const std::string& name, int steps, const std::string& swap,
                const std::string& ckpt) {
    std::ofstream(dir_ / name) << "name: full-disk\n"
                                  "model: {family: GPT2, n_layer: 2, n_head: 4, d_model: 128, "
                                  "vocab_size: 64, max_seq_len: 32}\n"
                                  "data: {train: ['"
                               << Path("train.bin")
                               << "'], seq_len: 32}\n"
                                  "train: {micro_batch_size: 2, max_steps: "
                               << steps
                               << "}\n"
                                  "optimizer: {lr: 1.0e-3}\n"
                                  "parallel: {world_size: 1, zero_stage: 1}\n"
                                  "resources: {cpu_threads: 1}\n"
                                  "offload: {optimizer: NVME, nvme_path: '"
                               << swap
                               << "', buffer_count: 4, buffer_size: 1048576}\n"
                                  "checkpoint: {dir: '"
                               << ckpt << "', interval_steps: 2, keep_last: 3}\n";
  }
};

// The swap files are preallocated when the store opens, so a disk too small for them fails the
// job before its first step — naming the file and the bytes — rather than in the middle of a
// swap-out.
TEST_F(FullDiskTest, SwapStoreOnAFullDiskFailsAtStartNamingTheFileAndTheBytes) {
  std::filesystem::create_directories(dir_ / "swap");
  WriteJob("job.yaml", 4, Path("swap"), Path("ckpt"));
  const testing::RunResult run =
      InOwnMountNamespace("mount -t tmpfs -o size=256k tmpfs " + Path("swap") + " && " + Zt() +
                          " train " + Path("job.yaml") + " --quiet --run-dir " + Path("run"));
  EXPECT_EQ(run.exit_code, 1) << run.output;  // an error, not a signal
  EXPECT_THAT(run.output, HasSubstr(Path("swap") + "/zerotrain-swap/"));
  EXPECT_THAT(run.output, HasSubstr("No space left on device"));
  EXPECT_THAT(run.output, MatchesRegex("(.|\n)*needs [0-9]+ bytes(.|\n)*"));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "ckpt" / "latest"));
}

// The checkpoint directory on a disk with room for one checkpoint and not two: the second save
// fails the job, naming its file and the bytes it needs, and the first is still the latest,
// whole: it exports to the very bytes of a run that stopped there.
TEST_F(FullDiskTest, CheckpointOnAFullDiskFailsTheJobAndKeepsTheLastCheckpoint) {
  std::filesystem::create_directories(dir_ / "swap");
  std::filesystem::create_directories(dir_ / "ckpt");
  WriteJob("two.yaml", 2, Path("swap"), Path("two-ckpt"));
  const auto [two_code, two_output] = testing::RunZt(
      {"train", Path("two.yaml"), "--quiet", "--run-dir", Path("two-run")}, Path("two.log"));
  ASSERT_EQ(two_code, 0) << two_output;
  const testing::RunResult two_export =
      testing::RunZtCommand("export " + Path("two-ckpt") + " --out " + Path("two-export"));
  ASSERT_EQ(two_export.exit_code, 0) << two_export.output;

  WriteJob("job.yaml", 6, Path("swap"), Path("ckpt"));
  const testing::RunResult run = InOwnMountNamespace(
      "mount -t tmpfs -o size=8m tmpfs " + Path("ckpt") + " && { " + Zt() + " train " +
      Path("job.yaml") + " --quiet --run-dir " + Path("run") + "; echo \"train exit $?\"; } && " +
      "cp " + Path("ckpt") + "/latest " + Path("latest") + " && ls -a " + Path("ckpt") + " > " +
      Path("listing") + " && " + Zt() + " export " + Path("ckpt") + " --out " + Path("export") +
      " && echo exported");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("train exit 1"));
  EXPECT_THAT(run.output, HasSubstr("step-00000004"));  // the save that failed, named
  EXPECT_THAT(run.output, HasSubstr("No space left on device"));
  EXPECT_THAT(run.output, MatchesRegex("(.|\n)*the file needs [0-9]+ bytes(.|\n)*"));
  EXPECT_THAT(run.output, HasSubstr("exported"));
  // The failed save did not move `latest` and left no temporary directory behind.
  EXPECT_THAT(testing::ReadText(Path("latest")), HasSubstr("step-00000002"));
  const std::string listing = testing::ReadText(Path("listing"));
  EXPECT_THAT(listing, HasSubstr("step-00000002"));
  EXPECT_THAT(listing, ::testing::Not(HasSubstr("step-00000004")));
  const std::string exported = testing::ReadText(Path("export") + "/model.safetensors");
  ASSERT_FALSE(exported.empty());
  EXPECT_TRUE(exported == testing::ReadText(Path("two-export") + "/model.safetensors"))
      << "the kept checkpoint's weights differ from a run that stopped at step 2";
}

}  // namespace
}  // namespace zt
