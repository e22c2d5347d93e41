// A LoRA job's adapters with the offload tier (docs/lora.md, docs/memory.md "Offload"): their
// optimizer states in the pinned host pool (offload.optimizer CPU) or swapped through the
// NVMe store (NVME), unit by unit like a full model's, and at ZeRO 3 the frozen base's shards
// in the pinned host pool or the store (offload.params CPU / NVME); on CPU ranks every such run
// is the run without offload bit for bit.
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/trainer/lora_training_fixture.h"
#include "tests/unit/worker/trainer/separate_memory_device.h"
#include "worker/optim/gradient_downloads.h"

namespace zt {
namespace {

using testing::ExportBase;
using testing::LoraRun;
using testing::LoraTrainingTest;
using testing::MakeHfBase;
using testing::MaxAbsDiff;
using zerotrain::JobSpec;
using zerotrain::ModelConfig;
using zerotrain::OffloadConfig;

constexpr int64_t kPage = 4096;

// A LoRA job's ranks split tp × pp × dp (ZeRO 3; the base gathered per use or kept for the step).
struct SplitLayout {
  int tp, pp, dp;
  bool reshard_after_forward;
  std::string Name() const {
    return absl::StrCat("tp", tp, " x pp", pp, " x dp", dp,
                        reshard_after_forward ? "" : " kept for the step");
  }
};

class LoraOffloadTrainingTest : public LoraTrainingTest {
 protected:
  // `split`'s job (1F1B over `micro_batches` micro-batches of one sequence, 4 steps) with a
  // `family` model and a `base` base, offload.params `params` and offload.optimizer `optimizer`,
  // swapping into dir_/swap through 4 ring buffers of 64 pages: a unit's parts together fit one
  // buffer (SwappedBase::Create), the widened NF4 model's included.
  JobSpec SplitJob(const SplitLayout& split, ModelConfig::Family family,
                   ModelConfig::BaseDType base, OffloadConfig::Device params,
                   OffloadConfig::Device optimizer, int micro_batches = 4) {
    JobSpec job = Job(split.tp * split.pp * split.dp, 3, 1, micro_batches, family, base);
    job.mutable_train()->set_max_steps(4);
    job.mutable_parallel()->set_tensor_parallel(split.tp);
    job.mutable_parallel()->set_pipeline_parallel(split.pp);
    job.mutable_parallel()->set_pipeline_schedule(zerotrain::ParallelConfig::ONE_F_ONE_B);
    job.mutable_parallel()->set_reshard_after_forward(split.reshard_after_forward);
    if (base == ModelConfig::NF4 && split.tp > 1) {
      // An NF4 share's rows and columns are whole 64-element blocks (CheckEngineSupport).
      job.mutable_model()->set_d_model(64 * split.tp);
      job.mutable_model()->set_d_ff(128 * split.tp);
    }
    std::filesystem::create_directories(dir_ / "swap");
    job.mutable_offload()->set_nvme_path((dir_ / "swap").string());
    job.mutable_offload()->set_buffer_count(4);
    job.mutable_offload()->set_buffer_size(64 * kPage);
    job.mutable_offload()->set_optimizer(optimizer);
    job.mutable_offload()->set_params(params);
    return job;
  }
  // Job(...) with `optimizer` offload; NVME swaps into dir_/swap through 4 ring buffers of 16
  // pages (an adapter unit's states are well under one).
  JobSpec OffloadedJob(int stage, ModelConfig::BaseDType base, OffloadConfig::Device optimizer,
                       int accum = 1) {
    const auto family = base == ModelConfig::FP32 ? ModelConfig::GPT2 : ModelConfig::LLAMA;
    JobSpec job = Job(2, stage, 2, accum, family, base);
    job.mutable_train()->set_max_steps(4);
    job.mutable_offload()->set_optimizer(optimizer);
    if (optimizer == OffloadConfig::NVME) {
      std::filesystem::create_directories(dir_ / "swap");
      job.mutable_offload()->set_nvme_path((dir_ / "swap").string());
      job.mutable_offload()->set_buffer_count(4);
      job.mutable_offload()->set_buffer_size(16 * kPage);
    }
    return job;
  }
  // ZeRO 3 with the frozen base's shards swapped (offload.params NVME) into dir_/swap through a
  // base ring of 4 buffers of 16 pages (a block's shard is well under one), and `optimizer`.
  JobSpec SwappedBaseJob(ModelConfig::BaseDType base, OffloadConfig::Device optimizer) {
    JobSpec job = OffloadedJob(3, base, optimizer);
    std::filesystem::create_directories(dir_ / "swap");
    job.mutable_offload()->set_params(OffloadConfig::NVME);
    job.mutable_offload()->set_nvme_path((dir_ / "swap").string());
    job.mutable_offload()->set_buffer_count(4);
    job.mutable_offload()->set_buffer_size(16 * kPage);
    return job;
  }
  // `job` (checkpointed into `ckpt`) saved after 2 steps and resumed to 4 into `second`, whose
  // losses and adapters (and their states) are `device`'s 4 steps bit for bit.
  void ResumeFromStepTwo(JobSpec job, const std::filesystem::path& ckpt, const LoraRun& device,
                         const std::string& what, LoraRun* second);
  // The same for a swapped base's job, whose every rank's base is also `device`'s.
  void ExpectResumesAsTheDevicePath(JobSpec job, const std::filesystem::path& ckpt,
                                    const LoraRun& device, const std::string& what);
};

void ExpectSameAdapterRun(const LoraRun& got, const LoraRun& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  EXPECT_EQ(got.losses, want.losses) << what;
  ASSERT_EQ(got.adapters.size(), want.adapters.size()) << what;
  for (size_t r = 0; r < want.adapters.size(); ++r) {
    EXPECT_EQ(MaxAbsDiff(got.adapters[r], want.adapters[r]), 0.0) << what << " rank " << r;
  }
  ASSERT_EQ(got.adapter_states.size(), want.adapter_states.size()) << what;
  for (size_t r = 0; r < want.adapter_states.size(); ++r) {
    ASSERT_EQ(got.adapter_states[r].size(), want.adapter_states[r].size()) << what;
    for (const auto& [name, bytes] : want.adapter_states[r]) {
      auto it = got.adapter_states[r].find(name);
      ASSERT_NE(it, got.adapter_states[r].end()) << what << " rank " << r << ": " << name;
      EXPECT_TRUE(it->second == bytes) << what << " rank " << r << ": " << name;
    }
  }
  EXPECT_TRUE(got.base_before == got.base_after) << what << ": the frozen base changed";
  EXPECT_TRUE(got.unclaimed.empty()) << what << ": unused plan buffer " << got.unclaimed.front();
}

// offload.optimizer NVME: each adapter unit's AdamW moments are extents of the swap store, read
// into the ring, updated there and written behind, as a full model's unit's states are. Two
// ranks at ZeRO 1–3, over an FP32 GPT-2 base and an NF4 Llama base (QLoRA): the run with the
// states on the device, in pinned host memory and on NVMe are the same run bit for bit —
// losses, adapters on every rank, and every adapter state read back (from the store for NVME).
TEST_F(LoraOffloadTrainingTest, NvmeAdapterStatesAreTheDeviceAndHostPathBitForBit) {
  for (int stage : {1, 2, 3}) {
    for (const auto base : {ModelConfig::FP32, ModelConfig::NF4}) {
      const std::string what = absl::StrCat(ModelConfig::BaseDType_Name(base), " stage ", stage);
      const LoraRun device = Train(OffloadedJob(stage, base, OffloadConfig::NONE), 4);
      const LoraRun host = Train(OffloadedJob(stage, base, OffloadConfig::CPU), 4);
      const JobSpec nvme_job = OffloadedJob(stage, base, OffloadConfig::NVME);
      const LoraRun nvme = Train(nvme_job, 4);
      ASSERT_EQ(device.losses.size(), 4u) << what;
      ExpectSameAdapterRun(host, device, what + " CPU");
      ExpectSameAdapterRun(nvme, device, what + " NVME");
      // The plan: every adapter state is swapped (page-padded extents, the store's footprint);
      // host memory is the ring alone (the adapters' gradients are staged through it).
      const MemoryPlan plan = PlanMemory(ValidatedJob(nvme_job).value(), 0);
      int64_t swapped = 0, states = 0;
      for (const BufferSpec& b : plan.buffers) {
        if (b.name.find(".lora.adam_") != std::string::npos) {
          ++states;
          EXPECT_EQ(b.category, MemoryCategory::kNvme) << what << " " << b.name;
          swapped += (b.bytes() + kPage - 1) / kPage * kPage;
        }
        if (b.category == MemoryCategory::kPinnedHost) {
          EXPECT_TRUE(b.name.starts_with("offload.ring.")) << what << " " << b.name;
        }
      }
      EXPECT_GT(states, 0) << what;
      EXPECT_EQ(plan.CategoryBytes(MemoryCategory::kNvme), swapped) << what;
      EXPECT_EQ(plan.CategoryBytes(MemoryCategory::kPinnedHost), 4 * 16 * kPage) << what;
      // The arenas carve the plan's categories exactly, and nothing of the swapped states.
      for (int c = 0; c < kMemoryCategoryCount; ++c) {
        const auto& [arena, planned] = nvme.arena_and_plan_bytes[0][c];
        if (static_cast<MemoryCategory>(c) == MemoryCategory::kNvme) {
          EXPECT_EQ(arena, 0) << what;
        } else {
          EXPECT_EQ(arena, planned) << what << " category " << c;
        }
      }
    }
  }
}

// A LoRA job with its adapters' states on NVMe saves them from the store and, resumed, writes
// them back as the store's next generation: 2 + 2 steps are 4 steps bit for bit, with the
// run without offload as the reference of both.
TEST_F(LoraOffloadTrainingTest, NvmeAdapterStatesResumeBitForBit) {
  for (int stage : {1, 3}) {
    for (const auto base : {ModelConfig::FP32, ModelConfig::NF4}) {
      const std::string what = absl::StrCat(ModelConfig::BaseDType_Name(base), " stage ", stage);
      const LoraRun device = Train(OffloadedJob(stage, base, OffloadConfig::NONE), 4);
      JobSpec job = OffloadedJob(stage, base, OffloadConfig::NVME);
      const std::filesystem::path ckpt =
          dir_ / absl::StrCat("ckpt-", stage, "-", ModelConfig::BaseDType_Name(base));
      job.mutable_checkpoint()->set_dir(ckpt.string());
      job.mutable_checkpoint()->set_interval_steps(2);
      const LoraRun first = Train(job, 2);
      ASSERT_EQ(first.losses.size(), 2u) << what;
      TrainOptions resume;
      resume.resume_dir = ckpt.string();
      const LoraRun second = Train(job, 4, resume);
      ASSERT_EQ(second.losses.size(), 2u) << what;
      EXPECT_EQ(first.losses[0], device.losses[0]) << what;
      EXPECT_EQ(first.losses[1], device.losses[1]) << what;
      EXPECT_EQ(second.losses[0], device.losses[2]) << what;
      EXPECT_EQ(second.losses[1], device.losses[3]) << what;
      LoraRun resumed = second;
      resumed.losses = device.losses;  // compared step by step above
      ExpectSameAdapterRun(resumed, device, what);
    }
  }
}

// offload.optimizer CPU: each adapter unit's reduced gradient shard comes down into the plan's
// "<block>.lora.grads.host" during the backward, as a full model's units' do (ZeRO-Offload's
// overlap): at stages 2 and 3 every copy of a step is queued before its backward ends (at
// stage 1 the reduce-scatters themselves run after it). The runs stay the device path bit for
// bit (NvmeAdapterStatesAreTheDeviceAndHostPathBitForBit, and LoraTrainingTest's
// OffloadedAdapterOptimizerIsTheDevicePathBitForBit).
TEST_F(LoraOffloadTrainingTest, AdapterGradientsComeDownDuringTheBackward) {
  for (int stage : {1, 2, 3}) {
    for (const auto base : {ModelConfig::FP32, ModelConfig::NF4}) {
      const std::string what = absl::StrCat(ModelConfig::BaseDType_Name(base), " stage ", stage);
      JobSpec spec = OffloadedJob(stage, base, OffloadConfig::CPU);
      spec.mutable_parallel()->set_world_size(1);
      spec.mutable_train()->set_micro_batch_size(4);
      const JobSpec job = ValidatedJob(spec).value();
      std::unique_ptr<Trainer> trainer = Trainer::Create(job, TrainOptions{}).value();
      int64_t steps = 0;
      ASSERT_TRUE(trainer->Run([&](const StepRecord&) { ++steps; }).ok()) << what;
      ASSERT_EQ(steps, 4) << what;
      const ModelLayout adapters = LoraAdapterLayout(BuildModelLayout(job.model()));
      ASSERT_FALSE(adapters.units.empty()) << what;
      int64_t grad_bytes = 0;
      for (const UnitLayout& u : adapters.units) {
        // One rank: its shard is the adapters, padded to the shard alignment; f32 gradients.
        const BufferSpec* host = trainer->arenas().Spec(u.name + ".grads.host").value();
        EXPECT_EQ(host->category, MemoryCategory::kPinnedHost) << what << " " << u.name;
        EXPECT_GE(host->numel(), u.numel) << what << " " << u.name;
        grad_bytes += 4 * u.numel;
      }
      const GradientDownloads* downloads = trainer->gradient_downloads();
      ASSERT_NE(downloads, nullptr) << what;
      const GradientDownloads::Stats s = downloads->stats();
      const int64_t units = static_cast<int64_t>(adapters.units.size());
      EXPECT_EQ(s.copies, 4 * units) << what;
      EXPECT_EQ(s.bytes, 4 * grad_bytes) << what;
      EXPECT_EQ(s.enqueued_during_backward, stage >= 2 ? 4 * units : 0) << what;
    }
  }
}

// offload.params CPU at ZeRO stage 3: a LoRA job's frozen base shards ("<unit>.params", and an
// NF4 base's "<block>.qbase") live in the pinned host pool and go up ahead of each gather, both
// parts together (into the gather buffers' slots at a pass's start, into the staging slots a use
// before the later gathers); the adapters stay on the device. With the optimizer on the device or
// on the host or on NVMe, the run is the run without offload bit for bit, and a checkpoint of it
// resumes bit for bit.
TEST_F(LoraOffloadTrainingTest, BaseShardsOnTheHostAreTheDevicePathBitForBit) {
  for (const auto base : {ModelConfig::FP32, ModelConfig::NF4}) {
    const std::string name = ModelConfig::BaseDType_Name(base);
    const LoraRun device = Train(OffloadedJob(3, base, OffloadConfig::NONE), 4);
    ASSERT_EQ(device.losses.size(), 4u) << name;
    for (const auto optimizer : {OffloadConfig::NONE, OffloadConfig::CPU, OffloadConfig::NVME}) {
      const std::string what = name + " optimizer " + OffloadConfig::Device_Name(optimizer);
      JobSpec job = OffloadedJob(3, base, optimizer);
      job.mutable_offload()->set_params(OffloadConfig::CPU);
      const LoraRun host = Train(job, 4);
      ExpectSameAdapterRun(host, device, what);
      EXPECT_TRUE(host.base_after == device.base_after) << what;
      // The plan: the base's shards in the pinned host pool, the adapters and the gather
      // buffers on the device; the arenas are the plan's categories (checked per category).
      const MemoryPlan plan = PlanMemory(ValidatedJob(job).value(), 0);
      const MemoryPlan plain =
          PlanMemory(ValidatedJob(OffloadedJob(3, base, optimizer)).value(), 0);
      int64_t shards = 0, qbase = 0;
      for (const BufferSpec& b : plan.buffers) {
        if (b.name.ends_with(".params") || b.name.ends_with(".qbase")) {
          EXPECT_EQ(b.category, MemoryCategory::kPinnedHost) << what << " " << b.name;
          EXPECT_EQ(b.offloaded_from, MemoryCategory::kParameters) << what << " " << b.name;
          shards += PlacedBytes(b);
          qbase += b.name.ends_with(".qbase");
        }
        if (b.name.ends_with(".lora")) {
          EXPECT_EQ(b.category, MemoryCategory::kParameters) << what << " " << b.name;
        }
      }
      EXPECT_EQ(qbase > 0, base == ModelConfig::NF4) << what;
      // The device gains the staging slots the later gathers' base shards go up into ahead of
      // their gather (ShardingEngine::UploadAhead; memory_plan.cc plans prefetch_units + 1).
      // An NF4 base's quantized shards go up beside them, into slots of their own
      // ("qbase_upload.<k>", as many, of the largest "<block>.qbase" shard).
      int64_t staging = 0, param_slots = 0, qbase_slots = 0, largest_qbase = 0;
      for (const BufferSpec& b : plan.buffers) {
        if (b.name.ends_with(".qbase")) largest_qbase = std::max(largest_qbase, b.numel());
      }
      for (const BufferSpec& b : plan.buffers) {
        const bool quantized = b.name.starts_with("qbase_upload.");
        if (b.name.starts_with("param_upload.") || quantized) {
          EXPECT_EQ(b.category, MemoryCategory::kParameters) << what << " " << b.name;
          staging += PlacedBytes(b);
          ++(quantized ? qbase_slots : param_slots);
          if (quantized) EXPECT_EQ(b.numel(), largest_qbase) << what << " " << b.name;
        }
      }
      EXPECT_GT(staging, 0) << what;
      const int k = ValidatedJob(job).value().parallel().prefetch_units();
      EXPECT_EQ(param_slots, k + 1) << what;
      EXPECT_EQ(qbase_slots, base == ModelConfig::NF4 ? k + 1 : 0) << what;
      // Every gather's shard went up ahead of it, the quantized bytes included: none on the
      // compute thread at the gather (ShardingEngine::param_uploads_at_gather counts a gather
      // any part of whose shard went up there).
      EXPECT_GT(host.param_uploads_ahead, 0) << what;
      EXPECT_EQ(host.param_uploads_at_gather, 0) << what;
      EXPECT_GT(host.param_upload_bytes, 0) << what;
      EXPECT_EQ(device.param_upload_bytes + device.param_uploads_ahead, 0) << what;
      EXPECT_EQ(plan.CategoryBytes(MemoryCategory::kParameters),
                plain.CategoryBytes(MemoryCategory::kParameters) - shards + staging)
          << what;
      EXPECT_EQ(plan.CategoryBytes(MemoryCategory::kPinnedHost),
                plain.CategoryBytes(MemoryCategory::kPinnedHost) + shards)
          << what << ": the ring is the optimizer's as without the shards";
      for (int r = 0; r < 2; ++r) {
        for (int c = 0; c < kMemoryCategoryCount; ++c) {
          const auto& [arena, planned] = host.arena_and_plan_bytes[r][c];
          // Swapped states (optimizer NVME) are the store's, never arena memory.
          const bool swapped = static_cast<MemoryCategory>(c) == MemoryCategory::kNvme;
          EXPECT_EQ(arena, swapped ? 0 : planned) << what << " rank " << r << " category " << c;
        }
      }
    }
    // Saved from the host shards (the seeded base is checkpointed) and resumed into them.
    JobSpec job = OffloadedJob(3, base, OffloadConfig::CPU);
    job.mutable_offload()->set_params(OffloadConfig::CPU);
    LoraRun second;
    ResumeFromStepTwo(job, dir_ / ("params-cpu-" + name), device, name, &second);
    if (HasFatalFailure()) return;
    EXPECT_TRUE(second.base_after == device.base_after) << name;
  }
}

// offload.params NVME at ZeRO stage 3 (worker/offload/swapped_base.h): a LoRA job's frozen base
// shards ("<unit>.params", and an NF4 or INT8 base's "<block>.qbase") are extents of the swap
// store, written once at the start under a key of their own and read ahead of each gather
// through the plan's base ring; the adapters stay on the device and their optimizer wherever
// offload.optimizer says. FP32, NF4 and INT8 bases on 2 ranks, with the optimizer on the device,
// the host and NVMe: the run is the run without offload bit for bit (losses, adapters, every
// adapter state, the base read back from the store on every rank); the plan's nvme category is
// the optimizer's plus the base shards' page-padded extents, its pinned host the optimizer's plus
// the base ring; the arenas are the plan; and every gather found both parts of its shard read
// ahead (a gather that reads its own, e.g. with the quantized read-ahead skipped, fails it).
TEST_F(LoraOffloadTrainingTest, BaseShardsSwappedAreTheDevicePathBitForBit) {
  for (const auto base : {ModelConfig::FP32, ModelConfig::NF4, ModelConfig::INT8}) {
    const std::string name = ModelConfig::BaseDType_Name(base);
    const LoraRun device = Train(OffloadedJob(3, base, OffloadConfig::NONE), 4);
    ASSERT_EQ(device.losses.size(), 4u) << name;
    for (const auto optimizer : {OffloadConfig::NONE, OffloadConfig::CPU, OffloadConfig::NVME}) {
      const std::string what = name + " optimizer " + OffloadConfig::Device_Name(optimizer);
      const JobSpec job = SwappedBaseJob(base, optimizer);
      const LoraRun swapped = Train(job, 4);
      ExpectSameAdapterRun(swapped, device, what);
      ASSERT_EQ(swapped.rank_base_after.size(), 2u) << what;
      for (int r = 0; r < 2; ++r) {
        EXPECT_TRUE(swapped.rank_base_after[r] == device.rank_base_after[r])
            << what << " rank " << r << ": the store's base is not the device path's";
        // Written once: the first generation, read by every step.
        EXPECT_EQ(swapped.base_generation[r], 1u) << what << " rank " << r;
      }
      // The plan: the base shards in the store, page-padded; the adapters and the gather
      // buffers on the device; host memory the optimizer's plus the base ring.
      const JobSpec validated = ValidatedJob(job).value();
      const MemoryPlan plan = PlanMemory(validated, 0);
      JobSpec plain_job = job;  // the same ring geometry, the base on the device
      plain_job.mutable_offload()->set_params(OffloadConfig::NONE);
      const MemoryPlan plain = PlanMemory(ValidatedJob(plain_job).value(), 0);
      int64_t extents = 0, device_bytes = 0, qbase = 0;
      for (const BufferSpec& b : plan.buffers) {
        if (b.name.ends_with(".params") || b.name.ends_with(".qbase")) {
          EXPECT_EQ(b.category, MemoryCategory::kNvme) << what << " " << b.name;
          EXPECT_EQ(b.offloaded_from, MemoryCategory::kParameters) << what << " " << b.name;
          extents += (b.bytes() + kPage - 1) / kPage * kPage;
          device_bytes += AlignedBytes(b.bytes());
          qbase += b.name.ends_with(".qbase");
        }
        if (b.name.ends_with(".lora")) {
          EXPECT_EQ(b.category, MemoryCategory::kParameters) << what << " " << b.name;
        }
      }
      EXPECT_EQ(qbase > 0, base != ModelConfig::FP32) << what;
      EXPECT_EQ(plan.CategoryBytes(MemoryCategory::kNvme),
                plain.CategoryBytes(MemoryCategory::kNvme) + extents)
          << what;
      EXPECT_EQ(plan.CategoryBytes(MemoryCategory::kParameters),
                plain.CategoryBytes(MemoryCategory::kParameters) - device_bytes)
          << what;
      const int64_t base_ring =
          validated.offload().buffer_count() * validated.offload().buffer_size();
      EXPECT_EQ(plan.CategoryBytes(MemoryCategory::kPinnedHost),
                plain.CategoryBytes(MemoryCategory::kPinnedHost) + base_ring)
          << what << ": the optimizer's ring as without the shards, and the base ring";
      const ModelLayout layout = BuildModelLayout(validated.model());
      const int64_t n_blocks = static_cast<int64_t>(layout.units.size()) - 2;
      for (int r = 0; r < 2; ++r) {
        for (int c = 0; c < kMemoryCategoryCount; ++c) {
          const auto& [arena, planned] = swapped.arena_and_plan_bytes[r][c];
          const bool in_store = static_cast<MemoryCategory>(c) == MemoryCategory::kNvme;
          EXPECT_EQ(arena, in_store ? 0 : planned) << what << " rank " << r << " category " << c;
        }
        // Every gather's shard was read ahead: each block's twice a step (forward and
        // backward), both its parameters and its quantized bytes; the embedding and the head
        // have parameters only.
        const SwappedBase::Stats& stats = swapped.base_swap[r];
        const int params = static_cast<int>(SwappedBase::Part::kParams);
        const int quantized = static_cast<int>(SwappedBase::Part::kQuantized);
        EXPECT_EQ(stats.reads_at_gather[params], 0) << what << " rank " << r;
        EXPECT_EQ(stats.reads_at_gather[quantized], 0) << what << " rank " << r;
        EXPECT_EQ(stats.reads_ahead[quantized], base == ModelConfig::FP32 ? 0 : 4 * 2 * n_blocks)
            << what << " rank " << r;
        EXPECT_GT(stats.reads_ahead[params], 4 * 2 * n_blocks) << what << " rank " << r;
        EXPECT_GT(stats.swap_bytes_in, 0) << what << " rank " << r;
      }
    }
  }
}

// A checkpoint of a swapped base (seeded: saved) reads the shards from the store, and a resume
// writes them back as the base key's next generation (with the adapter states, optimizer NVME,
// through the optimizer's store key): 2 + 2 steps are the 4 steps without offload bit for bit.
TEST_F(LoraOffloadTrainingTest, BaseShardsSwappedResumeBitForBit) {
  for (const auto base : {ModelConfig::FP32, ModelConfig::NF4, ModelConfig::INT8}) {
    const std::string name = ModelConfig::BaseDType_Name(base);
    const LoraRun device = Train(OffloadedJob(3, base, OffloadConfig::NONE), 4);
    ASSERT_EQ(device.losses.size(), 4u) << name;
    for (const auto optimizer : {OffloadConfig::NONE, OffloadConfig::NVME}) {
      const std::string what = name + " optimizer " + OffloadConfig::Device_Name(optimizer);
      // The seeded init, then the checkpoint's shards: generation 2 on every rank.
      ExpectResumesAsTheDevicePath(
          SwappedBaseJob(base, optimizer),
          dir_ / absl::StrCat("params-nvme-", name, "-", OffloadConfig::Device_Name(optimizer)),
          device, what);
    }
  }
}

// `job` (with checkpoint.dir `ckpt`) saved after 2 steps and resumed to 4 is `device`'s 4 steps
// bit for bit: losses step by step, adapters and their states, every rank's frozen base.
void LoraOffloadTrainingTest::ResumeFromStepTwo(JobSpec job, const std::filesystem::path& ckpt,
                                                const LoraRun& device, const std::string& what,
                                                LoraRun* second) {
  job.mutable_checkpoint()->set_dir(ckpt.string());
  job.mutable_checkpoint()->set_interval_steps(2);
  ASSERT_EQ(Train(job, 2).losses.size(), 2u) << what;
  TrainOptions resume;
  resume.resume_dir = ckpt.string();
  *second = Train(job, 4, resume);
  ASSERT_EQ(second->losses.size(), 2u) << what;
  EXPECT_EQ(second->losses[0], device.losses[2]) << what;
  EXPECT_EQ(second->losses[1], device.losses[3]) << what;
  LoraRun compared = *second;
  compared.losses = device.losses;  // compared step by step above
  ExpectSameAdapterRun(compared, device, what + " resumed");
}

void LoraOffloadTrainingTest::ExpectResumesAsTheDevicePath(JobSpec job,
                                                           const std::filesystem::path& ckpt,
                                                           const LoraRun& device,
                                                           const std::string& what) {
  LoraRun second;
  ResumeFromStepTwo(std::move(job), ckpt, device, what, &second);
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_EQ(second.rank_base_after.size(), device.rank_base_after.size()) << what;
  for (size_t r = 0; r < second.rank_base_after.size(); ++r) {
    EXPECT_TRUE(second.rank_base_after[r] == device.rank_base_after[r]) << what << " rank " << r;
    // The start's generation (seeded or streamed), then the restore's.
    EXPECT_EQ(second.base_generation[r], 2u) << what << " rank " << r;
  }
}

// offload.params NVME on pipeline stages and tensor-parallel ranks: each rank swaps its own
// share of its own stage's frozen base (its model units' "<unit>.params" shards, and the NF4 or
// INT8 "<unit>.qbase" byte shards that a tensor-parallel rank keeps of the whole weight it
// quantized) under its own key, and every gather reads it from the store — a pipeline stage's
// per-use gathers (reshard_after_forward) and the ones it keeps for the step alike. PP2 × DP2
// (both reshard_after_forward settings), TP2 × DP2 and TP2 × PP2, FP32, NF4 and INT8 bases,
// optimizer on the device and on NVMe: the run is the same layout with the base on the device
// (offload.params NONE) and in the pinned host pool (CPU) bit for bit — losses, adapters, every
// adapter state, every rank's base read back from the store; each rank's plan moves exactly its
// shards to the store and adds the base ring, its arenas are the plan; the store's stats show
// every step's gathers read the base; and 2 + 2 steps resumed from a checkpoint are the 4 steps.
// The store's reads of a rank's swapped base over a SplitJob's 4 steps (`plan`, the rank's):
// one a gather, ahead or at it. Gathered per use (`per_use`), each of the `micro_batches` m
// gathers a block twice (forward, backward) and the embedding and the head once (nothing flows
// back into a frozen embedding; the head's forward and backward are one use); kept for the
// step, each unit once a step. A `quantized` base's blocks read both parts. Per use, every
// read is ahead: a pipeline stage's pass's first gathers at its start (ShardingEngine::
// BeginStagePass), off a pipeline at the step's start and between micro-batches
// (ReadFirstGathersAhead), the later ones by rule 4 (the 4 ring buffers suffice).
void ExpectBaseReadsPerGather(const MemoryPlan& plan, const SwappedBase::Stats& stats, bool per_use,
                              bool quantized, const std::string& rank, int micro_batches = 4) {
  const int m = micro_batches;
  int64_t param_gathers = 0, block_gathers = 0;
  for (const BufferSpec& b : plan.buffers) {
    if (!b.name.ends_with(".params")) continue;
    const bool block = b.name.starts_with("block.");
    param_gathers += per_use ? m * (block ? 2 : 1) : 1;
    if (block && quantized) block_gathers += per_use ? m * 2 : 1;
  }
  const int params = static_cast<int>(SwappedBase::Part::kParams);
  const int qbase = static_cast<int>(SwappedBase::Part::kQuantized);
  EXPECT_EQ(stats.reads_ahead[params] + stats.reads_at_gather[params], 4 * param_gathers) << rank;
  EXPECT_EQ(stats.reads_ahead[qbase] + stats.reads_at_gather[qbase], 4 * block_gathers) << rank;
  EXPECT_GT(stats.swap_bytes_in, 0) << rank;
  if (per_use) {
    EXPECT_EQ(stats.reads_at_gather[params], 0) << rank;
    EXPECT_EQ(stats.reads_at_gather[qbase], 0) << rank;
  }
}

TEST_F(LoraOffloadTrainingTest, BaseShardsSwappedOnStagesAndTensorParallelRanksBitForBit) {
  constexpr int64_t kRingPages = 64;  // SplitJob's buffer_size
  constexpr SplitLayout kLayouts[] = {
      {1, 2, 2, true}, {1, 2, 2, false}, {2, 1, 2, true}, {2, 2, 1, true}};
  for (const SplitLayout& split : kLayouts) {
    for (const auto base : {ModelConfig::FP32, ModelConfig::NF4, ModelConfig::INT8}) {
      const std::string name = split.Name() + " " + ModelConfig::BaseDType_Name(base);
      const auto family = base == ModelConfig::FP32 ? ModelConfig::GPT2 : ModelConfig::LLAMA;
      const auto job_with = [&](OffloadConfig::Device params, OffloadConfig::Device optimizer) {
        return SplitJob(split, family, base, params, optimizer);
      };
      const LoraRun device = Train(job_with(OffloadConfig::NONE, OffloadConfig::NONE), 4);
      ASSERT_EQ(device.losses.size(), 4u) << name;
      const LoraRun host = Train(job_with(OffloadConfig::CPU, OffloadConfig::NONE), 4);
      ExpectSameAdapterRun(host, device, name + " params CPU");
      const int n = split.tp * split.pp * split.dp;
      for (const auto optimizer : {OffloadConfig::NONE, OffloadConfig::NVME}) {
        const std::string what = name + " optimizer " + OffloadConfig::Device_Name(optimizer);
        const JobSpec job = job_with(OffloadConfig::NVME, optimizer);
        const LoraRun swapped = Train(job, 4);
        ExpectSameAdapterRun(swapped, device, what);
        ASSERT_EQ(swapped.rank_base_after.size(), static_cast<size_t>(n)) << what;
        const JobSpec validated = ValidatedJob(job).value();
        JobSpec plain_job = job;  // the same ring geometry, the base on the device
        plain_job.mutable_offload()->set_params(OffloadConfig::NONE);
        const JobSpec plain_validated = ValidatedJob(plain_job).value();
        for (int r = 0; r < n; ++r) {
          const std::string rank = absl::StrCat(what, " rank ", r);
          for (const auto& [buffer, bytes] : device.rank_base_after[r]) {
            auto it = swapped.rank_base_after[r].find(buffer);
            EXPECT_TRUE(it != swapped.rank_base_after[r].end() && it->second == bytes)
                << rank << ": the store's " << buffer << " is not the device path's";
          }
          EXPECT_EQ(swapped.rank_base_after[r].size(), device.rank_base_after[r].size()) << rank;
          EXPECT_EQ(swapped.base_generation[r], 1u) << rank;
          // The rank's plan: its own shards in the store (page-padded), gone from the device,
          // and the base ring in pinned host memory; its arenas carve exactly that.
          const MemoryPlan plan = PlanMemory(validated, r);
          const MemoryPlan plain = PlanMemory(plain_validated, r);
          int64_t extents = 0, device_bytes = 0, shards = 0, qbase = 0;
          for (const BufferSpec& b : plan.buffers) {
            if (b.name.ends_with(".params") || b.name.ends_with(".qbase")) {
              EXPECT_EQ(b.category, MemoryCategory::kNvme) << rank << " " << b.name;
              extents += (b.bytes() + kPage - 1) / kPage * kPage;
              device_bytes += AlignedBytes(b.bytes());
              ++shards;
              qbase += b.name.ends_with(".qbase");
            }
          }
          EXPECT_GT(shards, 0) << rank;
          EXPECT_EQ(qbase > 0, base != ModelConfig::FP32) << rank;
          EXPECT_EQ(plan.CategoryBytes(MemoryCategory::kNvme),
                    plain.CategoryBytes(MemoryCategory::kNvme) + extents)
              << rank;
          EXPECT_EQ(plan.CategoryBytes(MemoryCategory::kParameters),
                    plain.CategoryBytes(MemoryCategory::kParameters) - device_bytes)
              << rank;
          EXPECT_EQ(plan.CategoryBytes(MemoryCategory::kPinnedHost),
                    plain.CategoryBytes(MemoryCategory::kPinnedHost) + 4 * kRingPages * kPage)
              << rank;
          for (int c = 0; c < kMemoryCategoryCount; ++c) {
            const auto& [arena, planned] = swapped.arena_and_plan_bytes[r][c];
            const bool in_store = static_cast<MemoryCategory>(c) == MemoryCategory::kNvme;
            EXPECT_EQ(arena, in_store ? 0 : planned) << rank << " category " << c;
          }
          // Every step's gathers read the base from the store, one read a gather.
          ExpectBaseReadsPerGather(plan, swapped.base_swap[r], split.reshard_after_forward,
                                   base != ModelConfig::FP32, rank);
        }
      }
      // Saved from the store (the seeded base is checkpointed), resumed into its next
      // generation: 2 + 2 steps are the 4 steps on the device.
      ExpectResumesAsTheDevicePath(
          job_with(OffloadConfig::NVME, OffloadConfig::NVME),
          dir_ / absl::StrCat("split-", &split - kLayouts, "-", ModelConfig::BaseDType_Name(base)),
          device, name);
    }
  }
}

// offload.params NVME over a quantized base streamed from model.init_from (a BF16 Hugging Face
// file): the stream lands in host staging of each unit's shard parts and the store takes each
// unit whole once its tensors arrived (a tensor-parallel rank's at the stream's end), as the
// base's first generation; on pipeline stages each stage streams its own units' tensors
// (Trainer::StreamQuantizedBase), quantizes its blocks' weights as one rank does and swaps its
// own share under its own key. NF4 and INT8 on DP2, TP2 × DP2, PP2 × DP2 and TP2 × PP2 at ZeRO 3
// (the base gathered per use), optimizer on the device
// and on NVMe: the run is the same layout with the base on the device (params NONE) and in the
// pinned host pool (CPU) bit for bit, every rank's base in the store is the device path's, the
// arenas are the plan (the staging is set-up memory, released before the first step), every
// step's gathers read the base, every read ahead of its gather, and 2 + 2 steps resumed are the
// 4 steps (the streamed base is
// not checkpointed: the resume streams it again and the restore keeps it).
TEST_F(LoraOffloadTrainingTest, StreamedQuantizedBaseSwappedIsTheDevicePathBitForBit) {
  constexpr SplitLayout kLayouts[] = {
      {1, 1, 2, true}, {2, 1, 2, true}, {1, 2, 2, true}, {2, 2, 1, true}};
  for (const SplitLayout& split : kLayouts) {
    const int n = split.tp * split.pp * split.dp;
    for (const auto base : {ModelConfig::NF4, ModelConfig::INT8}) {
      const std::string name = split.Name() + " " + ModelConfig::BaseDType_Name(base);
      const auto job_with = [&](OffloadConfig::Device params, OffloadConfig::Device optimizer) {
        return SplitJob(split, ModelConfig::LLAMA, base, params, optimizer, /*micro_batches=*/2);
      };
      const JobSpec plain = job_with(OffloadConfig::NONE, OffloadConfig::NONE);
      const std::string hf =
          ExportBase(MakeHfBase(plain), (dir_ / (name + ".safetensors")).string(), DType::kBF16);
      const auto streamed = [&](JobSpec job) {
        job.mutable_model()->set_init_from(hf);
        return job;
      };
      const LoraRun device = Train(streamed(plain), 4);
      ASSERT_EQ(device.losses.size(), 4u) << name;
      ExpectSameAdapterRun(Train(streamed(job_with(OffloadConfig::CPU, OffloadConfig::NONE)), 4),
                           device, name + " params CPU");
      for (const auto optimizer : {OffloadConfig::NONE, OffloadConfig::NVME}) {
        const std::string what = name + " optimizer " + OffloadConfig::Device_Name(optimizer);
        const JobSpec job = streamed(job_with(OffloadConfig::NVME, optimizer));
        const LoraRun swapped = Train(job, 4);
        ExpectSameAdapterRun(swapped, device, what);
        ASSERT_EQ(swapped.rank_base_after.size(), static_cast<size_t>(n)) << what;
        for (int r = 0; r < n; ++r) {
          const std::string rank = absl::StrCat(what, " rank ", r);
          int qbase = 0;
          for (const auto& [buffer, bytes] : device.rank_base_after[r]) {
            auto it = swapped.rank_base_after[r].find(buffer);
            EXPECT_TRUE(it != swapped.rank_base_after[r].end() && it->second == bytes)
                << rank << ": the store's " << buffer << " is not the device path's";
            qbase += buffer.ends_with(".qbase");
          }
          EXPECT_EQ(swapped.rank_base_after[r].size(), device.rank_base_after[r].size()) << rank;
          EXPECT_GT(qbase, 0) << rank << ": every rank (every stage) holds blocks";
          EXPECT_EQ(swapped.base_generation[r], 1u) << rank;
          for (int c = 0; c < kMemoryCategoryCount; ++c) {
            const auto& [arena, planned] = swapped.arena_and_plan_bytes[r][c];
            const bool in_store = static_cast<MemoryCategory>(c) == MemoryCategory::kNvme;
            EXPECT_EQ(arena, in_store ? 0 : planned) << rank << " category " << c;
          }
          ExpectBaseReadsPerGather(PlanMemory(ValidatedJob(job).value(), r), swapped.base_swap[r],
                                   /*per_use=*/true, /*quantized=*/true, rank,
                                   /*micro_batches=*/2);
        }
      }
      ExpectResumesAsTheDevicePath(streamed(job_with(OffloadConfig::NVME, OffloadConfig::NVME)),
                                   dir_ / ("streamed-" + name), device, name);
    }
  }
}

// The same offloaded runs on ranks whose memory the host cannot address
// (separate_memory_device.h: what CUDA ranks are, less the streams): the adapters' states in
// the pinned host pool or the store, moved by the rank's copy engine; at ZeRO 3 the frozen
// base's shards (an NF4 or INT8 base quantized on the host) in the pinned pool or the store,
// uploaded ahead of each gather; on stages and tensor-parallel ranks; streamed from a Hugging
// Face file. Each is the plain CPU rank's run bit for bit: losses, adapters, their states and
// every rank's frozen base.
TEST_F(LoraOffloadTrainingTest, OffloadOnRanksOfTheirOwnMemoryIsThePlainRunBitForBit) {
  TrainOptions separate;
  separate.make_device = testing::SeparateMemoryDevice;
  struct Case {
    std::string what;
    JobSpec job;
  };
  std::vector<Case> cases;
  for (const auto optimizer : {OffloadConfig::CPU, OffloadConfig::NVME}) {
    const std::string opt = OffloadConfig::Device_Name(optimizer);
    cases.push_back(
        {"fp32 zero-1 optimizer " + opt, OffloadedJob(1, ModelConfig::FP32, optimizer)});
    cases.push_back({"nf4 zero-3 optimizer " + opt, OffloadedJob(3, ModelConfig::NF4, optimizer)});
  }
  for (const auto base : {ModelConfig::NF4, ModelConfig::INT8}) {
    const std::string name = ModelConfig::BaseDType_Name(base);
    JobSpec pinned = OffloadedJob(3, base, OffloadConfig::CPU);
    pinned.mutable_offload()->set_params(OffloadConfig::CPU);
    cases.push_back({name + " params CPU optimizer CPU", pinned});
    cases.push_back(
        {name + " params NVME optimizer NVME", SwappedBaseJob(base, OffloadConfig::NVME)});
  }
  JobSpec streamed = SwappedBaseJob(ModelConfig::NF4, OffloadConfig::NONE);
  streamed.mutable_model()->set_init_from(
      ExportBase(MakeHfBase(streamed), (dir_ / "base.safetensors").string(), DType::kBF16));
  cases.push_back({"nf4 from a file, params NVME", streamed});
  cases.push_back({"tp2 x pp2 nf4 params NVME optimizer CPU",
                   SplitJob({2, 2, 1, true}, ModelConfig::LLAMA, ModelConfig::NF4,
                            OffloadConfig::NVME, OffloadConfig::CPU)});
  cases.push_back({"pp2 x dp2 int8 params CPU optimizer NVME, kept for the step",
                   SplitJob({1, 2, 2, false}, ModelConfig::LLAMA, ModelConfig::INT8,
                            OffloadConfig::CPU, OffloadConfig::NVME)});
  for (const Case& c : cases) {
    const LoraRun plain = Train(c.job, 4);
    ASSERT_EQ(plain.losses.size(), 4u) << c.what;
    const LoraRun own = Train(c.job, 4, separate);
    ExpectSameAdapterRun(own, plain, c.what);
    ASSERT_EQ(own.rank_base_after.size(), plain.rank_base_after.size()) << c.what;
    for (size_t r = 0; r < plain.rank_base_after.size(); ++r) {
      EXPECT_TRUE(own.rank_base_after[r] == plain.rank_base_after[r]) << c.what << " rank " << r;
    }
  }
}

}  // namespace
}  // namespace zt
