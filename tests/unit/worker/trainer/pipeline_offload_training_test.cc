// Optimizer offload under pipeline parallelism (issues 16 and 18): each stage's ranks step
// their own units' shards on the host (offload.optimizer CPU, ZeRO-Offload) or through the
// process's one swap store (NVME, ZeRO-Infinity's optimizer offload). PP2 × DP2 (GPT-2, tied:
// the wte copies' gradients summed before the host step) and TP2 × PP2 (Llama, GQA) against the
// same layout without offload: the same losses, gradient norms and final stage weights bit for
// bit, every rank's arenas equal to its plan, each stage's plan holding its own units' states in
// the pinned host pool or on NVMe, and a stopped run resuming from its checkpoint bit for bit.
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "tests/unit/worker/trainer/pipeline_runs.h"
#include "tests/unit/worker/trainer/small_sharded_job.h"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/memory_plan.h"

namespace zt {
namespace {

using testing::PipelineOutcome;
using zerotrain::JobSpec;
using zerotrain::OffloadConfig;

// A ring buffer holds the small model's largest unit transfer (a block's master weights or one
// state, 12,608 fp32 elements under 13 pages), and an NVMe unit's master and states together.
constexpr int64_t kRingBytes = 64 * 4096;
constexpr int kRingBuffers = 4;

class PipelineOffloadTrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TestScratchDir("zt-pp-offload-test");
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), testing::PatternTokens(), 32).ok());
    std::filesystem::create_directories(dir_ / "swap");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // tp × pp × dp ranks at ZeRO `zero` (optimizer offload needs stage ≥ 1), 1F1B over m = 4
  // micro-batches of one sequence.
  JobSpec Job(bool llama, int tp, int pp, int dp, int zero) {
    JobSpec job = testing::SmallShardedJob((dir_ / "train.bin").string(), tp * pp * dp, zero,
                                           /*micro_batch=*/1, /*accum=*/4);
    job.mutable_parallel()->set_tensor_parallel(tp);
    job.mutable_parallel()->set_pipeline_parallel(pp);
    job.mutable_parallel()->set_pipeline_schedule(zerotrain::ParallelConfig::ONE_F_ONE_B);
    job.mutable_train()->set_max_steps(6);
    if (llama) testing::MakeSmallGqaLlama(job);
    return job;
  }
  JobSpec Offloaded(JobSpec job, OffloadConfig::Device where) {
    job.mutable_offload()->set_optimizer(where);
    job.mutable_offload()->set_buffer_count(kRingBuffers);
    job.mutable_offload()->set_buffer_size(kRingBytes);
    if (where == OffloadConfig::NVME) job.mutable_offload()->set_nvme_path((dir_ / "swap").string());
    return job;
  }

  std::filesystem::path dir_;
};

struct Layout {
  bool llama;
  int tp, pp, dp, zero;
  std::string Name() const {
    return absl::StrCat(llama ? "llama" : "gpt2", " tp", tp, " x pp", pp, " x dp", dp, " zero-",
                        zero);
  }
};

constexpr Layout kLayouts[] = {{false, 1, 2, 2, 1}, {true, 1, 2, 2, 2}, {true, 2, 2, 1, 1}};

// The host step is the device step's kernels on the same shards in the same order, and the
// stage's schedule and reductions do not change with where the optimizer runs: bit for bit.
TEST_F(PipelineOffloadTrainingTest, OptimizerOffloadIsTheStagesDevicePathBitForBit) {
  for (const Layout& l : kLayouts) {
    const JobSpec plain = Job(l.llama, l.tp, l.pp, l.dp, l.zero);
    const PipelineOutcome reference = testing::RunPipelineRanks(plain, 6);
    ASSERT_TRUE(reference.status.ok()) << l.Name() << ": " << reference.status;
    for (const auto where : {OffloadConfig::CPU, OffloadConfig::NVME}) {
      const std::string what = absl::StrCat(l.Name(), " offload ", OffloadConfig::Device_Name(where));
      const PipelineOutcome got = testing::RunPipelineRanks(Offloaded(plain, where), 6);
      ASSERT_TRUE(got.status.ok()) << what << ": " << got.status;
      ASSERT_EQ(got.ranks.size(), reference.ranks.size()) << what;
      for (size_t r = 0; r < got.ranks.size(); ++r) {
        const testing::PipelineRankRun& mine = got.ranks[r];
        ASSERT_EQ(mine.losses.size(), 6u) << what << ", rank " << r;
        EXPECT_EQ(mine.losses, reference.ranks[r].losses) << what << ", rank " << r;
        EXPECT_EQ(mine.grad_norms, reference.ranks[r].grad_norms) << what << ", rank " << r;
        EXPECT_TRUE(mine.params == reference.ranks[r].params) << what << ", rank " << r;
        EXPECT_GT(mine.offloaded_bytes, 0) << what << ", rank " << r;
        EXPECT_TRUE(mine.unclaimed.empty()) << what << ": unused plan buffer "
                                            << mine.unclaimed.front();
        EXPECT_TRUE(mine.off_plan.empty()) << what << ", rank " << r << ": "
                                           << mine.off_plan.front();
      }
    }
  }
}

// A stage's offloaded states are checkpointed through the store that holds them (the host
// pool, or the swap store for NVME) and read back into it: PP2 × DP2 stopped after step 3 and
// resumed continues as the run that never stopped, bit for bit.
TEST_F(PipelineOffloadTrainingTest, OffloadedStagesResumeBitForBit) {
  for (const auto where : {OffloadConfig::CPU, OffloadConfig::NVME}) {
    const std::string what = absl::StrCat("offload ", OffloadConfig::Device_Name(where));
    auto job = [&](const std::string& dir) {
      JobSpec j = Offloaded(Job(/*llama=*/true, 1, 2, 2, 1), where);
      j.mutable_checkpoint()->set_dir((dir_ / dir).string());
      j.mutable_checkpoint()->set_interval_steps(3);
      return j;
    };
    const PipelineOutcome straight =
        testing::RunPipelineRanks(job(absl::StrCat("straight-", where)), 6);
    ASSERT_TRUE(straight.status.ok()) << what << ": " << straight.status;
    const JobSpec stopped = job(absl::StrCat("stopped-", where));
    const PipelineOutcome first = testing::RunPipelineRanks(stopped, 3);
    ASSERT_TRUE(first.status.ok()) << what << ": " << first.status;
    const PipelineOutcome second =
        testing::RunPipelineRanks(stopped, 6, stopped.checkpoint().dir());
    ASSERT_TRUE(second.status.ok()) << what << ": " << second.status;
    for (size_t r = 0; r < second.ranks.size(); ++r) {
      ASSERT_EQ(second.ranks[r].losses.size(), 3u) << what << ", rank " << r;
      const std::vector<double> tail(straight.ranks[r].losses.begin() + 3,
                                     straight.ranks[r].losses.end());
      EXPECT_EQ(second.ranks[r].losses, tail) << what << ", rank " << r;
      EXPECT_TRUE(second.ranks[r].params == straight.ranks[r].params) << what << ", rank " << r;
    }
  }
}

// The names of `plan`'s buffers in `category`, the offload ring's left out.
std::set<std::string> Named(const MemoryPlan& plan, MemoryCategory category) {
  std::set<std::string> names;
  for (const BufferSpec& b : plan.buffers) {
    if (b.category == category && !b.name.starts_with("offload.ring.")) names.insert(b.name);
  }
  return names;
}

// Each stage plans its own units' optimizer states off the device: CPU moves them whole into
// the pinned host pool beside the two ring buffers host-only offload uses and its own units'
// gradient shards' host copies; NVME leaves the ring
// alone in the pool and the states on NVMe, a stage's NVMe bytes at least its device states'
// (extents are rounded up to the swap store's alignment). The stages' states are different
// buffers (their own units').
TEST_F(PipelineOffloadTrainingTest, EachStagePlansItsOwnUnitsStatesOffTheDevice) {
  for (const Layout& l : kLayouts) {
    const JobSpec plain = ValidatedJob(Job(l.llama, l.tp, l.pp, l.dp, l.zero)).value();
    const JobSpec cpu = ValidatedJob(Offloaded(plain, OffloadConfig::CPU)).value();
    const JobSpec nvme = ValidatedJob(Offloaded(plain, OffloadConfig::NVME)).value();
    const int world = plain.parallel().world_size();
    std::vector<std::set<std::string>> stage_states(l.pp);
    for (int r = 0; r < world; ++r) {
      const std::string what = absl::StrCat(l.Name(), " rank ", r);
      const MemoryPlan device = PlanMemory(plain, r);
      const MemoryPlan host = PlanMemory(cpu, r);
      const MemoryPlan swapped = PlanMemory(nvme, r);
      const int64_t states = device.CategoryBytes(MemoryCategory::kOptimizerState);
      const std::set<std::string> names = Named(device, MemoryCategory::kOptimizerState);
      ASSERT_GT(states, 0) << what;
      for (const MemoryPlan* p : {&host, &swapped}) {
        EXPECT_EQ(p->CategoryBytes(MemoryCategory::kOptimizerState), 0) << what;
        EXPECT_EQ(p->DeviceBytes(), device.DeviceBytes() - states) << what;
      }
      // Beside the states, CPU offload's host copy of each of the stage's units' reduced
      // gradient shards (it comes down during the backward: worker/optim/gradient_downloads.h).
      std::set<std::string> host_names = names;
      int64_t host_grads = 0;
      for (const std::string& name : names) {
        host_names.insert(name.substr(0, name.rfind('.')) + ".grads.host");
      }
      for (const BufferSpec& b : host.buffers) {
        if (b.name.ends_with(".grads.host")) host_grads += b.bytes();
      }
      EXPECT_GT(host_grads, 0) << what;
      EXPECT_EQ(host.CategoryBytes(MemoryCategory::kPinnedHost),
                states + kRingBytes + host_grads)  // the ring: the parameters' one buffer
          << what;
      EXPECT_EQ(Named(host, MemoryCategory::kPinnedHost), host_names) << what;
      EXPECT_EQ(host.CategoryBytes(MemoryCategory::kNvme), 0) << what;
      EXPECT_EQ(swapped.CategoryBytes(MemoryCategory::kPinnedHost), kRingBuffers * kRingBytes)
          << what;
      EXPECT_GE(swapped.CategoryBytes(MemoryCategory::kNvme), states) << what;
      EXPECT_EQ(Named(swapped, MemoryCategory::kNvme), names) << what;
      const int stage = ParallelLayout::ForJob(plain, r).coordinates().pipeline;
      stage_states[stage].insert(names.begin(), names.end());
    }
    for (const std::string& name : stage_states[0]) {
      EXPECT_FALSE(stage_states[1].contains(name)) << l.Name() << ": " << name << " on both stages";
    }
  }
}

}  // namespace
}  // namespace zt
