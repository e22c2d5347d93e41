// The harness of the offload training tests (offload_training_test.cc,
// param_offload_training_test.cc): the small sharded job with an offload section, trained on
// every rank as threads, optionally through devices that count their copy-engine crossings
// and device allocations, with what a comparison needs collected from each rank.
#pragma once

#include <atomic>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "offload/swap_store.h"
#include "tests/unit/offload/offload_test_util.h"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "tests/unit/worker/trainer/separate_memory_device.h"
#include "tests/unit/worker/trainer/small_sharded_job.h"
#include "tests/unit/worker/trainer/test_swap_store.h"
#include "worker/comm/store.h"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"
#include "worker/offload/node_swap_store.h"
#include "worker/plan/arena.h"
#include "worker/plan/memory_plan.h"
#include "worker/checkpoint/rank_state.h"
#include "worker/train/pinned_host_arena.h"
#include "worker/train/trainer.h"

namespace zt::offload_testing {

using zerotrain::JobSpec;
using zerotrain::OffloadConfig;
using zerotrain::OptimizerConfig;
using zerotrain::PrecisionConfig;

// The small job's largest transfer (a block's 12,608 fp32 elements of master weights or of
// one state) is under 13 pages; two ring buffers of 16 pages hold it.
constexpr int64_t kRingBytes = 16 * 4096;
constexpr int64_t kNvmeRingBytes = 64 * 4096;

struct Crossings {
  std::atomic<int64_t> upload_bytes{0}, download_bytes{0};
};

class CountingCopyEngine : public DeviceCopyEngine {
 public:
  CountingCopyEngine(Crossings* counts, Device device)
      : inner_(MakeHostCopyEngine(device)), counts_(counts) {}
  Device device() const override { return inner_->device(); }
  absl::StatusOr<void*> AllocateStaging(int64_t bytes) override {
    return inner_->AllocateStaging(bytes);
  }
  absl::StatusOr<IssueMark> MarkIssue() override { return inner_->MarkIssue(); }
  absl::Status CopyToHost(const IssueMark& mark, void* host, const void* device,
                          int64_t bytes) override {
    counts_->download_bytes += bytes;
    return inner_->CopyToHost(mark, host, device, bytes);
  }
  absl::Status CopyToDevice(const IssueMark& mark, void* device, const void* host,
                            int64_t bytes) override {
    counts_->upload_bytes += bytes;
    return inner_->CopyToDevice(mark, device, host, bytes);
  }

 private:
  std::unique_ptr<DeviceCopyEngine> inner_;
  Crossings* counts_;
};

// The device arenas' allocator, counting the bytes of each category it is asked for. Its
// memory is host memory said to be on `device`.
class CountingArenaAllocator : public ArenaAllocator {
 public:
  CountingArenaAllocator(std::vector<int64_t>* bytes, Device device)
      : inner_(MakeHostArenaAllocator()), bytes_(bytes), device_(device) {}
  Device DeviceOf(MemoryCategory) const override { return device_; }
  absl::StatusOr<void*> Allocate(MemoryCategory c, int64_t bytes) override {
    (*bytes_)[static_cast<int>(c)] += bytes;
    return inner_->Allocate(c, bytes);
  }
  void Free(MemoryCategory c, void* data) override { inner_->Free(c, data); }

 private:
  std::unique_ptr<ArenaAllocator> inner_;
  std::vector<int64_t>* bytes_;
  Device device_;
};

// What a rank of a CPU device built as RankDevice::Create builds it, with its crossings and
// its device allocations counted (one of each per rank); with `separate_memory`, a device whose
// memory is its own (separate_memory_device.h), its communicators staged as a GPU rank's.
struct CountedRank {
  bool separate_memory = false;
  Crossings crossings;
  std::vector<int64_t> device_bytes = std::vector<int64_t>(kMemoryCategoryCount, 0);
  PinnedHostUse pinned;
  int64_t pinned_bytes_while_training = 0;  // pinned.bytes after the run, before teardown
};

struct RunResult {
  absl::Status status;
  std::vector<double> losses;                            // rank 0's per step
  std::vector<std::vector<float>> weights;               // FullWeights at the end
  std::vector<std::vector<std::vector<uint8_t>>> state;  // per rank, its checkpointed buffers
  std::vector<std::string> state_names;                  // rank 0's, in plan order
  std::vector<std::string> unclaimed;
  std::vector<MemoryPlan> plans;
  std::vector<std::vector<int64_t>> arena_bytes;  // per rank, BytesInUse by category
  std::vector<int64_t> crossing_bytes_last_step;  // per rank, up + down in the last step
  std::vector<StepRecord> last_step;              // per rank
  std::vector<NvmeOptimizer::Stats> nvme_stats;   // per rank, at the end (offload.optimizer NVME)
  // Per rank, at the end: host-shard uploads made ahead of their gather / at it
  // (offload.params CPU, ShardingEngine::param_uploads_ahead).
  std::vector<int64_t> param_uploads_ahead, param_uploads_at_gather;
};

// Bitwise: the host step is the device step's arithmetic on the same values in the same order.
inline void ExpectSameRun(const RunResult& offloaded, const RunResult& plain,
                          const std::string& what) {
  ASSERT_TRUE(offloaded.status.ok()) << what << ": " << offloaded.status;
  ASSERT_TRUE(plain.status.ok()) << what << ": " << plain.status;
  EXPECT_EQ(offloaded.losses, plain.losses) << what;
  EXPECT_EQ(offloaded.weights, plain.weights) << what;
  EXPECT_EQ(offloaded.state_names, plain.state_names) << what;
  ASSERT_EQ(offloaded.state.size(), plain.state.size()) << what;
  for (size_t r = 0; r < plain.state.size(); ++r) {
    ASSERT_EQ(offloaded.state[r].size(), plain.state[r].size()) << what;
    for (size_t b = 0; b < plain.state[r].size(); ++b) {
      EXPECT_EQ(offloaded.state[r][b], plain.state[r][b])
          << what << " rank " << r << " buffer " << plain.state_names[b];
    }
  }
}

class OffloadRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = zt::testing::TestScratchDir("zt-offload-training-test");
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), zt::testing::PatternTokens(), 32).ok());
    std::filesystem::create_directories(dir_ / "swap");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // `offload` is offload.optimizer; `params` offload.params (stage 3).
  JobSpec Job(int world, int stage, OptimizerConfig::Type type, PrecisionConfig::DType dtype,
              OffloadConfig::Device offload, OffloadConfig::Device params = OffloadConfig::NONE) {
    JobSpec job = zt::testing::SmallShardedJob((dir_ / "train.bin").string(), world, stage,
                                           /*micro_batch=*/4 / world);
    job.mutable_train()->set_max_steps(4);
    job.mutable_optimizer()->set_type(type);
    // Quantize every tensor of the small model (the default keeps small ones in fp32) in
    // blocks of 64, so 8-bit AdamW's codes and scales are what is offloaded.
    job.mutable_optimizer()->set_min_quantized_numel(0);
    job.mutable_optimizer()->set_quant_block_size(64);
    job.mutable_optimizer()->mutable_adafactor()->set_beta1(0.9f);
    auto* p = job.mutable_precision();
    p->set_param_dtype(dtype);
    p->set_compute_dtype(dtype);
    p->set_grad_dtype(dtype);
    p->set_stochastic_rounding(dtype == PrecisionConfig::BF16);
    job.mutable_offload()->set_optimizer(offload);
    job.mutable_offload()->set_params(params);
    // Offloaded parameters gather the tied embedding whole (VocabularyShardedEmbedding), so
    // every run here does, offloaded or not: the comparisons are bit for bit.
    job.mutable_parallel()->set_vocab_sharded_embedding(false);
    job.mutable_offload()->set_buffer_count(2);
    job.mutable_offload()->set_buffer_size(kRingBytes);
    if (offload == OffloadConfig::NVME) {
      // A unit's master weights and states (at most 3 × 13 pages) fit one ring buffer of 64
      // pages: 2 staging + 1 in use + 1 read ahead.
      job.mutable_offload()->set_nvme_path((dir_ / "swap").string());
      job.mutable_offload()->set_buffer_count(4);
      job.mutable_offload()->set_buffer_size(kNvmeRingBytes);
    }
    return job;
  }

  // Every rank (threads) to `stop_after`; from `resume` when set. `counted`, one per rank:
  // the ranks' devices count their crossings and device allocations.
  // offload.optimizer NVME: the process's swap store (one, shared by the ranks as `zt train`
  // shares it) opens through `swap_env` (null: the real one) and reports what it found at
  // open in `opened`.
  static RunResult Train(const JobSpec& spec, int64_t stop_after, const std::string& resume = "",
                         std::vector<CountedRank>* counted = nullptr,
                         offload::SwapEnv* swap_env = nullptr,
                         offload::SwapOpenReport* opened = nullptr) {
    RunResult result;
    absl::StatusOr<JobSpec> validated = ValidatedJob(spec);
    if (!validated.ok()) {
      result.status = validated.status();
      return result;
    }
    const JobSpec job = *validated;
    const int n = job.parallel().world_size();
    InProcessStore store;
    absl::StatusOr<std::shared_ptr<offload::SwapStore>> opened_store =
        testing::OpenTestSwapStore(job, swap_env);
    if (!opened_store.ok()) {
      result.status = opened_store.status();
      return result;
    }
    const std::shared_ptr<offload::SwapStore> swap = *std::move(opened_store);
    if (swap != nullptr && opened != nullptr) *opened = swap->open_report();
    result.state.resize(n);
    result.plans.resize(n);
    result.arena_bytes.resize(n);
    result.crossing_bytes_last_step.resize(n);
    result.last_step.resize(n);
    result.nvme_stats.resize(n);
    result.param_uploads_ahead.resize(n);
    result.param_uploads_at_gather.resize(n);
    std::vector<absl::Status> status(n);
    std::vector<std::vector<std::string>> unclaimed(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        status[r] = [&]() -> absl::Status {
          TrainOptions options;
          options.rank = r;
          options.store = &store;
          options.stop_after_step = stop_after;
          options.resume_dir = resume;
          options.swap_store = swap.get();
          if (counted != nullptr) {
            CountedRank* c = &(*counted)[r];
            options.make_device = [c](const JobSpec& j,
                                      int) -> absl::StatusOr<std::unique_ptr<RankDevice>> {
              const Device device =
                  c->separate_memory ? zt::testing::kSeparateDeviceMemory : Device{};
              RankDevice::Parts parts;
              parts.context = JobDeviceContext(j);
              parts.context.device = device;
              parts.allocator = MakePinnedHostArenaAllocator(
                  std::make_unique<CountingArenaAllocator>(&c->device_bytes, device),
                  {.pin_memory = j.offload().pin_memory(), .use = &c->pinned});
              parts.copies = std::make_unique<CountingCopyEngine>(&c->crossings, device);
              parts.host_addressable = !c->separate_memory;
              if (c->separate_memory) {
                parts.comm.make_copy_engine =
                    []() -> absl::StatusOr<std::unique_ptr<DeviceCopyEngine>> {
                  return MakeHostCopyEngine(zt::testing::kSeparateDeviceMemory);
                };
              }
              return RankDevice::FromParts(std::move(parts));
            };
          }
          absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(job, options);
          if (!t.ok()) return t.status();
          int64_t crossed_before = 0;
          absl::Status run = (*t)->Run([&](const StepRecord& rec) {
            if (counted != nullptr) {
              const Crossings& x = (*counted)[r].crossings;
              const int64_t crossed = x.upload_bytes + x.download_bytes;
              result.crossing_bytes_last_step[r] = crossed - crossed_before;
              crossed_before = crossed;
            }
            result.last_step[r] = rec;
            if (r == 0) result.losses.push_back(rec.loss);
          });
          if (!run.ok()) return run;
          if (counted != nullptr) {
            (*counted)[r].pinned_bytes_while_training = (*counted)[r].pinned.bytes;
          }
          if ((*t)->nvme_optimizer() != nullptr) {
            result.nvme_stats[r] = (*t)->nvme_optimizer()->stats();
          }
          result.param_uploads_ahead[r] = (*t)->sharding_engine()->param_uploads_ahead();
          result.param_uploads_at_gather[r] = (*t)->sharding_engine()->param_uploads_at_gather();
          result.plans[r] = (*t)->plan();
          for (int c = 0; c < kMemoryCategoryCount; ++c) {
            result.arena_bytes[r].push_back(
                (*t)->arenas().BytesInUse(static_cast<MemoryCategory>(c)));
          }
          for (const BufferSpec* b : CheckpointedBuffers((*t)->plan())) {
            absl::StatusOr<const void*> v = (*t)->BufferBytes(*b);
            if (!v.ok()) return v.status();
            const auto* bytes = static_cast<const uint8_t*>(*v);
            result.state[r].emplace_back(bytes, bytes + b->bytes());
            if (r == 0) result.state_names.push_back(b->name);
          }
          // A LoRA job's trained weights are its adapters.
          absl::StatusOr<std::vector<std::vector<float>>> w =
              job.model().has_lora() ? (*t)->FullAdapters() : (*t)->FullWeights();
          if (!w.ok()) return w.status();
          if (r == 0) result.weights = std::move(*w);
          unclaimed[r] = (*t)->arenas().UnclaimedBuffers();
          return absl::OkStatus();
        }();
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < n && result.status.ok(); ++r) {
      if (!status[r].ok()) {
        result.status =
            absl::Status(status[r].code(), absl::StrCat("rank ", r, ": ", status[r].message()));
      }
    }
    for (const auto& u : unclaimed) {
      result.unclaimed.insert(result.unclaimed.end(), u.begin(), u.end());
    }
    return result;
  }

  // The checkpoint test of an offloaded job: `job(offloaded, dir)` is the job with its
  // offload (or without any, for the reference) checkpointing every 2 steps into its own
  // directory named by `dir`. Four steps offloaded equal four without offload bit for bit, and
  // an offloaded run stopped after step 2 and resumed from its checkpoint continues as the
  // run that never stopped: losses, final weights, every checkpointed buffer.
  static void ExpectStopAndResumeBitForBit(
      const std::function<JobSpec(bool offloaded, const std::string& dir)>& job,
      const std::string& what) {
    const RunResult straight = Train(job(true, "straight"), 4);
    const RunResult plain = Train(job(false, "plain"), 4);
    ExpectSameRun(straight, plain, what);
    const JobSpec stopped = job(true, "stopped");
    ASSERT_TRUE(Train(stopped, 2).status.ok()) << what;
    const RunResult second = Train(stopped, 4, stopped.checkpoint().dir());
    ASSERT_TRUE(second.status.ok()) << what << ": " << second.status;
    ASSERT_EQ(second.losses.size(), 2u) << what;
    EXPECT_EQ(second.losses[0], straight.losses[2]) << what;
    EXPECT_EQ(second.losses[1], straight.losses[3]) << what;
    EXPECT_EQ(second.weights, straight.weights) << what;
    EXPECT_EQ(second.state, straight.state) << what;
  }

  std::filesystem::path dir_;
};

}  // namespace zt::offload_testing
