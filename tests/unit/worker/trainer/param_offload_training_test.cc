// Parameter offload at ZeRO stage 3 (offload.params CPU and NVME, worker/shard/sharding_engine.h):
// with CPU, each
// rank's "<unit>.params" shard lives in the pinned host pool, is uploaded through the rank's
// copy engine into its slot of the unit's gather buffer before every all-gather, and is
// updated in place by the host optimizer (offload.optimizer CPU or NVME). On the CPU such a run
// is the same job without any offload bit for bit — losses, final weights, every checkpointed
// buffer — for AdamW and 8-bit AdamW, fp32 and bf16, on 1 and 2 ranks; the device arenas are
// the plan's device categories, smaller by exactly the parameter shards; the shards cross the
// copy engine once per gather and never on the optimizer's way; checkpoints resume bit for bit.
// With NVME (beside optimizer NVME) the shards are swapped with the states: the same checks.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/status_macros.h"
#include "nlohmann/json.hpp"
#include "offload/io_engine.h"
#include "offload/swap_env.h"
#include "tests/unit/worker/trainer/offload_runs.h"
#include "worker/job/job_loading.h"
#include "worker/model/param_layout.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/memory_plan.h"
#include "worker/train/trainer.h"

namespace zt {
namespace {

using namespace offload_testing;  // NOLINT: the harness's names

class ParamOffloadTrainingTest : public OffloadRunTest {};

// Stage 3 with the parameters in host memory and the optimizer on the host or NVMe.
struct Case {
  OptimizerConfig::Type type;
  PrecisionConfig::DType dtype;
  OffloadConfig::Device optimizer;
  int world;
};

std::string Name(const Case& c) {
  return absl::StrCat(OptimizerConfig::Type_Name(c.type), " ", PrecisionConfig::DType_Name(c.dtype),
                      " optimizer ", OffloadConfig::Device_Name(c.optimizer), " world ", c.world);
}

// The copy engine's traffic of one step of rank `rank` of `job` (tied GPT-2, stage 3,
// reshard_after_forward) with the parameter shards off the device, whose elements are
// `element` bytes: each unit's reduced gradient shard comes down to the host optimizer, and
// each all-gather uploads the shard first — the tied embedding and the head once a step
// (gathered for the whole step, and across the forward/backward turn), each block twice.
// `reference` is the same job with the parameters on the device (its optimizer offloaded the
// same way), which also moves the parameters around its host update and uploads nothing for
// its gathers: what it moved beyond those is what the offloaded run moves beyond its own.
void ExpectOneUploadPerGather(const JobSpec& job, const RunResult& run, const RunResult& reference,
                              int rank, int64_t element, const std::string& what) {
  const ModelLayout layout = BuildModelLayout(job.model());
  ASSERT_TRUE(layout.tied_embeddings) << "the gather count assumes the tied GPT-2";
  ASSERT_TRUE(job.parallel().reshard_after_forward());
  const ShardGeometry geometry = ParallelLayout::ForJob(job, rank).shard();
  int64_t uploads = 0, gathers = 0, grads_down = 0;
  const int head = static_cast<int>(layout.units.size()) - 1;
  for (int u = 0; u <= head; ++u) {
    const UnitShard s = ShardOf(layout.units[u].numel, geometry);
    const int unit_gathers = (u == 0 || u == head) ? 1 : 2;
    uploads += unit_gathers * s.shard_numel * element;
    gathers += unit_gathers;
    grads_down += (s.owned.end - s.owned.begin) * element;
  }
  const StepRecord& last = run.last_step[rank];
  // The step's record reports those uploads (metrics.jsonl, zt_offload_bytes_total's
  // param_upload) — with host shards every one made ahead of its gather (with swapped ones the
  // reads go ahead, the swap's counts) —; the reference uploads nothing.
  EXPECT_EQ(last.param_upload_bytes, uploads) << what << " rank " << rank;
  const bool on_host = job.offload().params() == OffloadConfig::CPU;
  EXPECT_EQ(last.param_uploads_ahead, on_host ? gathers : 0) << what << " rank " << rank;
  EXPECT_EQ(last.param_uploads_at_gather, 0) << what << " rank " << rank;
  EXPECT_GE(last.param_upload_s, 0) << what << " rank " << rank;
  EXPECT_EQ(reference.last_step[rank].param_upload_bytes, 0) << what << " rank " << rank;
  EXPECT_EQ(reference.last_step[rank].param_uploads_ahead, 0) << what << " rank " << rank;
  EXPECT_EQ(last.offload_bytes_to_host, grads_down) << what << ": gradients only";
  EXPECT_EQ(last.offload_bytes_to_device, 0) << what << ": nothing goes up after the update";
  const StepRecord& other = reference.last_step[rank];
  EXPECT_EQ(run.crossing_bytes_last_step[rank],
            reference.crossing_bytes_last_step[rank] - other.offload_bytes_to_host -
                other.offload_bytes_to_device + grads_down + uploads)
      << what << " rank " << rank;
}

// The overlap of offload.params NVME (PrefetchCoordinator's rule 4 with the NVMe optimizer's
// ring, and its first unit read at the end of the backward), counted over `steps` steps of
// one forward-backward pass each of the tied GPT-2 (reshard_after_forward): every gather finds
// its shard read ahead — those of the first prefetch_units + 1 uses, which a pass issues
// together at its start, were queued at the step's start (ShardingEngine::
// ReadFirstGathersAhead, before the gradients are zeroed and the batch uploaded), every later
// one max(prefetch_units, 1) uses ahead of its gather (the ring's free buffers hold them). Each
// step's optimizer found its first unit's reads queued.
void ExpectReadsAhead(const JobSpec& job, const NvmeOptimizer::Stats& stats, int64_t steps,
                      const std::string& what) {
  const int n_units = static_cast<int>(BuildModelLayout(job.model()).units.size());
  const int k = job.parallel().prefetch_units();
  ASSERT_LE(std::max(k + 1, 1), job.offload().buffer_count() - 2) << what << ": the ring's room";
  // The pass's uses: the embedding (kept, tied), the blocks, the head (kept), then the head
  // again (no gather) and the blocks back.
  std::vector<bool> gathers = {true};
  for (int u = 1; u < n_units; ++u) gathers.push_back(true);
  gathers.push_back(false);
  for (int u = n_units - 2; u >= 1; --u) gathers.push_back(true);
  int64_t all = 0;
  for (int j = 0; j < static_cast<int>(gathers.size()); ++j) all += gathers[j];
  EXPECT_EQ(stats.shard_reads_at_gather, 0) << what << ": the first gathers read ahead too";
  EXPECT_EQ(stats.shard_reads_ahead, steps * all) << what;
  EXPECT_EQ(stats.first_unit_reads_ahead, steps) << what;
}

TEST_F(ParamOffloadTrainingTest, ParamsCpuEqualsNoOffloadBitForBit) {
  for (OptimizerConfig::Type type : {OptimizerConfig::ADAMW, OptimizerConfig::ADAMW_8BIT}) {
    for (PrecisionConfig::DType dtype : {PrecisionConfig::FP32, PrecisionConfig::BF16}) {
      for (OffloadConfig::Device optimizer : {OffloadConfig::CPU, OffloadConfig::NVME}) {
        for (int world : {1, 2}) {
          const Case c{type, dtype, optimizer, world};
          const std::string what = Name(c);
          const RunResult offloaded = Train(Job(world, 3, type, dtype, optimizer, OffloadConfig::CPU), 4);
          const RunResult plain =
              Train(Job(world, 3, type, dtype, OffloadConfig::NONE, OffloadConfig::NONE), 4);
          ExpectSameRun(offloaded, plain, what);
          ASSERT_EQ(offloaded.losses.size(), 4u) << what;
          EXPECT_TRUE(offloaded.unclaimed.empty()) << what << ": " << offloaded.unclaimed[0];
          // The run trained the host shards: they are not what step 0 initialised.
          EXPECT_NE(offloaded.losses.front(), offloaded.losses.back()) << what;
          for (int r = 0; r < world; ++r) {
            for (const BufferSpec& b : offloaded.plans[r].buffers) {
              if (b.name.ends_with(".params")) {
                EXPECT_EQ(b.category, MemoryCategory::kPinnedHost) << what << " " << b.name;
              }
            }
          }
        }
      }
    }
  }
}

// What the device holds is what the plan's device categories say: the optimizer-offload run's
// device bytes less exactly the parameter shards, which moved to the pinned pool. Each step,
// the shards cross the copy engine once per all-gather (the tied embedding and the head once,
// each block twice: forward and backward) and the gradient shards come down; no parameter
// goes down or up around the host update.
TEST_F(ParamOffloadTrainingTest, DeviceHoldsGatheredUnitsAndCopiesAreOnePerGather) {
  for (PrecisionConfig::DType dtype : {PrecisionConfig::FP32, PrecisionConfig::BF16}) {
    const std::string what = PrecisionConfig::DType_Name(dtype);
    std::vector<CountedRank> counted(2), counted_optimizer_only(2);
    const JobSpec spec =
        Job(2, 3, OptimizerConfig::ADAMW, dtype, OffloadConfig::CPU, OffloadConfig::CPU);
    const RunResult offloaded = Train(spec, 2, "", &counted);
    const RunResult optimizer_only =
        Train(Job(2, 3, OptimizerConfig::ADAMW, dtype, OffloadConfig::CPU, OffloadConfig::NONE), 2,
              "", &counted_optimizer_only);
    ExpectSameRun(offloaded, optimizer_only, what);
    const JobSpec job = ValidatedJob(spec).value();
    const ModelLayout layout = BuildModelLayout(job.model());
    ASSERT_TRUE(layout.tied_embeddings) << "the gather count below assumes the tied GPT-2";
    ASSERT_TRUE(job.parallel().reshard_after_forward());
    const int64_t element = DTypeSize(dtype == PrecisionConfig::BF16 ? DType::kBF16 : DType::kF32);
    for (int r = 0; r < 2; ++r) {
      const MemoryPlan& plan = offloaded.plans[r];
      const MemoryPlan& before = optimizer_only.plans[r];
      int64_t shards = 0;
      for (const BufferSpec& b : before.buffers) {
        if (b.name.ends_with(".params")) shards += PlacedBytes(b);
      }
      EXPECT_GT(shards, 0) << what;
      // What the device gains: the staging slots the later gathers' shards go up into a use
      // before their gather is issued (prefetch_units + 1 of the largest shard, memory_plan.cc).
      int64_t staging = 0, staging_slots = 0;
      for (const BufferSpec& b : plan.buffers) {
        if (b.name.starts_with("param_upload.")) {
          EXPECT_EQ(b.category, MemoryCategory::kParameters) << what << " " << b.name;
          staging += PlacedBytes(b);
          ++staging_slots;
        }
      }
      EXPECT_EQ(staging_slots, job.parallel().prefetch_units() + 1) << what;
      EXPECT_EQ(plan.DeviceBytes(), before.DeviceBytes() - shards + staging) << what;
      // The shards come to the host, and the ring buffer the parameters went up through goes:
      // the update writes the host shards in place (memory_plan.cc).
      EXPECT_EQ(plan.CategoryBytes(MemoryCategory::kPinnedHost),
                before.CategoryBytes(MemoryCategory::kPinnedHost) + shards -
                    job.offload().buffer_size())
          << what;
      EXPECT_FALSE(std::any_of(plan.buffers.begin(), plan.buffers.end(), [](const BufferSpec& b) {
        return b.name.starts_with("offload.ring.");
      })) << what;
      // The device's parameters are the gather buffers and the staging slots alone.
      int64_t gather = 0;
      for (const BufferSpec& b : plan.buffers) {
        if (b.category == MemoryCategory::kParameters) {
          EXPECT_TRUE(b.name.starts_with("gather.") || b.name.starts_with("param_upload."))
              << what << " " << b.name;
          gather += PlacedBytes(b);
        }
      }
      EXPECT_EQ(plan.CategoryBytes(MemoryCategory::kParameters), gather) << what;
      // Measured: the arenas are the plan's categories; the device allocator was asked for
      // the device categories and nothing else.
      for (int c = 0; c < kMemoryCategoryCount; ++c) {
        const auto category = static_cast<MemoryCategory>(c);
        EXPECT_EQ(offloaded.arena_bytes[r][c], plan.CategoryBytes(category))
            << what << " " << MemoryCategoryName(category);
        EXPECT_EQ(counted[r].device_bytes[c],
                  IsDeviceCategory(category) ? plan.CategoryBytes(category) : 0)
            << what << " " << MemoryCategoryName(category);
      }
      EXPECT_EQ(counted[r].pinned_bytes_while_training,
                (plan.CategoryBytes(MemoryCategory::kPinnedHost) + 4095) / 4096 * 4096)
          << what;
      ExpectOneUploadPerGather(job, offloaded, optimizer_only, r, element, what);
    }
  }
}

// A checkpoint of a run whose parameters are host shards resumes bit for bit, and equals the
// run without offload; with 8-bit AdamW over NVMe-swapped states too.
TEST_F(ParamOffloadTrainingTest, ParamsCpuCheckpointsResumeBitForBit) {
  for (const Case& c : {Case{OptimizerConfig::ADAMW, PrecisionConfig::BF16, OffloadConfig::CPU, 2},
                        Case{OptimizerConfig::ADAMW_8BIT, PrecisionConfig::FP32,
                             OffloadConfig::NVME, 2},
                        Case{OptimizerConfig::ADAMW, PrecisionConfig::FP32, OffloadConfig::NVME,
                             1}}) {
    const std::string what = Name(c);
    ExpectStopAndResumeBitForBit(
        [&](bool offloaded, const std::string& dir) {
          JobSpec j = offloaded ? Job(c.world, 3, c.type, c.dtype, c.optimizer, OffloadConfig::CPU)
                                : Job(c.world, 3, c.type, c.dtype, OffloadConfig::NONE);
          j.mutable_checkpoint()->set_dir((dir_ / ("params " + what + dir)).string());
          j.mutable_checkpoint()->set_interval_steps(2);
          return j;
        },
        what);
  }
}

// offload.params NVME beside offload.optimizer NVME (ZeRO-Infinity): each "<unit>.params" shard
// is one more extent of the unit in the swap store, updated in the ring with the states and
// committed in their generation; every gather reads the committed shard and uploads it. The
// run is the same job without offload bit for bit; the host memory is the ring alone, the
// device the gather buffers; each step swaps the plan's NVMe bytes in and out once (the
// optimizer's pass) and reads each shard once per gather besides.
TEST_F(ParamOffloadTrainingTest, ParamsNvmeEqualsNoOffloadBitForBit) {
  for (OptimizerConfig::Type type : {OptimizerConfig::ADAMW, OptimizerConfig::ADAMW_8BIT}) {
    for (PrecisionConfig::DType dtype : {PrecisionConfig::FP32, PrecisionConfig::BF16}) {
      for (int world : {1, 2}) {
        const Case c{type, dtype, OffloadConfig::NVME, world};
        const std::string what = "params NVME " + Name(c);
        std::vector<CountedRank> counted(world), counted_states_only(world);
        const RunResult swapped = Train(
            Job(world, 3, type, dtype, OffloadConfig::NVME, OffloadConfig::NVME), 4, "", &counted);
        const RunResult states_only =
            Train(Job(world, 3, type, dtype, OffloadConfig::NVME, OffloadConfig::NONE), 4, "",
                  &counted_states_only);
        const RunResult plain =
            Train(Job(world, 3, type, dtype, OffloadConfig::NONE, OffloadConfig::NONE), 4);
        ExpectSameRun(swapped, plain, what);
        ASSERT_EQ(swapped.losses.size(), 4u) << what;
        EXPECT_TRUE(swapped.unclaimed.empty()) << what << ": " << swapped.unclaimed[0];
        const JobSpec job =
            ValidatedJob(Job(world, 3, type, dtype, OffloadConfig::NVME, OffloadConfig::NVME))
                .value();
        const ModelLayout layout = BuildModelLayout(job.model());
        const int64_t element =
            DTypeSize(dtype == PrecisionConfig::BF16 ? DType::kBF16 : DType::kF32);
        for (int r = 0; r < world; ++r) {
          const MemoryPlan& plan = swapped.plans[r];
          int64_t logical = 0, params = 0;
          for (const BufferSpec& b : plan.buffers) {
            if (b.category == MemoryCategory::kNvme) logical += b.bytes();
            if (b.name.ends_with(".params")) {
              EXPECT_EQ(b.category, MemoryCategory::kNvme) << what << " " << b.name;
              params += PlacedBytes(b);
            }
          }
          EXPECT_EQ(plan.CategoryBytes(MemoryCategory::kNvme),
                    states_only.plans[r].CategoryBytes(MemoryCategory::kNvme) + params)
              << what;
          EXPECT_EQ(plan.DeviceBytes(),
                    states_only.plans[r].DeviceBytes() -
                        states_only.plans[r].CategoryBytes(MemoryCategory::kParameters) +
                        plan.CategoryBytes(MemoryCategory::kParameters))
              << what;
          EXPECT_EQ(plan.CategoryBytes(MemoryCategory::kPinnedHost),
                    job.offload().buffer_count() * job.offload().buffer_size())
              << what << ": the ring and nothing else";
          for (int cat = 0; cat < kMemoryCategoryCount; ++cat) {
            const auto category = static_cast<MemoryCategory>(cat);
            EXPECT_EQ(swapped.arena_bytes[r][cat],
                      category == MemoryCategory::kNvme ? 0 : plan.CategoryBytes(category))
                << what << " " << MemoryCategoryName(category);
            EXPECT_EQ(counted[r].device_bytes[cat],
                      IsDeviceCategory(category) ? plan.CategoryBytes(category) : 0)
                << what << " " << MemoryCategoryName(category);
          }
          // The optimizer's pass swaps every swapped buffer (shards included) in and out, and
          // each gather reads its unit's shard once more: the tied embedding and the head once
          // a step, each block twice (forward and backward).
          const int head = static_cast<int>(layout.units.size()) - 1;
          int64_t gathered = 0;
          for (int u = 0; u <= head; ++u) {
            const std::string name = layout.units[u].name + ".params";
            for (const BufferSpec& b : plan.buffers) {
              if (b.name == name) gathered += ((u == 0 || u == head) ? 1 : 2) * b.bytes();
            }
          }
          EXPECT_EQ(swapped.last_step[r].swap_bytes_in, logical + gathered)
              << what << " rank " << r;
          EXPECT_EQ(swapped.last_step[r].swap_bytes_out, logical) << what << " rank " << r;
          ExpectReadsAhead(job, swapped.nvme_stats[r], /*steps=*/4, what);
          ExpectOneUploadPerGather(job, swapped, states_only, r, element, what);
        }
      }
    }
  }
}

// With gradient accumulation a step makes several passes over the same committed shards: the
// reads of each later pass's first gathers are queued as the previous pass ends
// (ShardingEngine::ReadFirstGathersAhead between micro-batches), so no gather of any pass reads
// its shard itself, and the run is the job without offload bit for bit.
TEST_F(ParamOffloadTrainingTest, ParamsNvmeReadsEachMicroBatchsFirstGathersAhead) {
  auto job = [&](OffloadConfig::Device device) {
    JobSpec j = Job(2, 3, OptimizerConfig::ADAMW, PrecisionConfig::FP32, device, device);
    j.mutable_train()->set_micro_batch_size(1);
    j.mutable_train()->set_grad_accum_steps(2);
    return j;
  };
  const RunResult swapped = Train(job(OffloadConfig::NVME), 3);
  const RunResult plain = Train(job(OffloadConfig::NONE), 3);
  ExpectSameRun(swapped, plain, "2 micro-batches a step");
  const JobSpec validated = ValidatedJob(job(OffloadConfig::NVME)).value();
  const int n_units = static_cast<int>(BuildModelLayout(validated.model()).units.size());
  // Gathers a pass: the tied embedding and the head once, each block twice; two passes a step.
  const int64_t gathers = 2 + 2 * (n_units - 2);
  for (int r = 0; r < 2; ++r) {
    const NvmeOptimizer::Stats& stats = swapped.nvme_stats[r];
    EXPECT_EQ(stats.shard_reads_at_gather, 0) << r;
    EXPECT_EQ(stats.shard_reads_ahead, 3 * 2 * gathers) << r;
  }
}

// ZeRO-3 without reshard_after_forward off a pipeline (1 rank and DP2, 1 and 2 micro-batches):
// each pass gathers every unit once, in its forward, and keeps it to its backward, so with
// offload.params NVME each pass reads every shard once — the first prefetch_units + 1 at the
// step's start or between micro-batches (ReadFirstGathersAhead), the later ones announced ahead
// of their gathers (PrefetchCoordinator rule 4): none at the gather. The run is the job with
// the shards on the device bit for bit.
TEST_F(ParamOffloadTrainingTest, ParamsNvmeKeptUnitsReadEveryShardAhead) {
  for (int world : {1, 2}) {
    for (int accum : {1, 2}) {
      auto job = [&](OffloadConfig::Device device) {
        JobSpec j = Job(world, 3, OptimizerConfig::ADAMW, PrecisionConfig::FP32, device, device);
        j.mutable_parallel()->set_reshard_after_forward(false);
        j.mutable_train()->set_micro_batch_size(4 / world / accum);
        j.mutable_train()->set_grad_accum_steps(accum);
        return j;
      };
      const std::string what = absl::StrCat("world ", world, ", ", accum, " micro-batches");
      const RunResult swapped = Train(job(OffloadConfig::NVME), 3);
      const RunResult plain = Train(job(OffloadConfig::NONE), 3);
      ExpectSameRun(swapped, plain, what);
      const JobSpec validated = ValidatedJob(job(OffloadConfig::NVME)).value();
      const int64_t n_units = BuildModelLayout(validated.model()).units.size();
      for (int r = 0; r < world; ++r) {
        const NvmeOptimizer::Stats& stats = swapped.nvme_stats[r];
        EXPECT_EQ(stats.shard_reads_at_gather, 0) << what << " rank " << r;
        EXPECT_EQ(stats.shard_reads_ahead, 3 * accum * n_units) << what << " rank " << r;
      }
    }
  }
}

// Trainer::Evaluate called between steps outside Run (as tests and embedders call it) has no
// line of its own: its uploads (and with offload.params NVME its swap reads) are reported in
// the next step's record. One rank, CPU and NVME: step 2 after an evaluation of one
// micro-batch is step 2 without it plus exactly one upload (and read) of each unit's shard,
// with the same loss.
TEST_F(ParamOffloadTrainingTest, EvaluationBetweenStepsCountsInTheNextStepsLine) {
  for (OffloadConfig::Device params : {OffloadConfig::CPU, OffloadConfig::NVME}) {
    const std::string what = OffloadConfig::Device_Name(params);
    JobSpec spec = Job(1, 3, OptimizerConfig::ADAMW, PrecisionConfig::FP32, params, params);
    spec.mutable_data()->add_val((dir_ / "train.bin").string());
    spec.mutable_train()->set_eval_interval(100);  // Run would never evaluate: Step alone does
    spec.mutable_train()->set_eval_steps(1);
    const JobSpec job = ValidatedJob(spec).value();
    struct Second {
      StepRecord record;
      int64_t shard_bytes = 0;
    };
    auto second_step = [&](bool evaluate) -> absl::StatusOr<Second> {
      InProcessStore store;
      ZT_ASSIGN_OR_RETURN(std::shared_ptr<offload::SwapStore> swap,
                          testing::OpenTestSwapStore(job));
      TrainOptions options;
      options.store = &store;
      options.swap_store = swap.get();
      ZT_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(job, options));
      ZT_RETURN_IF_ERROR(t->Step().status());
      if (evaluate) ZT_RETURN_IF_ERROR(t->Evaluate().status());
      Second out;
      ZT_ASSIGN_OR_RETURN(out.record, t->Step());
      for (const UnitLayout& unit : BuildModelLayout(job.model()).units) {
        for (const BufferSpec& b : t->plan().buffers) {
          if (b.name == unit.name + ".params") out.shard_bytes += b.bytes();
        }
      }
      return out;
    };
    const absl::StatusOr<Second> with = second_step(true);
    const absl::StatusOr<Second> without = second_step(false);
    ASSERT_TRUE(with.ok()) << what << ": " << with.status();
    ASSERT_TRUE(without.ok()) << what << ": " << without.status();
    const StepRecord& a = with->record;
    const StepRecord& b = without->record;
    ASSERT_GT(with->shard_bytes, 0) << what;
    EXPECT_EQ(a.loss, b.loss) << what << ": evaluating changes no step";
    EXPECT_EQ(a.param_upload_bytes, b.param_upload_bytes + with->shard_bytes) << what;
    const int64_t units = BuildModelLayout(job.model()).units.size();
    EXPECT_EQ(a.param_uploads_ahead + a.param_uploads_at_gather,
              b.param_uploads_ahead + b.param_uploads_at_gather +
                  (params == OffloadConfig::CPU ? units : 0))
        << what;
    if (params == OffloadConfig::NVME) {
      EXPECT_EQ(a.swap_bytes_in, b.swap_bytes_in + with->shard_bytes) << what;
      EXPECT_EQ(a.swap_bytes_out, b.swap_bytes_out) << what << ": evaluation writes nothing";
    }
  }
}

// offload.params CPU uploads every gather's host shard ahead of the gather, off the compute
// thread: a pass's first prefetch_units + 1 gathers at the step's start or between micro-batches
// into the slots they will take (ShardingEngine::ReadFirstGathersAhead), every later one while
// the use before its gather's issue computes, into a staging slot (PrefetchCoordinator rule 5,
// ShardingEngine::UploadAhead). Counted per gather, so one upload made at a gather fails it.
// What the lookahead cannot reach, and so uploads at the gather: a use announced while an
// earlier use still holds its unit (its gather comes at its own use, not one use on), which
// with the pass below needs prefetch_units ≥ 3 (the last block's forward and backward uses are
// three apart) — hence the bound on k — and no staging slot free, which k + 1 slots rule out.
// Each run is the job without offload bit for bit (fp32 and bf16, 1 and 2 micro-batches,
// activation checkpointing, reshard_after_forward on and off, 2 ranks), and its arenas are its
// plan, staging slots included.
TEST_F(ParamOffloadTrainingTest, ParamsCpuUploadsEveryGatherAhead) {
  for (PrecisionConfig::DType dtype : {PrecisionConfig::FP32, PrecisionConfig::BF16}) {
    for (bool reshard : {true, false}) {
      for (int accum : {1, 2}) {
        auto job = [&](OffloadConfig::Device device) {
          JobSpec j = Job(2, 3, OptimizerConfig::ADAMW, dtype, device, device);
          j.mutable_train()->set_micro_batch_size(accum == 1 ? 2 : 1);
          j.mutable_train()->set_grad_accum_steps(accum);
          j.mutable_parallel()->set_reshard_after_forward(reshard);
          // Checkpointing recomputes a block's forward inside its backward use, from the
          // parameters that use acquired: with 2 micro-batches, to show it adds no gather.
          j.mutable_memory()->set_activation_checkpointing(
              accum == 2 ? zerotrain::MemoryConfig::FULL : zerotrain::MemoryConfig::NONE);
          return j;
        };
        const std::string what =
            absl::StrCat(PrecisionConfig::DType_Name(dtype), " reshard_after_forward ", reshard,
                         ", ", accum, " micro-batches a step");
        const RunResult offloaded = Train(job(OffloadConfig::CPU), 3);
        const RunResult plain = Train(job(OffloadConfig::NONE), 3);
        ASSERT_TRUE(offloaded.status.ok()) << what << ": " << offloaded.status;
        ExpectSameRun(offloaded, plain, what);
        EXPECT_TRUE(offloaded.unclaimed.empty()) << what << ": " << offloaded.unclaimed[0];
        const JobSpec validated = ValidatedJob(job(OffloadConfig::CPU)).value();
        const int n_units = static_cast<int>(BuildModelLayout(validated.model()).units.size());
        const int k = validated.parallel().prefetch_units();
        ASSERT_GE(k, 1) << what << ": the test needs a pooled unit among the first gathers";
        ASSERT_LE(k, 2) << what << ": beyond, the last block's backward gather uploads at itself";
        ASSERT_LT(k + 1, n_units) << what << ": the test needs gathers after the first ones";
        // Gathers a pass: with reshard_after_forward the tied embedding and the head once,
        // each block twice; without it every unit once (kept from its forward to its backward).
        const int64_t gathers = reshard ? 2 + 2 * (n_units - 2) : n_units;
        const int64_t passes = 3 * accum;
        for (int r = 0; r < 2; ++r) {
          EXPECT_EQ(offloaded.param_uploads_ahead[r], passes * gathers) << what << " rank " << r;
          EXPECT_EQ(offloaded.param_uploads_at_gather[r], 0) << what << " rank " << r;
          EXPECT_EQ(plain.param_uploads_ahead[r] + plain.param_uploads_at_gather[r], 0)
              << what << ": nothing is uploaded with the shards on the device";
          // Arenas = plan: every category, the staging slots among the parameters.
          const MemoryPlan& plan = offloaded.plans[r];
          EXPECT_TRUE(std::any_of(plan.buffers.begin(), plan.buffers.end(),
                                  [](const BufferSpec& b) { return b.name == "param_upload.0"; }))
              << what;
          for (int c = 0; c < kMemoryCategoryCount; ++c) {
            const auto category = static_cast<MemoryCategory>(c);
            EXPECT_EQ(offloaded.arena_bytes[r][c], plan.CategoryBytes(category))
                << what << " " << MemoryCategoryName(category) << " rank " << r;
          }
        }
      }
    }
  }
}

// metrics.jsonl's step lines carry the parameter shards' uploads: with offload.params CPU
// every line has the bytes the plan's gathers upload a step — each unit's shard (the
// "<unit>.params" buffer of the pinned pool, whose size the plan fixed) once per gather: the
// tied embedding and the head once a step, each block twice (forward and backward) — all of
// them ahead; without offload every line says 0.
TEST_F(ParamOffloadTrainingTest, ParamsCpuMetricsLinesCarryTheUploads) {
  for (OffloadConfig::Device params : {OffloadConfig::CPU, OffloadConfig::NONE}) {
    const std::string what = OffloadConfig::Device_Name(params);
    const OffloadConfig::Device optimizer =
        params == OffloadConfig::CPU ? OffloadConfig::CPU : OffloadConfig::NONE;
    const JobSpec job =
        ValidatedJob(Job(1, 3, OptimizerConfig::ADAMW, PrecisionConfig::BF16, optimizer, params))
            .value();
    ASSERT_TRUE(job.parallel().reshard_after_forward()) << what;
    const ModelLayout layout = BuildModelLayout(job.model());
    ASSERT_TRUE(layout.tied_embeddings) << what << ": the gather count assumes the tied GPT-2";
    TrainOptions options;
    options.run_dir = (dir_ / ("run-" + what)).string();
    std::unique_ptr<Trainer> trainer = Trainer::Create(job, options).value();
    ASSERT_TRUE(trainer->Run().ok()) << what;
    // A gather uploads the rank's shard: the planned host buffer's elements (its bytes may be
    // padded to the pool's alignment, its shape is the shard).
    int64_t per_step = 0, gathers = 0;
    const int head = static_cast<int>(layout.units.size()) - 1;
    for (int u = 0; u <= head; ++u) {
      const int unit_gathers = (u == 0 || u == head) ? 1 : 2;
      const std::string name = layout.units[u].name + ".params";
      const auto b = std::find_if(trainer->plan().buffers.begin(), trainer->plan().buffers.end(),
                                  [&](const BufferSpec& x) { return x.name == name; });
      ASSERT_NE(b, trainer->plan().buffers.end()) << what << " " << name;
      EXPECT_EQ(b->category, params == OffloadConfig::CPU ? MemoryCategory::kPinnedHost
                                                          : MemoryCategory::kParameters)
          << what << " " << name;
      if (params == OffloadConfig::CPU) {
        per_step += unit_gathers * b->bytes();
        gathers += unit_gathers;
      }
    }
    std::ifstream in(dir_ / ("run-" + what) / "metrics.jsonl");
    std::string line;
    int lines = 0;
    while (std::getline(in, line)) {
      const nlohmann::json j = nlohmann::json::parse(line);
      ++lines;
      EXPECT_EQ(j.at("param_upload_bytes").get<int64_t>(), per_step) << what << ": " << line;
      EXPECT_EQ(j.at("param_uploads_ahead").get<int64_t>(), gathers) << what << ": " << line;
      EXPECT_EQ(j.at("param_uploads_at_gather").get<int64_t>(), 0) << what << ": " << line;
      EXPECT_GE(j.at("param_upload_s").get<double>(), 0) << what << ": " << line;
      if (params == OffloadConfig::NONE) {
        EXPECT_EQ(j.at("param_upload_s").get<double>(), 0) << what << ": " << line;
      }
    }
    EXPECT_EQ(lines, 4) << what;
    if (params == OffloadConfig::CPU) EXPECT_GT(per_step, 0);
  }
}

// An evaluation between steps gathers every unit again (the forward of each validation
// micro-batch), so with offload.params it uploads (and with NVME first reads) every shard once
// more: those bytes, seconds and counts are in the line of the step it follows, as the step's
// own are (Trainer::Run), and so in metrics.jsonl and the node's zt_offload_* series. On 2
// ranks, CPU and NVME, 4 steps with an evaluation of one micro-batch after step 4 (the last):
// that step's record is the same job's without data.val plus exactly one upload of each unit's
// shard (and with NVME one read of it from the store).
TEST_F(ParamOffloadTrainingTest, EvaluationUploadsCountInTheStepsLine) {
  for (OffloadConfig::Device params : {OffloadConfig::CPU, OffloadConfig::NVME}) {
    const std::string what = OffloadConfig::Device_Name(params);
    const JobSpec plain = Job(2, 3, OptimizerConfig::ADAMW, PrecisionConfig::FP32, params, params);
    JobSpec evaluated = plain;
    evaluated.mutable_data()->add_val((dir_ / "train.bin").string());
    evaluated.mutable_train()->set_eval_interval(4);
    evaluated.mutable_train()->set_eval_steps(1);
    const RunResult without = Train(plain, 4);
    const RunResult with = Train(evaluated, 4);
    ASSERT_TRUE(without.status.ok()) << what << ": " << without.status;
    ASSERT_TRUE(with.status.ok()) << what << ": " << with.status;
    EXPECT_EQ(with.losses, without.losses) << what << ": evaluating changes no step";
    const ModelLayout layout = BuildModelLayout(ValidatedJob(plain).value().model());
    for (int r = 0; r < 2; ++r) {
      // One forward pass: every unit gathered once (the tied embedding's use by the head is
      // the head unit's gather).
      int64_t shard_bytes = 0;
      for (const auto& unit : layout.units) {
        const std::string name = unit.name + ".params";
        for (const BufferSpec& b : with.plans[r].buffers) {
          if (b.name == name) shard_bytes += b.bytes();
        }
      }
      ASSERT_GT(shard_bytes, 0) << what;
      const StepRecord& a = with.last_step[r];
      const StepRecord& b = without.last_step[r];
      ASSERT_TRUE(a.val_loss.has_value()) << what << ": step 4 evaluates";
      EXPECT_EQ(a.param_upload_bytes, b.param_upload_bytes + shard_bytes) << what << " rank " << r;
      const int64_t units = static_cast<int64_t>(layout.units.size());
      EXPECT_EQ(a.param_uploads_ahead + a.param_uploads_at_gather,
                b.param_uploads_ahead + b.param_uploads_at_gather +
                    (params == OffloadConfig::CPU ? units : 0))
          << what << " rank " << r;
      if (params == OffloadConfig::NVME) {
        EXPECT_EQ(a.swap_bytes_in, b.swap_bytes_in + shard_bytes) << what << " rank " << r;
        EXPECT_EQ(a.swap_bytes_out, b.swap_bytes_out) << what << ": evaluation writes nothing";
      }
    }
  }
}

// The ring's room changes when a shard is read, never what is read: with one buffer free
// beside the optimizer's two staging buffers and prefetch_units 2, the step's start queues the
// first gather's read and finds the ring full for the next two, and a pass announces two
// reads at a time and the second finds the ring full, so those gathers read the shard itself. The run
// still equals the job without offload bit for bit, and every gather read its shard once.
TEST_F(ParamOffloadTrainingTest, ParamsNvmeReadsAtTheGatherWhenTheRingIsFull) {
  auto job = [&](OffloadConfig::Device optimizer, OffloadConfig::Device params) {
    JobSpec j = Job(2, 3, OptimizerConfig::ADAMW, PrecisionConfig::FP32, optimizer, params);
    j.mutable_parallel()->set_prefetch_units(2);
    if (optimizer == OffloadConfig::NVME) j.mutable_offload()->set_buffer_count(3);
    return j;
  };
  const RunResult swapped = Train(job(OffloadConfig::NVME, OffloadConfig::NVME), 4);
  const RunResult plain = Train(job(OffloadConfig::NONE, OffloadConfig::NONE), 4);
  ExpectSameRun(swapped, plain, "ring of 3, prefetch 2");
  const JobSpec validated = ValidatedJob(job(OffloadConfig::NVME, OffloadConfig::NVME)).value();
  const int n_units = static_cast<int>(BuildModelLayout(validated.model()).units.size());
  // Gathers a pass: the tied embedding and the head once, each block twice.
  const int64_t gathers = 2 + 2 * (n_units - 2);
  for (int r = 0; r < 2; ++r) {
    const NvmeOptimizer::Stats& stats = swapped.nvme_stats[r];
    EXPECT_EQ(stats.shard_reads_ahead + stats.shard_reads_at_gather, 4 * gathers) << r;
    EXPECT_GT(stats.shard_reads_ahead, 0) << r;
    // More than the two gathers of each pass's first Acquire whose reads found the ring full
    // at the step's start read at the gather.
    EXPECT_GT(stats.shard_reads_at_gather, 4 * 2) << r;
  }
}

// A swap store whose `fail_read`-th read (counting from 1) fails with EIO, as a bad sector
// would. Reads come from the store's read lane only, in order; the count is atomic all the same.
class FailingReadEnv : public offload::SwapEnv {
 public:
  explicit FailingReadEnv(int fail_read) : fail_read_(fail_read) {}
  absl::Status Run(offload::IoEngine& engine, absl::Span<const offload::IoOp> ops) override {
    for (const offload::IoOp& op : ops) {
      if (op.kind == offload::IoOp::Kind::kRead && reads_.fetch_add(1) + 1 == fail_read_) {
        return offload::IoErrnoStatus(EIO, "read", op.path != nullptr ? *op.path : "");
      }
    }
    return SwapEnv::Run(engine, ops);
  }

 private:
  const int fail_read_;
  std::atomic<int> reads_ = 0;
};

// A shard read that fails fails the step, naming the store's path and the shard: the
// first pass's first two gathers (prefetch_units 1) read their shards when issued, the third
// read is the first one queued ahead (block.1's, for the pass's third use).
TEST_F(ParamOffloadTrainingTest, AFailedShardReadNamesTheStoreAndTheShard) {
  const JobSpec job = Job(1, 3, OptimizerConfig::ADAMW, PrecisionConfig::FP32, OffloadConfig::NVME,
                          OffloadConfig::NVME);
  for (int fail_read : {1, 3}) {
    FailingReadEnv env(fail_read);
    const RunResult run = Train(job, 2, "", nullptr, &env);
    EXPECT_EQ(run.status.code(), absl::StatusCode::kDataLoss) << fail_read << ": " << run.status;
    EXPECT_THAT(std::string(run.status.message()),
                ::testing::HasSubstr(absl::StrCat("offload.nvme_path '", (dir_ / "swap").string())))
        << fail_read;
    EXPECT_THAT(
        std::string(run.status.message()),
        ::testing::HasSubstr(absl::StrCat("reading ", fail_read == 1 ? "embedding" : "block.1",
                                          ".params for its gather failed")))
        << fail_read;
  }
}

// Swapped shards are checkpointed from the store's committed generation and restored into a
// new process's store: the resumed run continues bit for bit.
TEST_F(ParamOffloadTrainingTest, ParamsNvmeCheckpointsResumeBitForBit) {
  for (const Case& c :
       {Case{OptimizerConfig::ADAMW, PrecisionConfig::BF16, OffloadConfig::NVME, 2},
        Case{OptimizerConfig::ADAMW_8BIT, PrecisionConfig::FP32, OffloadConfig::NVME, 1}}) {
    const std::string what = "params NVME " + Name(c);
    ExpectStopAndResumeBitForBit(
        [&](bool offloaded, const std::string& dir) {
          const OffloadConfig::Device to = offloaded ? OffloadConfig::NVME : OffloadConfig::NONE;
          JobSpec j = Job(c.world, 3, c.type, c.dtype, to, to);
          j.mutable_checkpoint()->set_dir((dir_ / (what + dir)).string());
          j.mutable_checkpoint()->set_interval_steps(2);
          return j;
        },
        what);
  }
}

// What the engine does not run is refused, naming the field: by CheckEngineSupport, and by
// the trainer when reached without it (the device optimizer cannot update host shards).
TEST_F(ParamOffloadTrainingTest, ParamsCpuWithTheOptimizerOnTheDeviceIsRefused) {
  const JobSpec spec = Job(1, 3, OptimizerConfig::ADAMW, PrecisionConfig::FP32,
                           OffloadConfig::NONE, OffloadConfig::CPU);
  const absl::Status checked = ValidatedJob(spec).status();
  EXPECT_EQ(checked.code(), absl::StatusCode::kFailedPrecondition) << checked;
  EXPECT_NE(std::string(checked.message()).find("offload.params: CPU trains with "
                                                "offload.optimizer CPU or NVME"),
            std::string::npos)
      << checked;
  const JobSpec job = ValidatedJob(spec, {.check_engine_support = false}).value();
  TrainOptions options;
  const absl::Status created = Trainer::Create(job, options).status();
  EXPECT_EQ(created.code(), absl::StatusCode::kUnimplemented) << created;
  EXPECT_NE(std::string(created.message()).find("offload.params: CPU"), std::string::npos)
      << created;
}

}  // namespace
}  // namespace zt
