// ZeRO-Offload training (offload.optimizer CPU, worker/train/trainer.h): the fp32 master weights and
// optimizer states live in the plan's pinned host buffers, apart from the device's arenas, and
// the update runs on the host unit by unit through the rank's copy engine. On the CPU an
// offloaded run is the same job without offload bit for bit — per-step losses, final weights,
// every checkpointed buffer — for AdamW, 8-bit AdamW and Adafactor, fp32 and bf16, ZeRO
// stages 1–3, on 1 and 2 ranks; the arenas it allocates are the plan's device and pinned_host
// categories; the gradients and parameters really cross the copy engine; checkpoints of
// offloaded states resume bit for bit and reshard onto another layout.
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "offload/swap_store.h"
#include "tests/unit/offload/offload_test_util.h"
#include "tests/unit/worker/trainer/offload_runs.h"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "tests/unit/worker/trainer/small_sharded_job.h"
#include "worker/comm/store.h"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"
#include "worker/model/param_layout.h"
#include "worker/offload/node_swap_store.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/arena.h"
#include "worker/plan/memory_plan.h"
#include "worker/checkpoint/rank_state.h"
#include "worker/train/pinned_host_arena.h"
#include "worker/train/trainer.h"

namespace zt {
namespace {

using zerotrain::JobSpec;
using zerotrain::OffloadConfig;
using zerotrain::OptimizerConfig;
using zerotrain::PrecisionConfig;

using namespace offload_testing;  // NOLINT: the harness's names, as they were here

class OffloadTrainingTest : public OffloadRunTest {};

struct OptimizerCase {
  const char* name;
  OptimizerConfig::Type type;
};
constexpr OptimizerCase kOptimizers[] = {{"AdamW", OptimizerConfig::ADAMW},
                                         {"8-bit AdamW", OptimizerConfig::ADAMW_8BIT},
                                         {"Adafactor", OptimizerConfig::ADAFACTOR}};

TEST_F(OffloadTrainingTest, OptimizerCpuEqualsNoOffloadBitForBit) {
  for (const OptimizerCase& o : kOptimizers) {
    for (PrecisionConfig::DType dtype : {PrecisionConfig::FP32, PrecisionConfig::BF16}) {
      for (int stage = 1; stage <= 3; ++stage) {
        for (int world : {1, 2}) {
          const std::string what = absl::StrCat(o.name, " ", PrecisionConfig::DType_Name(dtype),
                                                " stage ", stage, " world ", world);
          const RunResult offloaded =
              Train(Job(world, stage, o.type, dtype, OffloadConfig::CPU), 4);
          const RunResult plain = Train(Job(world, stage, o.type, dtype, OffloadConfig::NONE), 4);
          ExpectSameRun(offloaded, plain, what);
          ASSERT_EQ(offloaded.losses.size(), 4u) << what;
          // The ring and every offloaded state were used.
          EXPECT_TRUE(offloaded.unclaimed.empty()) << what << ": " << offloaded.unclaimed[0];
          // The run trained: the offloaded states are not the zero they started as.
          bool moved = false;
          for (size_t b = 0; b < offloaded.state_names.size(); ++b) {
            if (offloaded.state_names[b].ends_with(".params")) continue;
            for (uint8_t byte : offloaded.state[0][b]) moved |= byte != 0;
          }
          EXPECT_TRUE(moved) << what;
        }
      }
    }
  }
}

// The tied embedding split by vocabulary rows at stage 3 (VocabularyShardedEmbedding, which
// the jobs here turn off by default) under optimizer offload: its gradient shard, complete
// where the head and the lookup make it, goes down and its parameters come up like any unit's,
// so CPU and NVME equal the same split job without offload, bit for bit.
TEST_F(OffloadTrainingTest, OptimizerOffloadWithTheEmbeddingSplitByVocabularyIsBitForBit) {
  for (const OptimizerCase& o : kOptimizers) {
    for (PrecisionConfig::DType dtype : {PrecisionConfig::FP32, PrecisionConfig::BF16}) {
      for (const OffloadConfig::Device device : {OffloadConfig::CPU, OffloadConfig::NVME}) {
        const std::string what = absl::StrCat(o.name, " ", PrecisionConfig::DType_Name(dtype), " ",
                                              OffloadConfig::Device_Name(device));
        const auto split = [&](OffloadConfig::Device optimizer) {
          JobSpec job = Job(2, 3, o.type, dtype, optimizer);
          job.mutable_parallel()->set_vocab_sharded_embedding(true);
          return job;
        };
        ASSERT_TRUE(VocabularyShardedEmbedding(ValidatedJob(split(device)).value())) << what;
        const RunResult offloaded = Train(split(device), 4);
        const RunResult plain = Train(split(OffloadConfig::NONE), 4);
        ExpectSameRun(offloaded, plain, what);
        ASSERT_EQ(offloaded.losses.size(), 4u) << what;
        EXPECT_TRUE(offloaded.unclaimed.empty()) << what << ": " << offloaded.unclaimed[0];
      }
    }
  }
}

TEST_F(OffloadTrainingTest, ArenasAreThePlansDeviceAndPinnedHostCategories) {
  for (PrecisionConfig::DType dtype : {PrecisionConfig::FP32, PrecisionConfig::BF16}) {
    const std::string what = PrecisionConfig::DType_Name(dtype);
    std::vector<CountedRank> counted(2), counted_plain(2);
    const RunResult offloaded =
        Train(Job(2, 2, OptimizerConfig::ADAMW, dtype, OffloadConfig::CPU), 2, "", &counted);
    const RunResult plain =
        Train(Job(2, 2, OptimizerConfig::ADAMW, dtype, OffloadConfig::NONE), 2, "", &counted_plain);
    ExpectSameRun(offloaded, plain, what);
    const JobSpec job =
        ValidatedJob(Job(2, 2, OptimizerConfig::ADAMW, dtype, OffloadConfig::CPU)).value();
    for (int r = 0; r < 2; ++r) {
      const MemoryPlan& plan = offloaded.plans[r];
      const MemoryPlan& plain_plan = plain.plans[r];
      // The device holds what the plan's device categories say, and nothing of the optimizer:
      // its states moved whole to the pinned host pool.
      for (int c = 0; c < kMemoryCategoryCount; ++c) {
        const auto category = static_cast<MemoryCategory>(c);
        EXPECT_EQ(offloaded.arena_bytes[r][c], plan.CategoryBytes(category))
            << what << " " << MemoryCategoryName(category);
        EXPECT_EQ(counted[r].device_bytes[c],
                  IsDeviceCategory(category) ? plan.CategoryBytes(category) : 0)
            << what << " " << MemoryCategoryName(category);
      }
      EXPECT_EQ(plan.CategoryBytes(MemoryCategory::kOptimizerState), 0) << what;
      EXPECT_EQ(plan.DeviceBytes(), plain_plan.DeviceBytes() -
                                        plain_plan.CategoryBytes(MemoryCategory::kOptimizerState))
          << what;
      // ... and each unit's reduced gradient shard, copied down during the backward; the ring
      // is the one buffer the parameters go up through (memory_plan.cc).
      int64_t host_grads = 0;
      for (const BufferSpec& b : plain_plan.buffers) {
        if (b.name.ends_with(".grads") && b.category == MemoryCategory::kGradients) {
          host_grads += b.bytes();  // stage 2: "<u>.grads" is the rank's shard
        }
      }
      EXPECT_EQ(plan.CategoryBytes(MemoryCategory::kPinnedHost),
                plain_plan.CategoryBytes(MemoryCategory::kOptimizerState) + kRingBytes +
                    host_grads)
          << what;
      // One pool region of the category's bytes (page-rounded), pageable: pin_memory is off.
      EXPECT_EQ(counted[r].pinned.allocations, 1) << what;
      EXPECT_EQ(counted[r].pinned_bytes_while_training,
                (plan.CategoryBytes(MemoryCategory::kPinnedHost) + 4095) / 4096 * 4096)
          << what;
      EXPECT_EQ(counted[r].pinned.bytes, 0) << what << ": the pool went with the trainer";
      EXPECT_FALSE(counted[r].pinned.pinned) << what;
      // Each step, every unit's reduced gradient shard comes down and its updated parameter
      // shard goes up (with fp32 parameters and no master weights the parameters also come
      // down: they are what the update reads), on top of what the plain run moves.
      int64_t expected = 0;
      const ShardGeometry geometry = ParallelLayout::ForJob(job, r).shard();
      const int64_t grad = DTypeSize(dtype == PrecisionConfig::BF16 ? DType::kBF16 : DType::kF32);
      const int64_t param = grad;
      const int64_t params_crossings = dtype == PrecisionConfig::FP32 ? 2 : 1;
      for (const UnitLayout& u : BuildModelLayout(job.model()).units) {
        const FlatRange owned = ShardOf(u.numel, geometry).owned;
        expected += (owned.end - owned.begin) * (grad + params_crossings * param);
      }
      EXPECT_GT(expected, 0) << what;
      // The step's record says the same (what metrics.jsonl and the node's
      // zt_offload_bytes_total report), and the plain run moved nothing for its optimizer.
      const StepRecord& last = offloaded.last_step[r];
      EXPECT_EQ(last.offload_bytes_to_host + last.offload_bytes_to_device, expected) << what;
      EXPECT_GT(last.offload_bytes_to_device, 0) << what;
      EXPECT_GT(last.host_optimizer_s, 0) << what;
      // The gradients' copies ran beside the backward (offload_to_host_s counts them there).
      EXPECT_LE(last.host_optimizer_s + last.offload_to_device_s,
                last.optimizer_s + last.comm_wait_s)
          << what << ": the host step is part of the optimizer's time";
      EXPECT_EQ(plain.last_step[r].offload_bytes_to_host, 0) << what;
      EXPECT_EQ(plain.last_step[r].host_optimizer_s, 0) << what;
      EXPECT_EQ(offloaded.crossing_bytes_last_step[r] - plain.crossing_bytes_last_step[r], expected)
          << what << " rank " << r;
    }
  }
}

// Checkpoints of offloaded states: a run stopped after step 2 and resumed continues bit for
// bit as the run that never stopped, and as the same job without offload.
TEST_F(OffloadTrainingTest, OffloadedStatesResumeBitForBit) {
  struct Case {
    OptimizerConfig::Type type;
    PrecisionConfig::DType dtype;
    int world, stage;
  };
  for (const Case& c : {Case{OptimizerConfig::ADAMW, PrecisionConfig::BF16, 2, 2},
                        Case{OptimizerConfig::ADAMW_8BIT, PrecisionConfig::FP32, 2, 3},
                        Case{OptimizerConfig::ADAFACTOR, PrecisionConfig::BF16, 1, 1}}) {
    const std::string what =
        absl::StrCat(OptimizerConfig::Type_Name(c.type), " ", PrecisionConfig::DType_Name(c.dtype),
                     " stage ", c.stage, " world ", c.world);
    ExpectStopAndResumeBitForBit(
        [&](bool offloaded, const std::string& dir) {
          JobSpec j = Job(c.world, c.stage, c.type, c.dtype,
                          offloaded ? OffloadConfig::CPU : OffloadConfig::NONE);
          j.mutable_checkpoint()->set_dir((dir_ / (what + dir)).string());
          j.mutable_checkpoint()->set_interval_steps(2);
          return j;
        },
        what);
  }
}

// Another layout reshards offloaded states on read as it reshards any: 2 ranks at stage 3
// with offload → 1 rank at stage 1 with offload and without, the same bytes either way; and a
// checkpoint saved without offload resumes into an offloaded run.
TEST_F(OffloadTrainingTest, OffloadedCheckpointsReshardLikeAnyOther) {
  for (OptimizerConfig::Type type :
       {OptimizerConfig::ADAMW, OptimizerConfig::ADAMW_8BIT, OptimizerConfig::ADAFACTOR}) {
    const std::string what = OptimizerConfig::Type_Name(type);
    JobSpec saved = Job(2, 3, type, PrecisionConfig::BF16, OffloadConfig::CPU);
    saved.mutable_checkpoint()->set_dir((dir_ / (what + "saved")).string());
    saved.mutable_checkpoint()->set_interval_steps(2);
    ASSERT_TRUE(Train(saved, 2).status.ok()) << what;
    // Each resumes its own copy of the saved step (a resumed run saves into its directory).
    auto resume = [&](const JobSpec& from, JobSpec job, const std::string& name) {
      job.mutable_checkpoint()->set_dir((dir_ / (what + name)).string());
      std::filesystem::copy(from.checkpoint().dir(), job.checkpoint().dir(),
                            std::filesystem::copy_options::recursive);
      RunResult run = Train(job, 4, job.checkpoint().dir());
      EXPECT_EQ(run.losses.size(), 2u) << what << " " << name;
      return run;
    };
    ExpectSameRun(resume(saved, Job(1, 1, type, PrecisionConfig::BF16, OffloadConfig::CPU), "a"),
                  resume(saved, Job(1, 1, type, PrecisionConfig::BF16, OffloadConfig::NONE), "b"),
                  what + " resharded");
    // A checkpoint saved without offload, the other way round.
    JobSpec plain = Job(2, 2, type, PrecisionConfig::BF16, OffloadConfig::NONE);
    plain.mutable_checkpoint()->set_dir((dir_ / (what + "plain")).string());
    plain.mutable_checkpoint()->set_interval_steps(2);
    ASSERT_TRUE(Train(plain, 2).status.ok()) << what;
    JobSpec offloaded = plain;
    offloaded.mutable_offload()->set_optimizer(OffloadConfig::CPU);
    const RunResult into_offload = resume(plain, offloaded, "c");
    const RunResult straight = resume(plain, plain, "d");
    ExpectSameRun(into_offload, straight, what + " plain into offloaded");
  }
}

TEST_F(OffloadTrainingTest, MetricsLinesCarryTheHostOptimizersFigures) {
  const JobSpec job =
      ValidatedJob(Job(1, 1, OptimizerConfig::ADAMW, PrecisionConfig::BF16, OffloadConfig::CPU))
          .value();
  TrainOptions options;
  options.run_dir = (dir_ / "run").string();
  std::unique_ptr<Trainer> trainer = Trainer::Create(job, options).value();
  ASSERT_TRUE(trainer->Run().ok());
  std::ifstream in(dir_ / "run" / "metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    ++lines;
    // bf16 parameters over fp32 master weights: each step the bf16 gradients come down and
    // the bf16 parameters go up, 2 bytes an element of the model each way (one rank).
    int64_t elements = 0;
    for (const UnitLayout& u : BuildModelLayout(job.model()).units) elements += u.numel;
    EXPECT_EQ(j.at("offload_bytes_to_host").get<int64_t>(), 2 * elements) << line;
    EXPECT_EQ(j.at("offload_bytes_to_device").get<int64_t>(), 2 * elements) << line;
    EXPECT_GE(j.at("offload_to_host_s").get<double>(), 0) << line;
    EXPECT_GE(j.at("offload_to_device_s").get<double>(), 0) << line;
    EXPECT_GT(j.at("host_optimizer_s").get<double>(), 0) << line;
  }
  EXPECT_EQ(lines, 4);
  // The pinned pool's use as the memory report shows it: the plan's pinned_host bytes.
  std::ifstream memory(dir_ / "run" / "memory.json");
  const nlohmann::json report = nlohmann::json::parse(memory);
  EXPECT_EQ(report["arenas_high_water"]["pinned_host"].get<int64_t>(),
            trainer->plan().CategoryBytes(MemoryCategory::kPinnedHost));
  EXPECT_GT(report["plan"]["pinned_host"].get<int64_t>(), 2 * kRingBytes);
}

// ZeRO-Infinity's optimizer offload (offload.optimizer NVME): the master weights and states live
// in the swap store and stream through the ring each step; the run is the same job without
// offload bit for bit, and its checkpointed states (read back from the store) too.
TEST_F(OffloadTrainingTest, OptimizerNvmeEqualsNoOffloadBitForBit) {
  for (const OptimizerCase& o : kOptimizers) {
    for (PrecisionConfig::DType dtype : {PrecisionConfig::FP32, PrecisionConfig::BF16}) {
      for (int stage = 1; stage <= 3; ++stage) {
        for (int world : {1, 2}) {
          const std::string what = absl::StrCat(o.name, " ", PrecisionConfig::DType_Name(dtype),
                                                " stage ", stage, " world ", world);
          const RunResult swapped = Train(Job(world, stage, o.type, dtype, OffloadConfig::NVME), 4);
          const RunResult plain = Train(Job(world, stage, o.type, dtype, OffloadConfig::NONE), 4);
          ExpectSameRun(swapped, plain, what);
          ASSERT_EQ(swapped.losses.size(), 4u) << what;
          // The ring and every swapped state were claimed.
          EXPECT_TRUE(swapped.unclaimed.empty()) << what << ": " << swapped.unclaimed[0];
          // The states moved: not the zeros they started as.
          bool moved = false;
          for (size_t b = 0; b < swapped.state_names.size(); ++b) {
            if (swapped.state_names[b].ends_with(".params")) continue;
            for (uint8_t byte : swapped.state[0][b]) moved |= byte != 0;
          }
          EXPECT_TRUE(moved) << what;
          // Each step read every swapped state in and wrote it out: the plan's NVMe bytes
          // less the extents' page padding, and the store kept its two generations.
          for (int r = 0; r < world; ++r) {
            int64_t logical = 0;
            for (const BufferSpec& b : swapped.plans[r].buffers) {
              if (b.category == MemoryCategory::kNvme) logical += b.bytes();
            }
            EXPECT_GT(logical, 0) << what;
            EXPECT_EQ(swapped.last_step[r].swap_bytes_in, logical) << what << " rank " << r;
            EXPECT_EQ(swapped.last_step[r].swap_bytes_out, logical) << what << " rank " << r;
            EXPECT_GT(swapped.last_step[r].swap_out_s, 0) << what;
            EXPECT_EQ(plain.last_step[r].swap_bytes_in, 0) << what;
            // Every step's first unit was read once the backward ended, before the step.
            EXPECT_EQ(swapped.nvme_stats[r].first_unit_reads_ahead, 4) << what << " rank " << r;
          }
        }
      }
    }
  }
}

// The ring's depth changes the overlap, never the result: without room to read ahead (3
// buffers), and with a unit's states spread over several small buffers (16 pages, 5 buffers).
TEST_F(OffloadTrainingTest, NvmeRingGeometryDoesNotChangeTheRun) {
  const RunResult plain =
      Train(Job(2, 2, OptimizerConfig::ADAMW, PrecisionConfig::BF16, OffloadConfig::NONE), 3);
  struct Ring {
    int count;
    int64_t size;
  };
  for (const Ring ring : {Ring{3, kNvmeRingBytes}, Ring{5, kRingBytes}}) {
    JobSpec job = Job(2, 2, OptimizerConfig::ADAMW, PrecisionConfig::BF16, OffloadConfig::NVME);
    job.mutable_offload()->set_buffer_count(ring.count);
    job.mutable_offload()->set_buffer_size(ring.size);
    ExpectSameRun(Train(job, 3), plain, absl::StrCat(ring.count, " × ", ring.size));
  }
  // Too few for a unit's states: refused at set-up, naming the field and the count needed.
  JobSpec small = Job(1, 1, OptimizerConfig::ADAMW, PrecisionConfig::BF16, OffloadConfig::NVME);
  small.mutable_offload()->set_buffer_count(3);
  small.mutable_offload()->set_buffer_size(kRingBytes);
  const RunResult refused = Train(small, 1);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kFailedPrecondition) << refused.status;
  EXPECT_THAT(std::string(refused.status.message()),
              ::testing::HasSubstr("offload.buffer_count: 3 — the NVMe optimizer step needs 5"));
}

// The host memory of NVMe offload is the plan's: the ring in pinned_host, nothing of the
// optimizer on the device, no arena for the swapped states.
TEST_F(OffloadTrainingTest, NvmeHostMemoryIsThePlansRing) {
  std::vector<CountedRank> counted(2);
  const JobSpec spec =
      Job(2, 2, OptimizerConfig::ADAMW_8BIT, PrecisionConfig::BF16, OffloadConfig::NVME);
  const RunResult run = Train(spec, 2, "", &counted);
  ASSERT_TRUE(run.status.ok()) << run.status;
  for (int r = 0; r < 2; ++r) {
    const MemoryPlan& plan = run.plans[r];
    EXPECT_EQ(plan.CategoryBytes(MemoryCategory::kOptimizerState), 0);
    // The gradients are staged through the ring at the step, not copied down during the
    // backward: no "<u>.grads.host" (memory_plan.cc says why).
    for (const BufferSpec& b : plan.buffers) EXPECT_FALSE(b.name.ends_with(".grads.host")) << b.name;
    EXPECT_EQ(plan.CategoryBytes(MemoryCategory::kPinnedHost), 4 * kNvmeRingBytes)
        << "the ring, buffer_count × buffer_size, and nothing else";
    EXPECT_GT(plan.CategoryBytes(MemoryCategory::kNvme), 0);
    for (int c = 0; c < kMemoryCategoryCount; ++c) {
      const auto category = static_cast<MemoryCategory>(c);
      const int64_t expected = category == MemoryCategory::kNvme ? 0 : plan.CategoryBytes(category);
      EXPECT_EQ(run.arena_bytes[r][c], expected) << MemoryCategoryName(category);
      EXPECT_EQ(counted[r].device_bytes[c],
                IsDeviceCategory(category) ? plan.CategoryBytes(category) : 0)
          << MemoryCategoryName(category);
    }
    EXPECT_EQ(counted[r].pinned_bytes_while_training, 4 * kNvmeRingBytes);
  }
}

// Checkpoints of swapped states: saved from the store, resumed into a new process's store, the
// run continues bit for bit as the one that never stopped; and another layout reshards them.
TEST_F(OffloadTrainingTest, NvmeStatesCheckpointAndResumeBitForBit) {
  struct Case {
    OptimizerConfig::Type type;
    PrecisionConfig::DType dtype;
    int world, stage;
    bool async;
  };
  for (const Case& c : {Case{OptimizerConfig::ADAMW, PrecisionConfig::BF16, 2, 2, false},
                        Case{OptimizerConfig::ADAMW_8BIT, PrecisionConfig::FP32, 2, 1, true},
                        Case{OptimizerConfig::ADAFACTOR, PrecisionConfig::BF16, 1, 1, false}}) {
    const std::string what =
        absl::StrCat(OptimizerConfig::Type_Name(c.type), " ", PrecisionConfig::DType_Name(c.dtype),
                     " stage ", c.stage, " world ", c.world, c.async ? " async" : "");
    ExpectStopAndResumeBitForBit(
        [&](bool offloaded, const std::string& dir) {
          JobSpec j = Job(c.world, c.stage, c.type, c.dtype,
                          offloaded ? OffloadConfig::NVME : OffloadConfig::NONE);
          j.mutable_checkpoint()->set_dir((dir_ / ("nvme " + what + dir)).string());
          j.mutable_checkpoint()->set_interval_steps(2);
          j.mutable_checkpoint()->set_async(c.async);
          return j;
        },
        what);
  }
  // 2 ranks at stage 2 with NVMe → 1 rank at stage 1, with NVMe and without: the same bytes.
  JobSpec saved =
      Job(2, 2, OptimizerConfig::ADAMW_8BIT, PrecisionConfig::BF16, OffloadConfig::NVME);
  saved.mutable_checkpoint()->set_dir((dir_ / "nvme-saved").string());
  saved.mutable_checkpoint()->set_interval_steps(2);
  ASSERT_TRUE(Train(saved, 2).status.ok());
  auto resume = [&](JobSpec job, const std::string& name) {
    job.mutable_checkpoint()->set_dir((dir_ / ("nvme-" + name)).string());
    std::filesystem::copy(saved.checkpoint().dir(), job.checkpoint().dir(),
                          std::filesystem::copy_options::recursive);
    RunResult run = Train(job, 4, job.checkpoint().dir());
    EXPECT_EQ(run.losses.size(), 2u) << name;
    return run;
  };
  ExpectSameRun(
      resume(Job(1, 1, OptimizerConfig::ADAMW_8BIT, PrecisionConfig::BF16, OffloadConfig::NVME),
             "a"),
      resume(Job(1, 1, OptimizerConfig::ADAMW_8BIT, PrecisionConfig::BF16, OffloadConfig::NONE),
             "b"),
      "resharded");
}

// The swap store's env, failing on cue: ENOSPC once a write budget is spent, or the process
// "dies" at a stage of one generation's commit.
class StepFaults : public offload::testing::FaultInjectionEnv {
 public:
  std::optional<uint64_t> crash_generation;
  absl::Status AtCommitStage(offload::CommitStage stage, absl::string_view job,
                             uint64_t generation) override {
    if (crash_generation == generation) crash_at = offload::CommitStage::kDataDurable;
    return FaultInjectionEnv::AtCommitStage(stage, job, generation);
  }
};

// A full disk during a step's swap-out fails the job, naming the store's path and the bytes,
// and leaves the last checkpoint whole: resumed, it trains to the uninterrupted run's weights.
TEST_F(OffloadTrainingTest, NvmeFullDiskFailsTheJobAndKeepsTheCheckpoint) {
  auto job = [&](const std::string& dir) {
    JobSpec j = Job(1, 1, OptimizerConfig::ADAMW, PrecisionConfig::BF16, OffloadConfig::NVME);
    j.mutable_checkpoint()->set_dir((dir_ / dir).string());
    j.mutable_checkpoint()->set_interval_steps(2);
    return j;
  };
  const RunResult straight = Train(job("full-straight"), 4);
  ASSERT_TRUE(straight.status.ok()) << straight.status;
  const JobSpec spec = job("full");
  const int64_t generation =
      PlanMemory(ValidatedJob(spec).value(), 0).CategoryBytes(MemoryCategory::kNvme);
  ASSERT_GT(generation, 0);
  // The first generation, steps 1 and 2, and half of step 3's.
  StepFaults env;
  env.write_budget = static_cast<uint64_t>(3 * generation + generation / 2);
  const RunResult failed = Train(spec, 4, "", nullptr, &env);
  EXPECT_EQ(failed.status.code(), absl::StatusCode::kResourceExhausted) << failed.status;
  const std::string message(failed.status.message());
  EXPECT_THAT(message, ::testing::HasSubstr(SwapStoreDirectory(ValidatedJob(spec).value())));
  EXPECT_THAT(message, ::testing::HasSubstr(absl::StrCat(generation, " bytes")));
  EXPECT_THAT(message, ::testing::HasSubstr("step 3"));
  // Step 3's commit runs behind step 4's compute (NvmeCommitRunsBehindTheNextStepsCompute): its
  // write fails step 4 when it reads the store, naming step 3; nothing of step 3 is committed.
  EXPECT_EQ(failed.losses.size(), 3u);
  const RunResult resumed = Train(spec, 4, spec.checkpoint().dir());
  ASSERT_TRUE(resumed.status.ok()) << resumed.status;
  ASSERT_EQ(resumed.losses.size(), 2u);
  EXPECT_EQ(resumed.losses[1], straight.losses[3]);
  EXPECT_EQ(resumed.weights, straight.weights);
  EXPECT_EQ(resumed.state, straight.state);
}

// A process that dies between a generation's data and its index update leaves the store
// "open": the next process verifies it at open (every committed extent's CRC32C) and the job
// resumes from its checkpoint to the uninterrupted run's final weights.
TEST_F(OffloadTrainingTest, NvmeStoreLeftByACrashIsVerifiedAndTheJobResumes) {
  auto job = [&](const std::string& dir) {
    JobSpec j = Job(2, 2, OptimizerConfig::ADAMW, PrecisionConfig::FP32, OffloadConfig::NVME);
    j.mutable_checkpoint()->set_dir((dir_ / dir).string());
    j.mutable_checkpoint()->set_interval_steps(2);
    return j;
  };
  const RunResult straight = Train(job("crash-straight"), 4);
  ASSERT_TRUE(straight.status.ok()) << straight.status;
  const JobSpec spec = job("crash");
  // Generations: 1 the initial states, 2..5 steps 1..4: the crash takes step 3's commit.
  StepFaults env;
  env.crash_generation = 4;
  const RunResult crashed = Train(spec, 4, "", nullptr, &env);
  // The rank whose commit crashed says so (Aborted); the other finds the store stopped
  // (FailedPrecondition) naming that crash. Either way nothing of step 3 is committed. A
  // step-3 commit runs behind step 4's compute, and fails step 4 when it reads the store; the
  // node's store stops at the crash, which fails the other rank's step 3 if it is still reading
  // its states then, else its step 4: rank 0 records 2 or 3 steps.
  EXPECT_FALSE(crashed.status.ok());
  EXPECT_THAT(std::string(crashed.status.message()), ::testing::HasSubstr("simulated crash"));
  EXPECT_GE(crashed.losses.size(), 2u);
  EXPECT_LE(crashed.losses.size(), 3u);
  // A power cut also loses what was never synced.
  env.DropUnsyncedData();
  offload::SwapOpenReport opened;
  const RunResult resumed = Train(spec, 4, spec.checkpoint().dir(), nullptr, nullptr, &opened);
  EXPECT_TRUE(opened.unclean);
  EXPECT_GT(opened.extents_verified, 0u);
  EXPECT_FALSE(opened.discarded) << opened.discard_reason;
  ASSERT_TRUE(resumed.status.ok()) << resumed.status;
  ASSERT_EQ(resumed.losses.size(), 2u);
  EXPECT_EQ(resumed.losses[1], straight.losses[3]);
  EXPECT_EQ(resumed.weights, straight.weights);
  EXPECT_EQ(resumed.state, straight.state);
}

TEST_F(OffloadTrainingTest, NvmeMetricsLinesCarryTheSwap) {
  const JobSpec job =
      ValidatedJob(Job(1, 1, OptimizerConfig::ADAMW, PrecisionConfig::BF16, OffloadConfig::NVME))
          .value();
  TrainOptions options;
  options.run_dir = (dir_ / "nvme-run").string();
  std::unique_ptr<Trainer> trainer = Trainer::Create(job, options).value();
  ASSERT_TRUE(trainer->Run().ok());
  int64_t swapped = 0;
  for (const BufferSpec& b : trainer->plan().buffers) {
    if (b.category == MemoryCategory::kNvme) swapped += b.bytes();
  }
  std::ifstream in(dir_ / "nvme-run" / "metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    ++lines;
    EXPECT_EQ(j.at("swap_bytes_in").get<int64_t>(), swapped) << line;
    EXPECT_EQ(j.at("swap_bytes_out").get<int64_t>(), swapped) << line;
    EXPECT_GE(j.at("swap_in_s").get<double>(), 0) << line;
    EXPECT_GT(j.at("swap_out_s").get<double>(), 0) << line;
    EXPECT_GT(j.at("host_optimizer_s").get<double>(), 0) << line;
  }
  EXPECT_EQ(lines, 4);
  // The rank opened its own store (no process store was given), under offload.nvme_path.
  ASSERT_NE(trainer->nvme_optimizer(), nullptr);
  EXPECT_EQ(trainer->nvme_optimizer()->store_path(), SwapStoreDirectory(job));
  EXPECT_EQ(trainer->nvme_optimizer()->generation(), 5u) << "the initial states and 4 steps";
}

// The NVMe step's commit behind the next step's compute: a step after which nothing reads the
// states queues its generation's commit behind its last writes and returns; the next step
// settles it when it reads the store, at the end of its backward (ReadFirstUnitAhead). The
// run's last step commits before returning. (Every NVMe test here trains through this path:
// OptimizerNvmeEqualsNoOffloadBitForBit is the same job without offload bit for bit.)
TEST_F(OffloadTrainingTest, NvmeCommitRunsBehindTheNextStepsCompute) {
  JobSpec spec = Job(1, 1, OptimizerConfig::ADAMW, PrecisionConfig::BF16, OffloadConfig::NVME);
  spec.mutable_train()->set_max_steps(4);
  const JobSpec job = ValidatedJob(spec).value();
  TrainOptions options;
  options.run_dir = (dir_ / "nvme-behind").string();
  Trainer* running = nullptr;
  std::vector<uint64_t> at_backward_end;
  options.on_backward_ended = [&](int64_t) {
    at_backward_end.push_back(running->nvme_optimizer()->generation());
  };
  std::unique_ptr<Trainer> trainer = Trainer::Create(job, options).value();
  running = trainer.get();
  std::vector<uint64_t> after_step;
  for (int s = 0; s < 4; ++s) {
    ASSERT_TRUE(trainer->Step().ok());
    after_step.push_back(trainer->nvme_optimizer()->generation());
  }
  // Generation 1 is the initial states, k + 1 step k's. Steps 1-3 return before their commit
  // (which would make them 2, 3, 4); each backward's end finds the previous step's committed.
  EXPECT_EQ(after_step, (std::vector<uint64_t>{1, 2, 3, 5}));
  EXPECT_EQ(at_backward_end, (std::vector<uint64_t>{1, 2, 3, 4}));
}

// ZeRO-Offload's overlap: each unit's reduced gradient shard is queued for its copy to the host
// as soon as its reduction is issued, so at stages 2–3 every copy of a step is queued before
// the step's backward ends (the host step used to copy them one by one after it); at stage 1
// the reduce-scatters themselves run after the backward, and so do the copies. Every unit's
// shard comes down once a step into the plan's "<unit>.grads.host", and the step's record
// counts the same bytes it did when the host step copied them. (NVMe offload stages them
// through its ring at the step instead: NvmeHostMemoryIsThePlansRing.)
TEST_F(OffloadTrainingTest, GradientsComeDownDuringTheBackward) {
  for (OffloadConfig::Device offload : {OffloadConfig::CPU}) {
    for (int stage = 1; stage <= 3; ++stage) {
      const std::string what =
          absl::StrCat(OffloadConfig::Device_Name(offload), " stage ", stage);
      const JobSpec job =
          ValidatedJob(Job(1, stage, OptimizerConfig::ADAMW, PrecisionConfig::BF16, offload))
              .value();
      std::unique_ptr<Trainer> trainer = Trainer::Create(job, TrainOptions{}).value();
      std::vector<StepRecord> records;
      ASSERT_TRUE(trainer->Run([&](const StepRecord& r) { records.push_back(r); }).ok()) << what;
      ASSERT_EQ(records.size(), 4u) << what;
      const GradientDownloads* downloads = trainer->gradient_downloads();
      ASSERT_NE(downloads, nullptr) << what;
      const int64_t units = static_cast<int64_t>(BuildModelLayout(job.model()).units.size());
      int64_t grad_bytes = 0, host_buffers = 0;
      for (const UnitLayout& u : BuildModelLayout(job.model()).units) grad_bytes += 2 * u.numel;
      for (const BufferSpec& b : trainer->plan().buffers) {
        if (!b.name.ends_with(".grads.host")) continue;
        EXPECT_EQ(b.category, MemoryCategory::kPinnedHost) << what << " " << b.name;
        host_buffers += b.bytes();
      }
      // One rank: its shard is the unit, padded to the shard alignment.
      EXPECT_GE(host_buffers, grad_bytes) << what;
      const GradientDownloads::Stats s = downloads->stats();
      EXPECT_EQ(s.copies, 4 * units) << what;
      EXPECT_EQ(s.bytes, 4 * grad_bytes) << what;
      EXPECT_EQ(s.enqueued_during_backward, stage >= 2 ? 4 * units : 0) << what;
      EXPECT_GT(s.copy_seconds, 0) << what;
      // bf16 parameters over fp32 master weights: each step the bf16 gradients come down and
      // the bf16 parameters go up (the device holds them with either offload), as before.
      for (const StepRecord& r : records) {
        EXPECT_EQ(r.offload_bytes_to_host, grad_bytes) << what;
        EXPECT_EQ(r.offload_bytes_to_device, grad_bytes) << what;
        EXPECT_GT(r.offload_to_host_s, 0) << what << ": the copies' seconds";
      }
    }
  }
}

// Steps the fp16 loss scaler skips still had their gradients copied down during the backward:
// those copies finish before the next step's backward writes the gradients again, and the
// next step takes its own. The run is the one without offload bit for bit, skips included.
TEST_F(OffloadTrainingTest, SkippedStepsDrainTheirGradientCopies) {
  for (int stage : {1, 2, 3}) {
    const std::string what = absl::StrCat("stage ", stage);
    auto job = [&](OffloadConfig::Device offload) {
      JobSpec j = Job(2, stage, OptimizerConfig::ADAMW, PrecisionConfig::FP16, offload);
      // 2^40 overflows fp16 gradients for certain: the first steps are skipped.
      j.mutable_precision()->mutable_loss_scale()->set_initial_power(40);
      j.mutable_precision()->mutable_loss_scale()->set_hysteresis(1);
      j.mutable_train()->set_max_steps(30);
      return j;
    };
    const RunResult offloaded = Train(job(OffloadConfig::CPU), 30);
    const RunResult plain = Train(job(OffloadConfig::NONE), 30);
    ExpectSameRun(offloaded, plain, what);
    ASSERT_EQ(offloaded.losses.size(), 30u) << what;
    EXPECT_GT(offloaded.last_step[0].skipped, 5) << what;
    EXPECT_LT(offloaded.last_step[0].skipped, 30) << what << ": some steps trained";
  }
}

}  // namespace
}  // namespace zt
