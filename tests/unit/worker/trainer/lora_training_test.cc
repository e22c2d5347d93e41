// A LoRA job (model.lora) through the step loop (docs/lora.md): one rank learns with the frozen
// base left bit for bit as it was (FP32, BF16 and NF4 bases); 2 ranks at ZeRO stages 0–3 (with
// accumulation, 8-bit AdamW and fp16 loss scaling) match one rank on the same global batch, and
// an offloaded optimizer steps the adapters as the device path does;
// the plan gives the base no gradient or optimizer state; a checkpoint holds the adapters and
// their states (the base only when it was generated from the seed) and resumes bit for bit;
// `zt export` of it writes the PEFT adapters and the merged model; model.lora.init_from starts
// from a PEFT directory.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/dtype.h"
#include "kernels/nf4.h"
#include "tests/unit/kernels/nf4_buffers.h"
#include "tests/unit/worker/trainer/lora_training_fixture.h"
#include "tests/unit/worker/trainer/pattern_adapters.h"
#include "worker/checkpoint/hf_interop.h"
#include "worker/checkpoint/peft_adapter.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/comm/store.h"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"
#include "worker/job/job_validation.h"
#include "worker/checkpoint/lora_export.h"
#include "worker/model/param_layout.h"
#include "worker/plan/memory_plan.h"
#include "worker/checkpoint/rank_state.h"
#include "worker/train/trainer.h"

namespace zt {
namespace {

using testing::Bytes;
using testing::ExpectMatches;
using testing::ExportBase;
using testing::HfBase;
using testing::LoraRun;
using testing::LoraTrainingTest;
using testing::MakeHfBase;
using testing::MaxAbsDiff;
using testing::MergedSiteError;
using testing::Nf4Buffers;
using testing::ReadTensor;
using testing::Weights;
using zerotrain::JobSpec;
using zerotrain::ModelConfig;

TEST_F(LoraTrainingTest, OneRankTrainsTheAdaptersAndLeavesTheBaseBitIdentical) {
  for (const auto& [family, base] : {std::pair{ModelConfig::GPT2, ModelConfig::FP32},
                                     {ModelConfig::LLAMA, ModelConfig::FP32},
                                     {ModelConfig::LLAMA, ModelConfig::BF16},
                                     {ModelConfig::LLAMA, ModelConfig::NF4}}) {
    const std::string what =
        absl::StrCat(ModelConfig::Family_Name(family), " ", ModelConfig::BaseDType_Name(base));
    JobSpec job = Job(1, 0, 4, 1, family, base);
    // A BF16 base is stored as precision.param_dtype stores parameters (the adapters stay f32).
    if (base == ModelConfig::BF16) {
      job.mutable_precision()->set_param_dtype(zerotrain::PrecisionConfig::BF16);
    }
    job.mutable_optimizer()->set_lr(1e-2f);
    const LoraRun run = Train(job, 20);
    ASSERT_EQ(run.losses.size(), 20u) << what;
    // The random base predicts the pattern corpus badly; rank-4 adapters on every linear layer
    // fit its periodic structure within 20 steps (the runs drop by > 1 nat).
    EXPECT_LT(run.losses.back(), run.losses.front() - 0.3) << what;
    EXPECT_FALSE(run.base_before.empty());
    EXPECT_TRUE(run.base_before == run.base_after) << what << ": the frozen base changed";
    // The step's gradient norm (what clipping compares) is the adapters' alone.
    if (base != ModelConfig::BF16) {  // a BF16 job's gradients are bf16
      EXPECT_GT(run.last_adapter_grad_norm, 0.0) << what;
      EXPECT_NEAR(run.grad_norms.back(), run.last_adapter_grad_norm,
                  1e-5 * run.last_adapter_grad_norm)  // f64 sums in another order
          << what;
    }
    // Something trained: B started at zero.
    double moved = 0;
    for (const std::vector<float>& u : run.adapters[0]) {
      for (float v : u) moved = std::max(moved, static_cast<double>(std::abs(v)));
    }
    EXPECT_GT(moved, 1e-3) << what;
    EXPECT_TRUE(run.unclaimed.empty()) << what << ": unused plan buffer " << run.unclaimed.front();
  }
}

// precision.stochastic_rounding rounds f32 master weights into 16-bit parameters; a bf16 LoRA
// job's adapters are f32 with no master, so it changes nothing of them (it failed the first
// step before: the adapters' AdamW was asked to round into a copy they do not have).
TEST_F(LoraTrainingTest, StochasticRoundingOfABf16JobLeavesTheF32AdaptersAsTheyAre) {
  const auto job = [&](bool stochastic) {
    JobSpec j = Job(1, 0, 4, 1, ModelConfig::LLAMA, ModelConfig::BF16);
    auto* p = j.mutable_precision();
    p->set_param_dtype(zerotrain::PrecisionConfig::BF16);
    p->set_compute_dtype(zerotrain::PrecisionConfig::BF16);
    p->set_stochastic_rounding(stochastic);
    return j;
  };
  const LoraRun rounded = Train(job(true), 5), nearest = Train(job(false), 5);
  ASSERT_EQ(rounded.losses.size(), 5u);
  EXPECT_EQ(rounded.losses, nearest.losses);
  EXPECT_EQ(rounded.adapters, nearest.adapters);
  EXPECT_TRUE(rounded.base_before == rounded.base_after) << "the frozen base changed";
}

TEST_F(LoraTrainingTest, TheFrozenBaseHasNoGradientNoOptimizerStateAndNoReduction) {
  for (int stage : {0, 1, 2, 3}) {
    const JobSpec job = ValidatedJob(Job(2, stage, 2, /*accum=*/2)).value();
    const MemoryPlan plan = PlanMemory(job, 0);
    const ModelLayout layout = BuildModelLayout(job.model());
    for (const BufferSpec& b : plan.buffers) {
      for (const UnitLayout& u : layout.units) {
        EXPECT_NE(b.name, u.name + ".grads") << "stage " << stage;
        EXPECT_NE(b.name, u.name + ".grad_accum") << "stage " << stage;
      }
      if (b.role() == MemoryCategory::kOptimizerState) {
        EXPECT_NE(b.name.find(".lora."), std::string::npos) << b.name << " stage " << stage;
      }
    }
    // Stage 3 shards the frozen base too: each rank holds half of every block (padded; the
    // head's 64 elements are one shard quantum).
    if (stage == 3) {
      for (const UnitLayout& u : layout.units) {
        if (u.kind != UnitKind::kBlock) continue;
        const BufferSpec* params = nullptr;
        for (const BufferSpec& b : plan.buffers) {
          if (b.name == u.name + ".params") params = &b;
        }
        ASSERT_NE(params, nullptr) << u.name;
        EXPECT_LT(params->numel(), u.numel) << u.name;
        EXPECT_GE(2 * params->numel(), u.numel) << u.name;
      }
    }
  }
}

TEST_F(LoraTrainingTest, TwoRanksAtEveryStageMatchOneRank) {
  for (const auto base : {ModelConfig::FP32, ModelConfig::NF4}) {
    const auto family = base == ModelConfig::NF4 ? ModelConfig::LLAMA : ModelConfig::GPT2;
    const LoraRun reference = Train(Job(1, 0, 4, 1, family, base), 5);
    for (int stage = 0; stage <= 3; ++stage) {
      ExpectMatches(Train(Job(2, stage, 2, 1, family, base), 5), reference,
                    absl::StrCat(ModelConfig::BaseDType_Name(base), " stage ", stage));
    }
  }
  // Accumulation: communication on the last micro-batch only; stage 2 accumulates into
  // "<unit>.lora_grad_accum".
  const LoraRun accumulated = Train(Job(1, 0, 4, /*accum=*/2), 5);
  for (int stage = 0; stage <= 3; ++stage) {
    ExpectMatches(Train(Job(2, stage, 2, /*accum=*/2), 5), accumulated,
                  absl::StrCat("accumulation stage ", stage));
  }
  // Stage 3 keeping each gathered base unit from its forward to its backward.
  JobSpec keep = Job(2, 3, 2);
  keep.mutable_parallel()->set_reshard_after_forward(false);
  ExpectMatches(Train(keep, 5), Train(Job(1, 0, 4), 5), "stage 3 reshard_after_forward false");
}

TEST_F(LoraTrainingTest, EightBitAdamAndFp16LossScalingOnTheAdapters) {
  // 8-bit AdamW over the adapters: on one rank every stage quantizes the same blocks, so the
  // stages agree bit for bit.
  JobSpec eight = Job(1, 0, 4);
  eight.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAMW_8BIT);
  eight.mutable_optimizer()->set_min_quantized_numel(64);
  eight.mutable_optimizer()->set_quant_block_size(64);
  eight.mutable_optimizer()->set_lr(1e-2f);
  const LoraRun one = Train(eight, 20);
  EXPECT_LT(one.losses.back(), one.losses.front() - 0.3);
  for (int stage : {1, 2}) {
    JobSpec job = eight;
    job.mutable_parallel()->set_zero_stage(stage);
    const LoraRun got = Train(job, 20);
    EXPECT_EQ(got.losses, one.losses) << "stage " << stage;
    EXPECT_EQ(MaxAbsDiff(got.adapters[0], one.adapters[0]), 0.0) << "stage " << stage;
  }
  // fp16: the first steps overflow at 2^24 and are skipped on every rank alike.
  JobSpec fp16 = Job(2, 2, 2, 1, ModelConfig::GPT2, ModelConfig::FP16);
  fp16.mutable_precision()->set_param_dtype(zerotrain::PrecisionConfig::FP16);
  fp16.mutable_precision()->mutable_loss_scale()->set_initial_power(24);
  fp16.mutable_precision()->mutable_loss_scale()->set_hysteresis(1);
  JobSpec reference = fp16;
  reference.mutable_parallel()->set_world_size(1);
  reference.mutable_parallel()->set_zero_stage(0);
  reference.mutable_train()->set_micro_batch_size(4);
  const LoraRun got = Train(fp16, 12), want = Train(reference, 12);
  EXPECT_GT(want.skipped, 0);
  EXPECT_EQ(got.skipped, want.skipped);
  EXPECT_EQ(got.loss_scales, want.loss_scales);
  // fp16 activations: results differ by fp16 rounding (2^-11 relative), not fp32 noise.
  for (size_t s = 0; s < want.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], want.losses[s], 1e-3 * want.losses[s]) << "step " << s + 1;
  }
  EXPECT_TRUE(got.base_before == got.base_after);
}

TEST_F(LoraTrainingTest, OffloadedAdapterOptimizerIsTheDevicePathBitForBit) {
  // offload.optimizer CPU: the adapters' states live in pinned host memory and the host
  // optimizer steps them unit by unit; on a CPU rank the arithmetic is the device path's.
  for (int stage : {1, 2, 3}) {  // offload needs a ZeRO shard (validation)
    JobSpec job = Job(2, stage, 2);
    const LoraRun device = Train(job, 5);
    job.mutable_offload()->set_optimizer(zerotrain::OffloadConfig::CPU);
    bool offloaded = false;
    for (const BufferSpec& b : PlanMemory(ValidatedJob(job).value(), 0).buffers) {
      offloaded |= b.name == "block.0.lora.adam_m" && b.category == MemoryCategory::kPinnedHost;
    }
    EXPECT_TRUE(offloaded) << "the adapters' moments are in pinned host memory";
    const LoraRun host = Train(job, 5);
    EXPECT_EQ(host.losses, device.losses) << "stage " << stage;
    EXPECT_EQ(MaxAbsDiff(host.adapters[0], device.adapters[0]), 0.0) << "stage " << stage;
    EXPECT_TRUE(host.base_before == host.base_after) << "stage " << stage;
  }
}

TEST_F(LoraTrainingTest, CheckpointsHoldTheAdaptersAndTheBaseOnlyWhenSeeded) {
  JobSpec job = Job(1, 1, 4);
  job.mutable_checkpoint()->set_dir((dir_ / "ckpt").string());
  const JobSpec seeded = ValidatedJob(job).value();
  std::vector<std::string> names;
  const MemoryPlan seeded_plan = PlanMemory(seeded, 0);
  for (const BufferSpec* b : CheckpointedBuffers(seeded_plan)) names.push_back(b->name);
  auto holds = [&](const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  EXPECT_TRUE(holds("block.0.lora"));
  EXPECT_TRUE(holds("block.1.lora.adam_m"));
  EXPECT_TRUE(holds("block.1.lora.adam_v"));
  // A base generated from train.seed is saved (export and resume have nowhere else to get it).
  EXPECT_TRUE(holds("block.0.params"));
  EXPECT_TRUE(holds("embedding.params"));
  // A base loaded from model.init_from is not: every start reloads it from there.
  JobSpec imported = seeded;
  imported.mutable_model()->set_init_from((dir_ / "hf").string());
  const MemoryPlan imported_plan = PlanMemory(imported, 0);
  bool adapters = false;
  for (const BufferSpec* b : CheckpointedBuffers(imported_plan)) {
    EXPECT_FALSE(b->name.ends_with(".params")) << b->name;
    adapters |= b->name == "block.0.lora";
  }
  EXPECT_TRUE(adapters);
  // NF4: the quantized base is saved when seeded.
  const JobSpec nf4 = ValidatedJob(Job(1, 0, 4, 1, ModelConfig::LLAMA, ModelConfig::NF4)).value();
  bool codes = false;
  const MemoryPlan nf4_plan = PlanMemory(nf4, 0);
  for (const BufferSpec* b : CheckpointedBuffers(nf4_plan)) {
    codes |= b->name == "block.0.nf4.attn.qkv.weight.codes";
  }
  EXPECT_TRUE(codes);
}

TEST_F(LoraTrainingTest, ResumeContinuesBitForBit) {
  for (int stage : {0, 2, 3}) {
    for (const auto base : {ModelConfig::FP32, ModelConfig::NF4}) {
      const std::string what = absl::StrCat(ModelConfig::BaseDType_Name(base), " stage ", stage);
      const auto family = base == ModelConfig::NF4 ? ModelConfig::LLAMA : ModelConfig::GPT2;
      const std::filesystem::path ckpt = dir_ / absl::StrCat("ckpt-", stage, "-", base);
      JobSpec job = Job(2, stage, 2, /*accum=*/2, family, base);
      job.mutable_model()->mutable_lora()->set_dropout(0.1f);  // masks must be the same too
      job.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAMW_8BIT);
      job.mutable_optimizer()->set_min_quantized_numel(64);
      job.mutable_optimizer()->set_quant_block_size(64);
      job.mutable_train()->set_max_steps(8);
      const LoraRun uninterrupted = Train(job, 8);
      job.mutable_checkpoint()->set_dir(ckpt.string());
      job.mutable_checkpoint()->set_interval_steps(4);
      const LoraRun first = Train(job, 4);
      ASSERT_EQ(first.losses.size(), 4u) << what;
      TrainOptions resume;
      resume.resume_dir = ckpt.string();
      const LoraRun second = Train(job, 8, resume);
      ASSERT_EQ(second.losses.size(), 4u) << what;
      for (size_t s = 0; s < 4; ++s) {
        EXPECT_EQ(first.losses[s], uninterrupted.losses[s]) << what << " step " << s + 1;
        EXPECT_EQ(second.losses[s], uninterrupted.losses[4 + s]) << what << " step " << s + 5;
      }
      EXPECT_EQ(MaxAbsDiff(second.adapters[0], uninterrupted.adapters[0]), 0.0) << what;
      EXPECT_TRUE(second.base_after == uninterrupted.base_after) << what;
    }
  }
}

TEST_F(LoraTrainingTest, ResumeOnAnotherLayoutReshardsTheAdaptersAndTheirStates) {
  // Saved by 2 ranks at `from`, resumed by 1 rank at stage 0 (same global batch), against the
  // run that stayed on 2 ranks: AdamW's fp32 moments and the adapters move bit for bit, so
  // the runs differ only by the reduction order of the last 4 steps (the TwoRanks bounds).
  for (int from : {1, 3}) {
    for (const auto base : {ModelConfig::FP32, ModelConfig::NF4}) {
      const std::string what = absl::StrCat(ModelConfig::BaseDType_Name(base), " from ", from);
      const auto family = base == ModelConfig::NF4 ? ModelConfig::LLAMA : ModelConfig::GPT2;
      JobSpec job = Job(2, from, 2, 1, family, base);
      job.mutable_train()->set_max_steps(8);
      const LoraRun stayed = Train(job, 8);
      const std::filesystem::path ckpt = dir_ / absl::StrCat("reshard-", from, "-", base);
      job.mutable_checkpoint()->set_dir(ckpt.string());
      job.mutable_checkpoint()->set_interval_steps(4);
      ASSERT_EQ(Train(job, 4).losses.size(), 4u) << what;
      JobSpec one = job;
      one.mutable_parallel()->set_world_size(1);
      one.mutable_parallel()->set_zero_stage(0);
      one.mutable_train()->set_micro_batch_size(4);
      TrainOptions resume;
      resume.resume_dir = ckpt.string();
      const LoraRun resumed = Train(one, 8, resume);
      ASSERT_EQ(resumed.losses.size(), 4u) << what;
      for (size_t s = 0; s < 4; ++s) {
        EXPECT_NEAR(resumed.losses[s], stayed.losses[4 + s], 1e-5 * stayed.losses[4 + s])
            << what << " step " << s + 5;
      }
      EXPECT_LT(MaxAbsDiff(resumed.adapters[0], stayed.adapters[0]), 1e-5) << what;
    }
  }
}

TEST_F(LoraTrainingTest, ABaseFromInitFromIsReloadedNotSavedAndResumesBitForBit) {
  // A Hugging Face base file with its own values (not train.seed's init).
  JobSpec job = Job(2, 2, 2, 1, ModelConfig::LLAMA);
  job.mutable_train()->set_max_steps(6);
  zerotrain::ModelConfig plain = ValidatedJob(job).value().model();
  plain.clear_lora();
  plain.clear_base_dtype();
  const ModelLayout plain_layout = BuildModelLayout(plain);
  Weights base(plain_layout.units.size());
  std::vector<const float*> units;
  for (size_t u = 0; u < plain_layout.units.size(); ++u) {
    for (int64_t i = 0; i < plain_layout.units[u].numel; ++i) {
      base[u].push_back(0.02f * static_cast<float>((i * 13 + u * 5) % 23) - 0.22f);
    }
    units.push_back(base[u].data());
  }
  const std::string hf = (dir_ / "base.safetensors").string();
  ASSERT_TRUE(ExportHuggingFace(hf, plain, plain_layout, units).ok());
  job.mutable_model()->set_init_from(hf);

  const LoraRun uninterrupted = Train(job, 6);
  ASSERT_EQ(uninterrupted.losses.size(), 6u);
  // The base in memory is the file's, untouched by training.
  const std::vector<char>& block0 = uninterrupted.base_after.at("block.0.params");
  EXPECT_EQ(std::memcmp(block0.data(), base[1].data(), base[1].size() * sizeof(float)), 0);

  const std::filesystem::path ckpt = dir_ / "ckpt-init-from";
  job.mutable_checkpoint()->set_dir(ckpt.string());
  job.mutable_checkpoint()->set_interval_steps(3);
  ASSERT_EQ(Train(job, 3).losses.size(), 3u);
  // The checkpoint holds the adapters, not the base.
  const std::string rank0 = (ckpt / "step-00000003" / "rank-00000.safetensors").string();
  ASSERT_TRUE(std::filesystem::exists(rank0)) << rank0;
  std::unique_ptr<SafetensorsFile> file = SafetensorsFile::Open(rank0).value();
  EXPECT_NE(file->Find("block.0.lora"), nullptr);
  EXPECT_EQ(file->Find("block.0.params"), nullptr);
  EXPECT_EQ(file->Find("embedding.params"), nullptr);
  TrainOptions resume;
  resume.resume_dir = ckpt.string();
  const LoraRun resumed = Train(job, 6, resume);
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (size_t s = 0; s < 3; ++s) EXPECT_EQ(resumed.losses[s], uninterrupted.losses[3 + s]);
  EXPECT_EQ(MaxAbsDiff(resumed.adapters[0], uninterrupted.adapters[0]), 0.0);

  // The merged export reads the base from model.init_from: an unadapted tensor is the file's.
  const std::string merged = (dir_ / "merged-init-from").string();
  ASSERT_TRUE(ExportLoraCheckpoint(ckpt.string(), merged, {.merge_adapters = true}).ok());
  const std::vector<float> norm =
      ReadTensor((std::filesystem::path(merged) / "model.safetensors").string(),
                 "model.layers.0.input_layernorm.weight");
  const ParamSpec& ln1 = *plain_layout.block(0).Find("ln1.weight");
  ASSERT_EQ(norm.size(), static_cast<size_t>(ln1.numel));
  for (int64_t i = 0; i < ln1.numel; ++i) EXPECT_EQ(norm[i], base[1][ln1.offset + i]);
}

// model.base_dtype NF4 with model.init_from: the base quantizes while it streams in. From an
// F32 and a BF16 file, every NF4 buffer is bit for bit what quantizing the file's values in
// process gives (Llama's fused q/k/v and gate/up assembled from their three and two tensors),
// and the unquantized rest (embedding, norms, head) is the file's values.
TEST_F(LoraTrainingTest, AnNf4BaseFromHuggingFaceIsTheInProcessQuantizationBitForBit) {
  JobSpec job = Job(1, 0, 2, 1, ModelConfig::LLAMA, ModelConfig::NF4);
  const HfBase base = MakeHfBase(job);
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    const std::string what(DTypeName(dtype));
    job.mutable_model()->set_init_from(
        ExportBase(base, (dir_ / ("base-" + what + ".safetensors")).string(), dtype));
    const JobSpec validated = ValidatedJob(job).value();
    ASSERT_TRUE(CheckEngineSupport(validated).ok()) << CheckEngineSupport(validated);
    absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(validated, {});
    ASSERT_TRUE(t.ok()) << what << ": " << t.status();
    // The file's values in f32: a BF16 file holds them rounded to bf16.
    auto file_value = [&](float v) {
      return dtype == DType::kBF16 ? Bf16ToFloat(FloatToBf16(v)) : v;
    };
    const ModelLayout& layout = (*t)->model().layout();
    const DeviceContext ctx = CpuContext(1);
    int quantized = 0;
    for (size_t u = 0; u < layout.units.size(); ++u) {
      for (const ParamSpec& p : layout.units[u].params) {
        const ParamSpec& plain = *base.layout.units[u].Find(p.name);
        std::vector<float> values(static_cast<size_t>(p.numel));
        for (int64_t i = 0; i < p.numel; ++i) {
          values[i] = file_value(base.units[u][plain.offset + i]);
        }
        if (!p.quantized) {
          const float* got = (*t)->model().unit_params()[u].data<float>() + p.offset;
          ASSERT_EQ(std::memcmp(got, values.data(), values.size() * sizeof(float)), 0)
              << what << " " << layout.units[u].name << " " << p.name;
          continue;
        }
        // The reference: the same values quantized in process.
        Nf4Buffers storage(p.numel, Nf4Absmax::kDoubleQuantized);
        const Nf4Tensor want = storage.View();
        ASSERT_TRUE(
            Nf4Quantize(ctx, {.src = Tensor(values.data(), DType::kF32, {p.numel}), .dst = want})
                .ok());
        const Nf4Tensor* got = (*t)->model().QuantizedWeight(static_cast<int>(u), p.name);
        ASSERT_NE(got, nullptr) << p.name;
        const std::string where = what + " " + layout.units[u].name + " " + p.name;
        EXPECT_EQ(Bytes(got->codes), Bytes(want.codes)) << where;
        EXPECT_EQ(Bytes(got->absmax), Bytes(want.absmax)) << where;
        EXPECT_EQ(Bytes(got->absmax_scale), Bytes(want.absmax_scale)) << where;
        EXPECT_EQ(Bytes(got->absmax_offset), Bytes(want.absmax_offset)) << where;
        ++quantized;
      }
    }
    EXPECT_EQ(quantized, 8) << what;  // four linear weights in each of the two blocks
  }
}

// The first step's loss is the base model's (B = 0: fresh adapters add nothing): over the NF4
// base streamed from an F32 file it equals, to fp32 noise, an FP32 base loaded from a file of
// the dequantized weights, and lies within NF4's error of the original file loaded as FP32
// (without equalling it: the weights were quantized). LoRA then trains from it, and a resume
// continues bit for bit with the base reloaded from the file, not saved.
TEST_F(LoraTrainingTest, AnNf4BaseFromHuggingFaceTrainsAndResumesBitForBit) {
  JobSpec job = Job(1, 0, 2, 1, ModelConfig::LLAMA, ModelConfig::NF4);
  job.mutable_train()->set_max_steps(6);
  job.mutable_optimizer()->set_lr(1e-2f);
  const HfBase base = MakeHfBase(job);
  job.mutable_model()->set_init_from(
      ExportBase(base, (dir_ / "base.safetensors").string(), DType::kF32));
  JobSpec fp32 = job;
  fp32.mutable_model()->set_base_dtype(ModelConfig::FP32);
  const LoraRun reference = Train(fp32, 1);
  // The same FP32 job over a file of the dequantized NF4 weights (each fused weight quantized
  // and dequantized in process): what the NF4 base must compute, to fp32 noise.
  HfBase dequantized = base;
  for (size_t u = 0; u < base.layout.units.size(); ++u) {
    for (const ParamSpec& p : base.layout.units[u].params) {
      if (p.name != "attn.qkv.weight" && p.name != "attn.proj.weight" &&
          p.name != "mlp.fc.weight" && p.name != "mlp.proj.weight") {
        continue;
      }
      Nf4Buffers storage(p.numel, Nf4Absmax::kDoubleQuantized);
      const Nf4Tensor q = storage.View();
      const Tensor w(dequantized.units[u].data() + p.offset, DType::kF32, {p.numel});
      ASSERT_TRUE(Nf4Quantize(CpuContext(1), {.src = w, .dst = q}).ok());
      ASSERT_TRUE(Nf4Dequantize(CpuContext(1), {.src = q, .dst = w}).ok());
    }
  }
  JobSpec fp32_dequantized = fp32;
  fp32_dequantized.mutable_model()->set_init_from(
      ExportBase(dequantized, (dir_ / "dequantized.safetensors").string(), DType::kF32));
  const LoraRun dequantized_reference = Train(fp32_dequantized, 1);
  const LoraRun uninterrupted = Train(job, 6);
  ASSERT_EQ(reference.losses.size(), 1u);
  ASSERT_EQ(dequantized_reference.losses.size(), 1u);
  ASSERT_EQ(uninterrupted.losses.size(), 6u);
  // fp32 noise of two summation orders (NF4's 512-row tiles vs one GEMM) over two blocks.
  EXPECT_NEAR(uninterrupted.losses[0], dequantized_reference.losses[0],
              1e-6 * dequantized_reference.losses[0]);
  // NF4 keeps each weight to within about 1/10 of its block's absmax (half the widest gap
  // between the 16 levels); over two blocks of a d_model-32 model that moves the mean
  // cross-entropy of a near-uniform prediction (ln 32 ≈ 3.47) by well under 2%; a weight in
  // the wrong place (rows of q/k/v or gate/up swapped) or an unscaled block moves it further.
  EXPECT_NEAR(uninterrupted.losses[0], reference.losses[0], 0.02 * reference.losses[0]);
  EXPECT_NE(uninterrupted.losses[0], reference.losses[0]);
  for (const double l : uninterrupted.losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_TRUE(uninterrupted.base_before == uninterrupted.base_after);

  const std::filesystem::path ckpt = dir_ / "ckpt-nf4-init-from";
  job.mutable_checkpoint()->set_dir(ckpt.string());
  job.mutable_checkpoint()->set_interval_steps(3);
  ASSERT_EQ(Train(job, 3).losses.size(), 3u);
  const std::string rank0 = (ckpt / "step-00000003" / "rank-00000.safetensors").string();
  ASSERT_TRUE(std::filesystem::exists(rank0)) << rank0;
  std::unique_ptr<SafetensorsFile> file = SafetensorsFile::Open(rank0).value();
  EXPECT_NE(file->Find("block.0.lora"), nullptr);
  for (const SafetensorsTensorInfo& t : file->tensors()) {
    EXPECT_EQ(t.name.find(".nf4."), std::string::npos) << t.name << ": the base is reloaded";
    EXPECT_FALSE(t.name.ends_with(".params")) << t.name << ": the base is reloaded";
  }
  TrainOptions resume;
  resume.resume_dir = ckpt.string();
  const LoraRun resumed = Train(job, 6, resume);
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (size_t s = 0; s < 3; ++s) EXPECT_EQ(resumed.losses[s], uninterrupted.losses[3 + s]);
  EXPECT_EQ(MaxAbsDiff(resumed.adapters[0], uninterrupted.adapters[0]), 0.0);
  EXPECT_TRUE(resumed.base_before == uninterrupted.base_before);
}

// Two ranks stream the same file: at stage 3 each casts only its shard of the unquantized
// units (and quantizes the NF4 weights whole), at stages 0–2 all of it; each matches one rank
// on the same global batch within fp32 reduction noise.
TEST_F(LoraTrainingTest, TwoRanksStreamAnNf4BaseAndMatchOneRank) {
  JobSpec one = Job(1, 0, 4, 1, ModelConfig::LLAMA, ModelConfig::NF4);
  const std::string hf =
      ExportBase(MakeHfBase(one), (dir_ / "ranks-base.safetensors").string(), DType::kF32);
  one.mutable_model()->set_init_from(hf);
  const LoraRun reference = Train(one, 5);
  ASSERT_EQ(reference.losses.size(), 5u);
  for (int stage : {0, 3}) {
    JobSpec two = Job(2, stage, 2, 1, ModelConfig::LLAMA, ModelConfig::NF4);
    two.mutable_model()->set_init_from(hf);
    ExpectMatches(Train(two, 5), reference, absl::StrCat("NF4 from a file, stage ", stage));
  }
}

// A base file that lacks a tensor, holds a non-finite weight, or is cut short is refused at
// start, naming the file and the tensor (or the file's fault).
TEST_F(LoraTrainingTest, AnNf4BaseFromABadFileIsRefusedNamingTheFileAndTensor) {
  JobSpec job = Job(1, 0, 2, 1, ModelConfig::LLAMA, ModelConfig::NF4);
  HfBase base = MakeHfBase(job);
  auto create = [&](const std::string& path) {
    job.mutable_model()->set_init_from(path);
    return Trainer::Create(ValidatedJob(job).value(), {}).status();
  };
  // Missing: every tensor but layer 1's k_proj.
  const std::string missing = (dir_ / "missing.safetensors").string();
  {
    const std::vector<HfTensor> table = HuggingFaceTensors(base.plain, base.layout).value();
    std::vector<SafetensorsTensorSpec> specs;
    for (const HfTensor& t : table) {
      if (t.name != "model.layers.1.self_attn.k_proj.weight") {
        specs.push_back({t.name, StDType::kF32, t.shape});
      }
    }
    auto w = SafetensorsWriter::Create(missing, specs).value();
    std::vector<float> scratch;
    for (const HfTensor& t : table) {
      if (t.name == "model.layers.1.self_attn.k_proj.weight") continue;
      const absl::Span<const float> range(base.units[t.unit].data() + t.unit_begin(), t.numel());
      ASSERT_TRUE(w->WriteF32(t.name, HfOrder(t, range, &scratch)).ok());
    }
    ASSERT_TRUE(w->Finish().ok());
  }
  absl::Status s = create(missing);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(missing), std::string::npos) << s;
  EXPECT_NE(s.message().find("missing tensor \"model.layers.1.self_attn.k_proj.weight\""),
            std::string::npos)
      << s;

  // Not finite: a NaN in layer 0's up_proj (rows [F, 2F) of the fused mlp.fc.weight).
  const ParamSpec& fc = *base.layout.block(0).Find("mlp.fc.weight");
  base.units[1][fc.offset + fc.numel / 2 + 5] = std::numeric_limits<float>::quiet_NaN();
  const std::string nan = ExportBase(base, (dir_ / "nan.safetensors").string(), DType::kF32);
  s = create(nan);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(nan + ": tensor \"model.layers.0.mlp.up_proj.weight\""),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("finite"), std::string::npos) << s;

  // Cut short: the last bytes of the file are gone.
  const std::string cut = (dir_ / "cut.safetensors").string();
  std::filesystem::copy_file(nan, cut);
  std::filesystem::resize_file(cut, std::filesystem::file_size(cut) - 100);
  s = create(cut);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(cut), std::string::npos) << s;
}

// The merged export of an NF4 base: W is what the NF4 weights dequantize to (what the job
// trained against), W + scale·B·A in the export's dtype; for a seeded base (the checkpoint's
// NF4 buffers) and for one streamed from a Hugging Face file (quantized again from the file).
TEST_F(LoraTrainingTest, MergedExportOfAnNf4BaseIsTheDequantizedBasePlusTheAdapters) {
  for (const bool from_hf : {false, true}) {
    const std::string what = from_hf ? "from a Hugging Face file" : "seeded";
    JobSpec job = Job(1, 0, 2, 1, ModelConfig::LLAMA, ModelConfig::NF4);
    job.mutable_train()->set_max_steps(3);
    job.mutable_optimizer()->set_lr(1e-2f);
    if (from_hf) {
      job.mutable_model()->set_init_from(
          ExportBase(MakeHfBase(job), (dir_ / "merge-base.safetensors").string(), DType::kF32));
    }
    const std::filesystem::path ckpt = dir_ / (from_hf ? "ckpt-merge-hf" : "ckpt-merge-seeded");
    job.mutable_checkpoint()->set_dir(ckpt.string());
    const LoraRun run = Train(job, 3);
    ASSERT_EQ(run.losses.size(), 3u);
    const JobSpec validated = ValidatedJob(job).value();
    const ModelLayout layout = BuildModelLayout(validated.model());
    const std::string merged = (dir_ / (from_hf ? "merged-nf4-hf" : "merged-nf4-seeded")).string();
    absl::StatusOr<LoraExportResult> exported =
        ExportLoraCheckpoint(ckpt.string(), merged, {.merge_adapters = true});
    ASSERT_TRUE(exported.ok()) << what << ": " << exported.status();
    const std::string file = (std::filesystem::path(merged) / "model.safetensors").string();

    // The job's own NF4 weight of block 1's q/k/v, dequantized.
    const UnitLayout& block = layout.block(1);
    const ParamSpec& w = *block.Find("attn.qkv.weight");
    ASSERT_TRUE(w.quantized);
    auto buffer = [&](const std::string& part, DType dtype) {
      const std::vector<char>& b = run.base_after.at("block.1.nf4.attn.qkv.weight." + part);
      const int64_t n = static_cast<int64_t>(b.size()) / static_cast<int64_t>(DTypeSize(dtype));
      return Tensor(const_cast<char*>(b.data()), dtype, {n});
    };
    const Nf4Tensor q{.numel = w.numel,
                      .codes = buffer("codes", DType::kU8),
                      .absmax = buffer("absmax", DType::kU8),
                      .absmax_scale = buffer("absmax_scale", DType::kF32),
                      .absmax_offset = buffer("absmax_offset", DType::kF32)};
    std::vector<float> dequantized(static_cast<size_t>(w.numel));
    ASSERT_TRUE(Nf4Dequantize(CpuContext(1),
                              {.src = q, .dst = Tensor(dequantized.data(), DType::kF32, {w.numel})})
                    .ok());
    const double scale = validated.model().lora().alpha() / validated.model().lora().rank();
    const float* adapters = run.adapters[0][2].data();
    const int64_t in = w.shape[1], r = validated.model().lora().rank();
    for (const LoraSite& site : block.lora) {
      if (site.weight != "attn.qkv.weight") continue;
      const std::vector<float> got = ReadTensor(file, "model.layers.1." + site.hf_path + ".weight");
      ASSERT_EQ(static_cast<int64_t>(got.size()), site.rows * in) << site.hf_path;
      const double worst =
          MergedSiteError(site, dequantized.data(), adapters, in, r, scale, got).worst;
      // One f32 rounding of a value below 1 (the merge sums in float64 and rounds once).
      EXPECT_LT(worst, 1e-6) << what << " " << site.hf_path;
    }
    // An unquantized, unadapted tensor is the base's own.
    const std::vector<float> norm = ReadTensor(file, "model.layers.1.input_layernorm.weight");
    const ParamSpec& ln1 = *block.Find("ln1.weight");
    const float* params =
        reinterpret_cast<const float*>(run.base_after.at("block.1.params").data());
    ASSERT_EQ(norm.size(), static_cast<size_t>(ln1.numel));
    for (int64_t i = 0; i < ln1.numel; ++i) EXPECT_EQ(norm[i], params[ln1.offset + i]) << what;
  }
}

TEST_F(LoraTrainingTest, ExportWritesThePeftAdaptersAndTheMergedModel) {
  for (const auto family : {ModelConfig::LLAMA, ModelConfig::GPT2}) {
    const std::string what(ModelConfig::Family_Name(family));
    const std::filesystem::path ckpt = dir_ / ("ckpt-" + what);
    JobSpec job = Job(2, 1, 2, 1, family);
    job.mutable_train()->set_max_steps(3);
    job.mutable_checkpoint()->set_dir(ckpt.string());
    const LoraRun run = Train(job, 3);
    ASSERT_EQ(run.losses.size(), 3u);
    const JobSpec validated = ValidatedJob(job).value();
    const ModelLayout layout = BuildModelLayout(validated.model());

    // The PEFT directory reads back as the trained adapters.
    const std::string peft = (dir_ / ("peft-" + what)).string();
    ASSERT_TRUE(IsLoraCheckpoint(ckpt.string()).value());
    absl::StatusOr<LoraExportResult> exported = ExportLoraCheckpoint(ckpt.string(), peft, {});
    ASSERT_TRUE(exported.ok()) << exported.status();
    EXPECT_EQ(exported->step, 3);
    Weights read(layout.units.size());
    std::vector<Tensor> views(layout.units.size());
    for (size_t u = 0; u < layout.units.size(); ++u) {
      read[u].assign(static_cast<size_t>(layout.units[u].lora_numel), -7.0f);
      if (!read[u].empty()) {
        views[u] = Tensor(read[u].data(), DType::kF32, {layout.units[u].lora_numel});
      }
    }
    ASSERT_TRUE(ReadPeftAdapter(validated.model(), layout, peft, views).ok());
    EXPECT_EQ(MaxAbsDiff(read, run.adapters[0]), 0.0) << what;

    // The merged model: each adapted weight W + scale·B·A (float64 reference), the rest W.
    const std::string merged = (dir_ / ("merged-" + what)).string();
    exported = ExportLoraCheckpoint(ckpt.string(), merged, {.merge_adapters = true});
    ASSERT_TRUE(exported.ok()) << exported.status();
    EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(merged) / "config.json"));
    const std::string file = (std::filesystem::path(merged) / "model.safetensors").string();
    const double scale = validated.model().lora().alpha() / validated.model().lora().rank();
    const UnitLayout& block = layout.block(1);
    const std::vector<char>& base_bytes = run.base_after.at("block.1.params");
    const float* base = reinterpret_cast<const float*>(base_bytes.data());
    const float* adapters = run.adapters[0][2].data();
    const LoraSite& site = block.lora.front();  // q_proj / c_attn
    const ParamSpec& w = *block.Find(site.weight);
    const std::string name = family == ModelConfig::LLAMA ? "model.layers.1.self_attn.q_proj.weight"
                                                          : "transformer.h.1.attn.c_attn.weight";
    const std::vector<float> got = ReadTensor(file, name);
    ASSERT_FALSE(got.empty());
    const int64_t in = w.shape[1], r = validated.model().lora().rank();
    double worst = 0;
    for (int64_t row = 0; row < site.rows; ++row) {
      for (int64_t col = 0; col < in; ++col) {
        double delta = 0;
        for (int64_t k = 0; k < r; ++k) {
          delta += static_cast<double>(adapters[site.b.offset + row * r + k]) *
                   adapters[site.a.offset + k * in + col];
        }
        const double want = base[w.offset + (site.row_begin + row) * in + col] + scale * delta;
        // Llama stores (out, in) as we do; GPT-2's Conv1D is transposed, (in, out).
        const int64_t at =
            family == ModelConfig::LLAMA ? row * in + col : col * w.shape[0] + site.row_begin + row;
        worst = std::max(worst, std::abs(want - got[at]));
      }
    }
    // One f32 rounding of the merged value (the merge sums in float64 and rounds once).
    EXPECT_LT(worst, 1e-6) << what;

    // Stage 3: the base is read back from both ranks' shards. The same seeded base and the
    // same data give the same merged model up to the adapters' fp32 reduction noise, and the
    // embedding (no adapter) bit for bit.
    JobSpec sharded = job;
    sharded.mutable_parallel()->set_zero_stage(3);
    sharded.mutable_checkpoint()->set_dir((dir_ / ("ckpt3-" + what)).string());
    ASSERT_EQ(Train(sharded, 3).losses.size(), 3u);
    const std::string merged3 = (dir_ / ("merged3-" + what)).string();
    exported = ExportLoraCheckpoint(sharded.checkpoint().dir(), merged3, {.merge_adapters = true});
    ASSERT_TRUE(exported.ok()) << exported.status();
    const std::string file3 = (std::filesystem::path(merged3) / "model.safetensors").string();
    const std::string embedding =
        family == ModelConfig::LLAMA ? "model.embed_tokens.weight" : "transformer.wte.weight";
    EXPECT_EQ(ReadTensor(file3, embedding), ReadTensor(file, embedding)) << what;
    const std::vector<float> got3 = ReadTensor(file3, name);
    ASSERT_EQ(got3.size(), got.size());
    double worst3 = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      worst3 = std::max(worst3, std::abs(static_cast<double>(got3[i]) - got[i]));
    }
    EXPECT_LT(worst3, 1e-5) << what;  // the TwoRanks test's bound on the adapters
  }
}

TEST_F(LoraTrainingTest, InitFromStartsFromTheGivenAdapters) {
  JobSpec job = Job(1, 0, 4, 1, ModelConfig::LLAMA);
  const JobSpec validated = ValidatedJob(job).value();
  const ModelLayout layout = BuildModelLayout(validated.model());
  const std::string peft = (dir_ / "given").string();
  const absl::StatusOr<Weights> given =
      testing::WritePatternPeftAdapter(validated.model(), layout, peft);
  ASSERT_TRUE(given.ok()) << given.status();
  job.mutable_model()->mutable_lora()->set_init_from(peft);
  const LoraRun start = Train(job, 0);
  EXPECT_EQ(MaxAbsDiff(start.adapters[0], *given), 0.0);
  // And it trains from there.
  const LoraRun trained = Train(job, 2);
  EXPECT_GT(MaxAbsDiff(trained.adapters[0], *given), 0.0);
}

}  // namespace
}  // namespace zt
