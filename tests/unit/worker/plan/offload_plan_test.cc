// The offload tier in the memory plan (worker/plan/memory_plan.h): which buffers leave the
// device for the pinned host pool or NVMe, their exact bytes (hand-computed below), the pinned
// ring, and the largest transfer through it.
//
// The model: GPT-2, 1 block, C = 64, 4 heads, V = 256, 64 positions, tied head. Its units:
//   embedding  wte 256·64 + wpe 64·64                                   = 20480
//   block 0    ln_1 2·64 + c_attn 64·192+192 + attn c_proj 64·64+64
//              + ln_2 2·64 + c_fc 64·256+256 + mlp c_proj 256·64+64     = 49984
//   head       ln_f 2·64 (the projection is the tied wte)               = 128
// Ψ = 70592. On 2 ranks each unit pads to a multiple of 2·64 = 128 elements: 20480, 50048,
// 128, so rank 0's shards are 10240, 25024 and 64 elements (ΣS = 35328), all real.
// Mixed-precision AdamW is 16 bytes a parameter: bf16 parameters (2) and gradients (2), fp32
// master, m and v (12); ZeRO-1 divides the 12 by the ranks, and optimizer offload moves them
// off the device.
#include <string>

#include "gtest/gtest.h"
#include "worker/job/job_defaults.h"
#include "worker/model/param_layout.h"
#include "worker/plan/memory_plan.h"

namespace zt {
namespace {

using zerotrain::OffloadConfig;
using zerotrain::PrecisionConfig;

constexpr int64_t kEmbedding = 20480, kBlock = 49984, kHead = 128;
constexpr int64_t kPsi = kEmbedding + kBlock + kHead;
constexpr int64_t kShards = 10240 + 25024 + 64;  // rank 0 of 2
constexpr int64_t kPadded = 20480 + 50048 + 128;
constexpr int64_t kRingBuffer = 1 << 20;

zerotrain::JobSpec Job(int world_size, int stage, OffloadConfig::Device optimizer,
                       OffloadConfig::Device params) {
  zerotrain::JobSpec job;
  auto* m = job.mutable_model();
  m->set_family(zerotrain::ModelConfig::GPT2);
  m->set_n_layer(1);
  m->set_n_head(4);
  m->set_d_model(64);
  m->set_vocab_size(256);
  m->set_max_seq_len(64);
  job.mutable_data()->add_train("unused.bin");
  job.mutable_data()->set_seq_len(16);
  job.mutable_train()->set_micro_batch_size(1);
  job.mutable_train()->set_max_steps(1);
  job.mutable_optimizer()->set_lr(1e-4f);
  job.mutable_precision()->set_param_dtype(PrecisionConfig::BF16);
  job.mutable_precision()->set_grad_dtype(PrecisionConfig::BF16);
  job.mutable_parallel()->set_world_size(world_size);
  job.mutable_parallel()->set_zero_stage(stage);
  job.mutable_offload()->set_optimizer(optimizer);
  job.mutable_offload()->set_params(params);
  // Offloaded parameters gather the tied embedding whole (VocabularyShardedEmbedding): the
  // plans compared here all do, so their differences are the offload's alone.
  job.mutable_parallel()->set_vocab_sharded_embedding(false);
  job.mutable_offload()->set_nvme_path("/swap");
  job.mutable_offload()->set_buffer_count(4);
  job.mutable_offload()->set_buffer_size(kRingBuffer);
  job.mutable_resources()->set_cpu_threads(1);
  ApplyJobDefaults(&job);
  return job;
}

int64_t Bytes(const MemoryPlan& plan, MemoryCategory c) { return plan.CategoryBytes(c); }

const BufferSpec* Find(const MemoryPlan& plan, const std::string& name) {
  for (const BufferSpec& b : plan.buffers) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

TEST(OffloadPlanTest, TheHandComputedLayoutIsTheModels) {
  const ModelLayout layout =
      BuildModelLayout(Job(1, 0, OffloadConfig::NONE, OffloadConfig::NONE).model());
  ASSERT_EQ(layout.units.size(), 3u);
  EXPECT_EQ(layout.units[0].numel, kEmbedding);
  EXPECT_EQ(layout.units[1].numel, kBlock);
  EXPECT_EQ(layout.units[2].numel, kHead);
  // Without offload, one rank: the literature's 16 bytes a parameter, on the device (every
  // buffer here is a multiple of 64 bytes, so alignment adds nothing).
  const MemoryPlan plan = PlanMemory(Job(1, 0, OffloadConfig::NONE, OffloadConfig::NONE));
  EXPECT_EQ(Bytes(plan, MemoryCategory::kParameters) + Bytes(plan, MemoryCategory::kGradients) +
                Bytes(plan, MemoryCategory::kOptimizerState),
            16 * kPsi);
  EXPECT_EQ(Bytes(plan, MemoryCategory::kPinnedHost), 0);
  EXPECT_EQ(Bytes(plan, MemoryCategory::kNvme), 0);
  EXPECT_EQ(plan.DeviceBytes(), plan.TotalBytes());
}

TEST(OffloadPlanTest, OptimizerOffloadToTheHostMovesMasterAndMomentsAndAddsTheRing) {
  const MemoryPlan none = PlanMemory(Job(2, 1, OffloadConfig::NONE, OffloadConfig::NONE));
  const MemoryPlan cpu = PlanMemory(Job(2, 1, OffloadConfig::CPU, OffloadConfig::NONE));
  // Stage 1: parameters and gradients whole (padded) on the device, 2 + 2 bytes each.
  EXPECT_EQ(Bytes(cpu, MemoryCategory::kParameters), 2 * kPadded);
  EXPECT_EQ(Bytes(cpu, MemoryCategory::kGradients), 2 * kPadded);
  // Master, m and v of the rank's shards (12 bytes a parameter divided by 2 ranks) are on
  // the host, with 1 ring buffer (one unit's parameters up; the gradients come down during the
  // backward into their own buffers below; the job's buffer_count of 4 is NVMe's read-ahead
  // depth); nothing of the optimizer stays on the device.
  EXPECT_EQ(Bytes(none, MemoryCategory::kOptimizerState), 12 * kShards);
  EXPECT_EQ(Bytes(cpu, MemoryCategory::kOptimizerState), 0);
  // Beside them, each unit's bf16 gradient shard (2/N bytes a parameter), which comes down
  // during the backward (worker/optim/gradient_downloads.h).
  EXPECT_EQ(Bytes(cpu, MemoryCategory::kPinnedHost),
            12 * kShards + kRingBuffer + 2 * kShards);
  EXPECT_EQ(Bytes(cpu, MemoryCategory::kNvme), 0);
  EXPECT_EQ(cpu.DeviceBytes(), none.DeviceBytes() - 12 * kShards);
  EXPECT_EQ(cpu.TotalBytes(), none.TotalBytes() + kRingBuffer + 2 * kShards);
  const BufferSpec* host_grads = Find(cpu, "block.0.grads.host");
  ASSERT_NE(host_grads, nullptr);
  EXPECT_EQ(host_grads->category, MemoryCategory::kPinnedHost);
  EXPECT_EQ(host_grads->bytes(), 2 * 25024);
  EXPECT_FALSE(host_grads->offloaded_from.has_value());
  EXPECT_FALSE(IsCheckpointed(*host_grads));
  EXPECT_EQ(Find(none, "block.0.grads.host"), nullptr);

  const BufferSpec* master = Find(cpu, "block.0.master");
  ASSERT_NE(master, nullptr) << "the block's master weights keep their name";
  EXPECT_EQ(master->category, MemoryCategory::kPinnedHost);
  EXPECT_EQ(master->offloaded_from, MemoryCategory::kOptimizerState);
  EXPECT_EQ(master->bytes(), 4 * 25024);
  EXPECT_TRUE(IsCheckpointed(*master, /*weights_only=*/true));
  const BufferSpec* ring = Find(cpu, "offload.ring.0");
  ASSERT_NE(ring, nullptr);
  EXPECT_EQ(ring->category, MemoryCategory::kPinnedHost);
  EXPECT_FALSE(ring->offloaded_from.has_value());
  EXPECT_FALSE(IsCheckpointed(*ring));
  EXPECT_EQ(Find(cpu, "offload.ring.1"), nullptr);
}

TEST(OffloadPlanTest, NvmeExtentsPadToTheSwapStoresPage) {
  const MemoryPlan nvme = PlanMemory(Job(2, 2, OffloadConfig::NVME, OffloadConfig::NONE));
  // Each of master, m, v per unit is one extent padded to 4096 bytes:
  //   embedding 4·10240 = 40960 (10 pages), block 4·25024 = 100096 → 102400 (25 pages),
  //   head 4·64 = 256 → 4096.
  EXPECT_EQ(Bytes(nvme, MemoryCategory::kNvme), 3 * (40960 + 102400 + 4096));
  EXPECT_EQ(Bytes(nvme, MemoryCategory::kOptimizerState), 0);
  // The ring alone: NVMe stages the gradients through it (no "<u>.grads.host").
  EXPECT_EQ(Bytes(nvme, MemoryCategory::kPinnedHost), 4 * kRingBuffer);
  EXPECT_EQ(Find(nvme, "block.0.grads.host"), nullptr);
  // Stage 2: the gradients are the rank's shard (2 bytes each) plus the full-unit scratch
  // the backward alternates through; the device still holds whole bf16 parameters.
  EXPECT_EQ(Bytes(nvme, MemoryCategory::kParameters), 2 * kPadded);
}

TEST(OffloadPlanTest, ParameterOffloadAtStageThreeMovesTheShardsNotTheGathers) {
  const MemoryPlan none = PlanMemory(Job(2, 3, OffloadConfig::NONE, OffloadConfig::NONE));
  const MemoryPlan both = PlanMemory(Job(2, 3, OffloadConfig::CPU, OffloadConfig::CPU));
  // (12 + 2)/N bytes a parameter go to the host: states and the bf16 parameter shards; the
  // gradient shards' host copies (2/N) are there too. No ring: the gradients came down during
  // the backward and the update writes the host shards in place.
  EXPECT_EQ(Bytes(both, MemoryCategory::kPinnedHost), 16 * kShards);
  EXPECT_EQ(Find(both, "offload.ring.0"), nullptr);
  // The device gains prefetch_units + 1 staging slots of the largest bf16 shard (the block's
  // 25024 elements): the later gathers' shards go up into them a use before the gather is
  // issued, while the gather buffer they belong in is still another unit's.
  const int k = Job(2, 3, OffloadConfig::CPU, OffloadConfig::CPU).parallel().prefetch_units();
  const int64_t staging = (k + 1) * AlignedBytes(2 * 25024);
  for (int slot = 0; slot <= k; ++slot) {
    const BufferSpec* b = Find(both, "param_upload." + std::to_string(slot));
    ASSERT_NE(b, nullptr) << slot;
    EXPECT_EQ(b->category, MemoryCategory::kParameters);
    EXPECT_EQ(b->numel(), 25024);
  }
  EXPECT_EQ(Find(both, "param_upload." + std::to_string(k + 1)), nullptr);
  EXPECT_EQ(Find(none, "param_upload.0"), nullptr);
  EXPECT_EQ(Bytes(both, MemoryCategory::kParameters),
            Bytes(none, MemoryCategory::kParameters) - 2 * kShards + staging);
  EXPECT_EQ(both.DeviceBytes(), none.DeviceBytes() - 14 * kShards + staging);
  const BufferSpec* gather = Find(both, "gather.0");
  ASSERT_NE(gather, nullptr);
  EXPECT_EQ(gather->category, MemoryCategory::kParameters);
  const BufferSpec* shard = Find(both, "embedding.params");
  ASSERT_NE(shard, nullptr);
  EXPECT_EQ(shard->category, MemoryCategory::kPinnedHost);
  EXPECT_EQ(shard->offloaded_from, MemoryCategory::kParameters);
  EXPECT_TRUE(IsCheckpointed(*shard));

  // To NVMe: the bf16 shards as extents too (20480, 50048 → 53248, 4096 bytes). Their reads
  // land in the ring's pinned buffers, and the gather uploads from there: no staging slots.
  const MemoryPlan nvme = PlanMemory(Job(2, 3, OffloadConfig::NVME, OffloadConfig::NVME));
  EXPECT_EQ(Find(nvme, "param_upload.0"), nullptr);
  EXPECT_EQ(Bytes(nvme, MemoryCategory::kNvme),
            3 * (40960 + 102400 + 4096) + (20480 + 53248 + 4096));
}

TEST(OffloadPlanTest, LargestTransferIsTheLargestOffloadedShard) {
  EXPECT_EQ(LargestOffloadTransferBytes(Job(2, 1, OffloadConfig::NONE, OffloadConfig::NONE)), 0);
  // The block's fp32 master (or m, or v): 4 · 25024.
  EXPECT_EQ(LargestOffloadTransferBytes(Job(2, 1, OffloadConfig::CPU, OffloadConfig::NONE)),
            4 * 25024);
  // SGD without momentum and fp32 parameters has no state to move: the transfers are the
  // block's fp32 gradient shard going down and its parameter shard coming up.
  zerotrain::JobSpec sgd = Job(2, 1, OffloadConfig::CPU, OffloadConfig::NONE);
  sgd.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::SGD);
  sgd.mutable_precision()->set_param_dtype(PrecisionConfig::FP32);
  sgd.mutable_precision()->set_grad_dtype(PrecisionConfig::FP32);
  sgd.mutable_precision()->set_master_weights(false);
  EXPECT_EQ(LargestOffloadTransferBytes(sgd), 4 * 25024);
  sgd.mutable_precision()->set_grad_dtype(PrecisionConfig::BF16);
  sgd.mutable_precision()->set_param_dtype(PrecisionConfig::BF16);
  EXPECT_EQ(LargestOffloadTransferBytes(sgd), 2 * 25024);
}

// offload.params CPU: the parameter shards live in the pinned pool and a gather uploads them
// straight from there into device memory, and the host step updates them in place, so they
// are no transfer through the ring; the gradient shard going down is. With NVME the shards are
// read through the ring and count. The ring itself (buffer_count buffers of buffer_size) is
// what it was: only the planner's "buffer_size is smaller than its largest transfer" rule
// reads this, and it no longer rejects a buffer_size too small for a shard that never uses it.
TEST(OffloadPlanTest, ParameterShardsOnTheHostAreNoRingTransfer) {
  auto sgd = [](OffloadConfig::Device optimizer, OffloadConfig::Device params) {
    // No state to move, fp32 parameters and bf16 gradients: the parameter shard is the widest.
    zerotrain::JobSpec job = Job(2, 3, optimizer, params);
    job.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::SGD);
    job.mutable_precision()->set_param_dtype(PrecisionConfig::FP32);
    job.mutable_precision()->set_grad_dtype(PrecisionConfig::BF16);
    job.mutable_precision()->set_master_weights(false);
    return job;
  };
  // The optimizer on the host, parameters on the device: the block's fp32 shard goes up.
  EXPECT_EQ(LargestOffloadTransferBytes(sgd(OffloadConfig::CPU, OffloadConfig::NONE)), 4 * 25024);
  // Parameters on the host too: only the block's bf16 gradient shard moves.
  EXPECT_EQ(LargestOffloadTransferBytes(sgd(OffloadConfig::CPU, OffloadConfig::CPU)), 2 * 25024);
  // Swapped: the fp32 shard is read through the ring.
  EXPECT_EQ(LargestOffloadTransferBytes(sgd(OffloadConfig::NVME, OffloadConfig::NVME)),
            4 * 25024);
}

TEST(OffloadPlanTest, ParameterOffloadBelowStageThreeMovesNothing) {
  // Validation refuses it; the plan does not pretend to shard what stage 2 keeps whole.
  const MemoryPlan plan = PlanMemory(Job(2, 2, OffloadConfig::NONE, OffloadConfig::CPU));
  EXPECT_EQ(Bytes(plan, MemoryCategory::kParameters), 2 * kPadded);
  // Nothing moves, so no ring either.
  EXPECT_EQ(Bytes(plan, MemoryCategory::kPinnedHost), 0);
}

}  // namespace
}  // namespace zt

namespace zt {
namespace {

// offload.delayed_update (worker/optim/delayed_host_step.h): a second bank of host gradient
// shards (the next backward's copies land there while the host step reads the first) and a
// host copy of each updated parameter shard (uploaded after the next backward), both bf16 here:
// 2 + 2 bytes a parameter of the rank's shards, in pinned_host; the device is untouched.
TEST(OffloadPlanTest, TheDelayedUpdateAddsAGradientBankAndTheParameterShardsOnTheHost) {
  for (int stage = 1; stage <= 3; ++stage) {
    const MemoryPlan cpu = PlanMemory(Job(2, stage, OffloadConfig::CPU, OffloadConfig::NONE));
    zerotrain::JobSpec job = Job(2, stage, OffloadConfig::CPU, OffloadConfig::NONE);
    job.mutable_offload()->mutable_delayed_update()->set_enabled(true);
    const MemoryPlan dpu = PlanMemory(job);
    EXPECT_EQ(Bytes(dpu, MemoryCategory::kPinnedHost),
              Bytes(cpu, MemoryCategory::kPinnedHost) + 2 * kShards + 2 * kShards)
        << "stage " << stage;
    EXPECT_EQ(dpu.DeviceBytes(), cpu.DeviceBytes()) << "stage " << stage;
    EXPECT_EQ(dpu.TotalBytes(), cpu.TotalBytes() + 4 * kShards) << "stage " << stage;
    for (const char* name : {"block.0.grads.host.1", "block.0.params.host"}) {
      const BufferSpec* b = Find(dpu, name);
      ASSERT_NE(b, nullptr) << name;
      EXPECT_EQ(b->category, MemoryCategory::kPinnedHost) << name;
      EXPECT_EQ(b->bytes(), 2 * 25024) << name;
      EXPECT_FALSE(IsCheckpointed(*b)) << name;
      EXPECT_EQ(Find(cpu, name), nullptr) << name;
    }
  }
  // NVMe stages its serial step's gradients through the ring; with the delayed update its
  // host step runs beside the next backward, so both banks of host gradient copies come in
  // too (2 + 2 + 2 bytes a parameter of the shards, bf16), and the ring stays as it was.
  for (int stage = 1; stage <= 3; ++stage) {
    zerotrain::JobSpec nvme = Job(2, stage, OffloadConfig::NVME, OffloadConfig::NONE);
    const MemoryPlan plain_nvme = PlanMemory(nvme);
    nvme.mutable_offload()->mutable_delayed_update()->set_enabled(true);
    const MemoryPlan dpu = PlanMemory(nvme);
    EXPECT_EQ(Bytes(dpu, MemoryCategory::kPinnedHost),
              Bytes(plain_nvme, MemoryCategory::kPinnedHost) + 6 * kShards)
        << "stage " << stage;
    EXPECT_EQ(Bytes(dpu, MemoryCategory::kNvme), Bytes(plain_nvme, MemoryCategory::kNvme))
        << "stage " << stage;
    EXPECT_EQ(dpu.DeviceBytes(), plain_nvme.DeviceBytes()) << "stage " << stage;
    for (const char* name : {"block.0.grads.host", "block.0.grads.host.1", "block.0.params.host"}) {
      const BufferSpec* b = Find(dpu, name);
      ASSERT_NE(b, nullptr) << name;
      EXPECT_EQ(b->category, MemoryCategory::kPinnedHost) << name;
      EXPECT_EQ(b->bytes(), 2 * 25024) << name;
      EXPECT_EQ(Find(plain_nvme, name), nullptr) << name;
    }
  }
  // offload.params NVME: the host step updates the swapped shards in the ring with the states
  // and writes them into the store's next generation, so no params.host bank: the two gradient
  // banks alone (2 + 2 bytes a parameter of the shards), the nvme category and the device as
  // they were.
  zerotrain::JobSpec swapped = Job(2, 3, OffloadConfig::NVME, OffloadConfig::NVME);
  const MemoryPlan plain_swapped = PlanMemory(swapped);
  swapped.mutable_offload()->mutable_delayed_update()->set_enabled(true);
  const MemoryPlan dpu_swapped = PlanMemory(swapped);
  EXPECT_EQ(Bytes(dpu_swapped, MemoryCategory::kPinnedHost),
            Bytes(plain_swapped, MemoryCategory::kPinnedHost) + 4 * kShards);
  EXPECT_EQ(Bytes(dpu_swapped, MemoryCategory::kNvme), Bytes(plain_swapped, MemoryCategory::kNvme));
  EXPECT_EQ(dpu_swapped.DeviceBytes(), plain_swapped.DeviceBytes());
  for (const char* name : {"block.0.grads.host", "block.0.grads.host.1"}) {
    const BufferSpec* b = Find(dpu_swapped, name);
    ASSERT_NE(b, nullptr) << name;
    EXPECT_EQ(b->category, MemoryCategory::kPinnedHost) << name;
    EXPECT_EQ(b->bytes(), 2 * 25024) << name;
  }
  EXPECT_EQ(Find(dpu_swapped, "block.0.params.host"), nullptr);
}

}  // namespace
}  // namespace zt
