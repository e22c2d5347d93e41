// Parameter offload at ZeRO stage 3 (offload.params CPU, worker/shard/sharding_engine.h): each
// rank's "<unit>.params" shard lives in the pinned host pool, is uploaded through the rank's
// copy engine into its slot of the unit's gather buffer before every all-gather, and is
// updated in place by the host optimizer (offload.optimizer CPU or NVME). On the CPU such a run
// is the same job without any offload bit for bit — losses, final weights, every checkpointed
// buffer — for AdamW and 8-bit AdamW, fp32 and bf16, on 1 and 2 ranks; the device arenas are
// the plan's device categories, smaller by exactly the parameter shards; the shards cross the
// copy engine once per gather and never on the optimizer's way; checkpoints resume bit for bit.
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/trainer/offload_runs.h"
#include "worker/job/job_loading.h"
#include "worker/model/param_layout.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/memory_plan.h"
#include "worker/trainer.h"

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
      EXPECT_EQ(plan.DeviceBytes(), before.DeviceBytes() - shards) << what;
      EXPECT_EQ(plan.CategoryBytes(MemoryCategory::kPinnedHost),
                before.CategoryBytes(MemoryCategory::kPinnedHost) + shards)
          << what;
      // The device's parameters are the gather buffers alone.
      int64_t gather = 0;
      for (const BufferSpec& b : plan.buffers) {
        if (b.category == MemoryCategory::kParameters) {
          EXPECT_TRUE(b.name.starts_with("gather.")) << what << " " << b.name;
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
      // The copies of one step.
      const ShardGeometry geometry = ParallelLayout::ForJob(job, r).shard();
      int64_t gathers = 0, grads_down = 0, params_up = 0;
      const int head = static_cast<int>(layout.units.size()) - 1;
      for (int u = 0; u <= head; ++u) {
        const UnitShard s = ShardOf(layout.units[u].numel, geometry);
        const int uses = (u == 0 || u == head) ? 1 : 2;
        gathers += uses * s.shard_numel * element;
        grads_down += (s.owned.end - s.owned.begin) * element;
      }
      const StepRecord& last = offloaded.last_step[r];
      EXPECT_EQ(last.offload_bytes_to_host, grads_down) << what << ": gradients only";
      EXPECT_EQ(last.offload_bytes_to_device, params_up) << what << ": nothing after the update";
      // Against the optimizer-offload run, which also brings parameters down (fp32 without
      // master weights) and takes the updated ones up, and gathers from device shards.
      const StepRecord& other = optimizer_only.last_step[r];
      EXPECT_EQ(offloaded.crossing_bytes_last_step[r],
                optimizer_only.crossing_bytes_last_step[r] - other.offload_bytes_to_host -
                    other.offload_bytes_to_device + grads_down + gathers)
          << what << " rank " << r;
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
    auto job = [&](OffloadConfig::Device optimizer, OffloadConfig::Device params,
                   const std::string& dir) {
      JobSpec j = Job(c.world, 3, c.type, c.dtype, optimizer, params);
      j.mutable_checkpoint()->set_dir((dir_ / ("params " + what + dir)).string());
      j.mutable_checkpoint()->set_interval_steps(2);
      return j;
    };
    const RunResult straight = Train(job(c.optimizer, OffloadConfig::CPU, "straight"), 4);
    const RunResult plain = Train(job(OffloadConfig::NONE, OffloadConfig::NONE, "plain"), 4);
    ExpectSameRun(straight, plain, what);
    const JobSpec stopped = job(c.optimizer, OffloadConfig::CPU, "stopped");
    ASSERT_TRUE(Train(stopped, 2).status.ok()) << what;
    const RunResult second = Train(stopped, 4, stopped.checkpoint().dir());
    ASSERT_TRUE(second.status.ok()) << what << ": " << second.status;
    ASSERT_EQ(second.losses.size(), 2u) << what;
    EXPECT_EQ(second.losses[0], straight.losses[2]) << what;
    EXPECT_EQ(second.losses[1], straight.losses[3]) << what;
    EXPECT_EQ(second.weights, straight.weights) << what;
    EXPECT_EQ(second.state, straight.state) << what;
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
