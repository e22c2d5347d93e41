// Optimizer offload under pipeline parallelism (issues 16 and 18): each stage's ranks step
// their own units' shards on the host (offload.optimizer CPU, ZeRO-Offload) or through the
// process's one swap store (NVME, ZeRO-Infinity's optimizer offload). PP2 × DP2 (GPT-2, tied:
// the wte copies' gradients summed before the host step) and TP2 × PP2 (Llama, GQA) against the
// same layout without offload: the same losses, gradient norms and final stage weights bit for
// bit, every rank's arenas equal to its plan, each stage's plan holding its own units' states in
// the pinned host pool or on NVMe, and a stopped run resuming from its checkpoint bit for bit.
// At ZeRO-3 the stages' parameter shards offloaded too (offload.params CPU and NVME), the same
// checks against the layout with the shards on the device.
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
    if (where == OffloadConfig::NVME)
      job.mutable_offload()->set_nvme_path((dir_ / "swap").string());
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
      const std::string what =
          absl::StrCat(l.Name(), " offload ", OffloadConfig::Device_Name(where));
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
        EXPECT_TRUE(mine.unclaimed.empty())
            << what << ": unused plan buffer " << mine.unclaimed.front();
        EXPECT_TRUE(mine.off_plan.empty())
            << what << ", rank " << r << ": " << mine.off_plan.front();
      }
    }
  }
}

// A stage's offloaded states are checkpointed through the store that holds them (the host
// pool, or the swap store for NVME) and read back into it: PP2 × DP2 stopped after step 3 and
// resumed continues as the run that never stopped, bit for bit — at ZeRO-1 with the optimizer
// offloaded, and at ZeRO-3 (units gathered per use) with the parameter shards offloaded too.
TEST_F(PipelineOffloadTrainingTest, OffloadedStagesResumeBitForBit) {
  for (const auto where : {OffloadConfig::CPU, OffloadConfig::NVME}) {
    for (const bool params : {false, true}) {
      const std::string what =
          absl::StrCat("offload ", OffloadConfig::Device_Name(where), params ? " with params" : "");
      auto job = [&](const std::string& dir) {
        JobSpec j = Offloaded(Job(/*llama=*/true, 1, 2, 2, params ? 3 : 1), where);
        if (params) j.mutable_offload()->set_params(where);
        j.mutable_checkpoint()->set_dir((dir_ / dir).string());
        j.mutable_checkpoint()->set_interval_steps(3);
        return j;
      };
      const PipelineOutcome straight =
          testing::RunPipelineRanks(job(absl::StrCat("straight-", where, "-", params)), 6);
      ASSERT_TRUE(straight.status.ok()) << what << ": " << straight.status;
      const JobSpec stopped = job(absl::StrCat("stopped-", where, "-", params));
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
        // Swapped shards (params NVME) have no memory to compare: the exported model instead.
        EXPECT_TRUE(second.ranks[r].whole == straight.ranks[r].whole) << what << ", rank " << r;
      }
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

// Parameter offload on ZeRO-3 stages (offload.params CPU beside optimizer CPU, NVME beside
// optimizer NVME): each stage's own units' parameter shards live in the pinned host pool or
// the swap store and every gather — of the whole stage for the step (reshard_after_forward
// false) or of each unit per use (true) — first uploads the rank's shard from there into its
// slot of the gather buffer. The gathered units are the same bytes, so the training is the
// same layout's with the shards on the device, bit for bit: losses, norms and every rank's
// exported weights; each stage plans its own units' shards off the device (device bytes lower
// by exactly those), its arenas equal to the plan. (Resumed: OffloadedStagesResumeBitForBit.)
JobSpec WithParamOffload(JobSpec job, OffloadConfig::Device where) {
  job.mutable_offload()->set_params(where);
  return job;
}

TEST_F(PipelineOffloadTrainingTest, ParameterOffloadIsTheStagesDevicePathBitForBit) {
  struct Case {
    bool llama;
    zerotrain::ParallelConfig::PipelineSchedule schedule;
    bool reshard;
    int tp = 1;
  };
  for (const Case& c : {Case{false, zerotrain::ParallelConfig::ONE_F_ONE_B, true},
                        Case{false, zerotrain::ParallelConfig::ONE_F_ONE_B, false},
                        Case{true, zerotrain::ParallelConfig::INTERLEAVED, true},
                        Case{true, zerotrain::ParallelConfig::ONE_F_ONE_B, true, /*tp=*/2}}) {
    JobSpec plain = Job(c.llama, c.tp, 2, 2, /*zero=*/3);
    plain.mutable_parallel()->set_pipeline_schedule(c.schedule);
    plain.mutable_parallel()->set_reshard_after_forward(c.reshard);
    if (c.schedule == zerotrain::ParallelConfig::INTERLEAVED) {
      plain.mutable_parallel()->set_virtual_stages(2);
      plain.mutable_model()->set_n_layer(4);
    }
    const std::string layout =
        absl::StrCat(c.llama ? "llama" : "gpt2", c.tp > 1 ? " tp2 x" : "", " pp2 x dp2 zero-3 ",
                     zerotrain::ParallelConfig::PipelineSchedule_Name(c.schedule),
                     c.reshard ? " reshard" : " kept");
    for (const auto where : {OffloadConfig::CPU, OffloadConfig::NVME}) {
      const std::string what = absl::StrCat(layout, " params ", OffloadConfig::Device_Name(where));
      // The same optimizer offload on both sides: only where the parameters live differs.
      const JobSpec device = Offloaded(plain, where);
      const JobSpec offloaded = WithParamOffload(device, where);
      const PipelineOutcome reference = testing::RunPipelineRanks(device, 6);
      ASSERT_TRUE(reference.status.ok()) << what << ": " << reference.status;
      const PipelineOutcome got = testing::RunPipelineRanks(offloaded, 6);
      ASSERT_TRUE(got.status.ok()) << what << ": " << got.status;
      ASSERT_EQ(got.ranks.size(), reference.ranks.size()) << what;
      for (size_t r = 0; r < got.ranks.size(); ++r) {
        const testing::PipelineRankRun& mine = got.ranks[r];
        const std::string rank = absl::StrCat(what, ", rank ", r);
        ASSERT_EQ(mine.losses.size(), 6u) << rank;
        EXPECT_EQ(mine.losses, reference.ranks[r].losses) << rank;
        EXPECT_EQ(mine.grad_norms, reference.ranks[r].grad_norms) << rank;
        EXPECT_TRUE(mine.whole == reference.ranks[r].whole) << rank;
        if (where == OffloadConfig::CPU) {
          EXPECT_TRUE(mine.params == reference.ranks[r].params) << rank;  // the host shards
        }
        EXPECT_TRUE(mine.unclaimed.empty())
            << rank << ": unused plan buffer " << mine.unclaimed.front();
        EXPECT_TRUE(mine.off_plan.empty()) << rank << ": " << mine.off_plan.front();

        // The stage's plan: its own units' "<u>.params" shards moved off the device whole.
        const JobSpec& job = got.job;
        const MemoryPlan on_device = PlanMemory(reference.job, static_cast<int>(r));
        const MemoryPlan off_device = PlanMemory(job, static_cast<int>(r));
        const MemoryCategory tier =
            where == OffloadConfig::CPU ? MemoryCategory::kPinnedHost : MemoryCategory::kNvme;
        std::set<std::string> shards, moved;
        int64_t shard_bytes = 0;
        for (const BufferSpec& b : on_device.buffers) {
          if (!b.name.ends_with(".params")) continue;
          shards.insert(b.name);
          shard_bytes += PlacedBytes(b);
        }
        for (const BufferSpec& b : off_device.buffers) {
          if (b.name.ends_with(".params") && b.category == tier) moved.insert(b.name);
        }
        std::set<std::string> own;
        for (const UnitLayout& u : mine.layout.units) own.insert(u.name + ".params");
        EXPECT_EQ(shards, own) << rank;
        EXPECT_EQ(moved, own) << rank;
        // With offload.params CPU a stage that gathers per use (reshard_after_forward) gains
        // the staging slots its later gathers' shards go up into ahead (prefetch_units + 1,
        // ShardingEngine::UploadAhead); one that gathers its units whole for the step uploads
        // into their own buffers.
        int64_t staging = 0, staging_slots = 0;
        for (const BufferSpec& b : off_device.buffers) {
          if (!b.name.starts_with("param_upload.")) continue;
          EXPECT_EQ(b.category, MemoryCategory::kParameters) << rank << " " << b.name;
          staging += PlacedBytes(b);
          ++staging_slots;
        }
        EXPECT_EQ(staging_slots, where == OffloadConfig::CPU && c.reshard
                                     ? job.parallel().prefetch_units() + 1
                                     : 0)
            << rank;
        EXPECT_EQ(off_device.DeviceBytes(), on_device.DeviceBytes() - shard_bytes + staging)
            << rank;
        // The uploads, from the steps' records: none with the shards on the device.
        EXPECT_EQ(reference.ranks[r].param_upload_bytes, 0) << rank;
        if (where == OffloadConfig::CPU && c.reshard) {
          // Per use: the pass's first gathers go up at its start, the later ones a use before
          // their gather; one announced while an earlier use of the schedule still holds its
          // unit uploads at its gather.
          EXPECT_GT(mine.param_uploads_ahead, mine.param_uploads_at_gather) << rank;
          EXPECT_GT(mine.param_upload_bytes, 0) << rank;
          // GPT-2's last stage under 1F1B (block 1 and the kept head): every gather ahead, the
          // block's re-gather at each micro-batch boundary, announced while its backward's
          // gather still reads the unit's staging slot, into a second slot.
          if (!c.llama && c.schedule == zerotrain::ParallelConfig::ONE_F_ONE_B &&
              ParallelLayout::ForJob(job, static_cast<int>(r)).coordinates().pipeline == 1) {
            EXPECT_EQ(mine.param_uploads_at_gather, 0) << rank;
          }
        } else if (where == OffloadConfig::CPU) {
          // Whole for the step: each own shard once a step, at the step's gathers (nothing
          // computes before them that an upload could hide behind).
          int64_t own_shards = 0;
          for (const BufferSpec& b : off_device.buffers) {
            if (b.name.ends_with(".params")) own_shards += b.bytes();
          }
          EXPECT_EQ(mine.param_upload_bytes, 6 * own_shards) << rank;
          EXPECT_EQ(mine.param_uploads_ahead, 0) << rank;
          EXPECT_EQ(mine.param_uploads_at_gather, 6 * static_cast<int64_t>(own.size())) << rank;
        } else if (c.reshard) {
          // offload.params NVME per use: the pass's first gathers' shards are read at its
          // start (ShardingEngine::BeginStagePass), the later ones a use or more ahead (rule
          // 4), so no gather reads its shard itself (the ring's two free buffers suffice: each
          // gather frees its buffer as it takes the shard).
          EXPECT_EQ(mine.nvme.shard_reads_at_gather, 0) << rank;
          EXPECT_GT(mine.nvme.shard_reads_ahead, 0) << rank;
        } else {
          // offload.params NVME whole for the step: each own shard read once a step, ahead of
          // its gather — the first prefetch_units + 1 at the step's start, each later one as
          // the gather prefetch_units + 1 units before it takes its read (GatherStageUnits).
          EXPECT_EQ(mine.nvme.shard_reads_at_gather, 0) << rank;
          EXPECT_EQ(mine.nvme.shard_reads_ahead, 6 * static_cast<int64_t>(own.size())) << rank;
        }
      }
    }
  }
}

}  // namespace
}  // namespace zt
