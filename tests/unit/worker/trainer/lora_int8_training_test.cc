// A LoRA job over an LLM.int8() base (model.base_dtype INT8, docs/lora.md) through the step
// loop: it trains with the int8 codes and row scales left bit for bit; 2 ranks at ZeRO 0 and 3
// match one rank; the plan's int8 buffers are what the arenas hold; a checkpoint resumes bit
// for bit; a base streamed from a Hugging Face file is the in-process quantization bit for bit;
// the merged export is the read-back base plus scale·B·A.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/int8_linear.h"
#include "tests/unit/worker/trainer/lora_training_fixture.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/job/job_loading.h"
#include "worker/job/job_validation.h"
#include "worker/checkpoint/lora_export.h"
#include "worker/model/param_layout.h"
#include "worker/plan/lora_plan.h"
#include "worker/plan/memory_plan.h"
#include "worker/train/trainer.h"

namespace zt {
namespace {

using testing::Bytes;
using testing::ExpectMatches;
using testing::ExportBase;
using testing::HfBase;
using testing::LoraRun;
using testing::MergedSiteError;
using testing::MakeHfBase;
using testing::MaxAbsDiff;
using testing::ReadTensor;
using zerotrain::JobSpec;
using zerotrain::ModelConfig;

class LoraInt8TrainingTest : public testing::LoraTrainingTest {
 protected:
  JobSpec Int8Job(int world, int stage, int micro_batch, int accum = 1) {
    return Job(world, stage, micro_batch, accum, ModelConfig::LLAMA, ModelConfig::INT8);
  }
};

// The plan's INT8 base buffers (codes and scales of every quantized weight).
int CountInt8Buffers(const MemoryPlan& plan) {
  int n = 0;
  for (const BufferSpec& b : plan.buffers) n += b.name.find(".int8.") != std::string::npos;
  return n;
}

TEST_F(LoraInt8TrainingTest, OneRankTrainsAndTheArenasHoldExactlyThePlannedInt8Base) {
  JobSpec job = Int8Job(1, 0, 4);
  job.mutable_optimizer()->set_lr(1e-2f);
  const JobSpec validated = ValidatedJob(job).value();
  EXPECT_EQ(validated.model().int8_threshold(), 6.0f);  // the paper's default, filled in
  {
    absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(validated, {});
    ASSERT_TRUE(t.ok()) << t.status();
    const ModelLayout& layout = (*t)->model().layout();
    ASSERT_EQ(layout.base_quantization, BaseQuantization::kInt8);
    int64_t weights = 0, rows = 0, planned = 0;
    for (const UnitLayout& u : layout.units) {
      for (const ParamSpec& p : u.params) {
        if (!p.quantized) continue;
        weights += p.numel;
        rows += p.shape[0];
      }
    }
    for (const BufferSpec& b : (*t)->plan().buffers) {
      if (b.name.find(".int8.") == std::string::npos) continue;
      const Tensor held = (*t)->arenas().Get(b.name).value();
      EXPECT_EQ(held.size_bytes(), b.bytes()) << b.name;
      planned += b.bytes();
    }
    // One byte per weight and one f32 scale per output row: nothing more, nothing less.
    EXPECT_EQ(planned, weights + 4 * rows);
    EXPECT_EQ(CountInt8Buffers((*t)->plan()), 2 * 4 * 2);  // codes + scales, 4 weights, 2 blocks
  }
  const LoraRun run = Train(job, 20);
  ASSERT_EQ(run.losses.size(), 20u);
  // As the FP32/NF4 bases in LoraTrainingTest: rank-4 adapters fit the pattern corpus.
  EXPECT_LT(run.losses.back(), run.losses.front() - 0.3);
  ASSERT_FALSE(run.base_before.empty());
  EXPECT_TRUE(run.base_before.contains("block.0.int8.attn.qkv.weight.codes"));
  EXPECT_TRUE(run.base_before == run.base_after) << "the frozen int8 base changed";
  EXPECT_TRUE(run.unclaimed.empty()) << "unused plan buffer " << run.unclaimed.front();
}

TEST_F(LoraInt8TrainingTest, TwoRanksAtStagesZeroAndThreeMatchOneRank) {
  const LoraRun reference = Train(Int8Job(1, 0, 4), 5);
  ASSERT_EQ(reference.losses.size(), 5u);
  for (int stage : {0, 3}) {
    // ExpectMatches' bounds: the int8 layers are deterministic per token, so the ranks differ
    // from one rank only by the adapters' fp32 reduction order.
    ExpectMatches(Train(Int8Job(2, stage, 2), 5), reference, absl::StrCat("INT8 stage ", stage));
  }
}

TEST_F(LoraInt8TrainingTest, ResumeContinuesBitForBit) {
  for (int stage : {0, 3}) {
    const std::string what = absl::StrCat("INT8 stage ", stage);
    const std::filesystem::path ckpt = dir_ / absl::StrCat("ckpt-int8-", stage);
    JobSpec job = Int8Job(2, stage, 2, /*accum=*/2);
    job.mutable_model()->mutable_lora()->set_dropout(0.1f);
    job.mutable_train()->set_max_steps(6);
    const LoraRun uninterrupted = Train(job, 6);
    job.mutable_checkpoint()->set_dir(ckpt.string());
    job.mutable_checkpoint()->set_interval_steps(3);
    const LoraRun first = Train(job, 3);
    ASSERT_EQ(first.losses.size(), 3u) << what;
    // A seeded INT8 base is saved: codes and scales, at stage 3 as each rank's shard of the
    // block's quantized bytes.
    const std::string rank0 = (ckpt / "step-00000003" / "rank-00000.safetensors").string();
    std::unique_ptr<SafetensorsFile> file = SafetensorsFile::Open(rank0).value();
    if (stage == 3) {
      EXPECT_NE(file->Find("block.1.qbase"), nullptr) << what;
      EXPECT_EQ(file->Find("block.1.int8.mlp.fc.weight.codes"), nullptr) << what;
    } else {
      EXPECT_NE(file->Find("block.1.int8.mlp.fc.weight.codes"), nullptr) << what;
      EXPECT_NE(file->Find("block.1.int8.mlp.fc.weight.scales"), nullptr) << what;
    }
    TrainOptions resume;
    resume.resume_dir = ckpt.string();
    const LoraRun second = Train(job, 6, resume);
    ASSERT_EQ(second.losses.size(), 3u) << what;
    for (size_t s = 0; s < 3; ++s) {
      EXPECT_EQ(first.losses[s], uninterrupted.losses[s]) << what << " step " << s + 1;
      EXPECT_EQ(second.losses[s], uninterrupted.losses[3 + s]) << what << " step " << s + 4;
    }
    EXPECT_EQ(MaxAbsDiff(second.adapters[0], uninterrupted.adapters[0]), 0.0) << what;
    EXPECT_TRUE(second.base_after == uninterrupted.base_after) << what;
  }
}

// model.init_from with INT8: every int8 buffer is bit for bit what quantizing the file's values
// in process gives (Llama's fused q/k/v and gate/up assembled from their tensors first), the
// checkpoints leave the base out, a resume reloads it and continues bit for bit, and the merged
// export is written in the file's dtype.
TEST_F(LoraInt8TrainingTest, ABaseFromHuggingFaceIsTheInProcessQuantizationAndResumes) {
  JobSpec job = Int8Job(1, 0, 2);
  job.mutable_train()->set_max_steps(4);
  const HfBase base = MakeHfBase(job);
  job.mutable_model()->set_init_from(
      ExportBase(base, (dir_ / "int8-base.safetensors").string(), DType::kBF16));
  {
    absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(ValidatedJob(job).value(), {});
    ASSERT_TRUE(t.ok()) << t.status();
    const ModelLayout& layout = (*t)->model().layout();
    int quantized = 0;
    for (size_t u = 0; u < layout.units.size(); ++u) {
      for (const ParamSpec& p : layout.units[u].params) {
        if (!p.quantized) continue;
        const ParamSpec& plain = *base.layout.units[u].Find(p.name);
        std::vector<float> values(static_cast<size_t>(p.numel));
        for (int64_t i = 0; i < p.numel; ++i) {
          values[i] = Bf16ToFloat(FloatToBf16(base.units[u][plain.offset + i]));  // the file's
        }
        std::vector<uint8_t> codes(static_cast<size_t>(p.numel));
        std::vector<float> scales(static_cast<size_t>(p.shape[0]));
        const Int8Weight want{.codes = Tensor(codes.data(), DType::kU8, {p.shape[0], p.shape[1]}),
                              .scales = Tensor(scales.data(), DType::kF32, {p.shape[0]})};
        ASSERT_TRUE(Int8QuantizeWeight(CpuContext(1), {.src = Tensor(values.data(), DType::kF32,
                                                                     {p.shape[0], p.shape[1]}),
                                                       .dst = want})
                        .ok());
        const Int8Weight* got = (*t)->model().Int8QuantizedWeight(static_cast<int>(u), p.name);
        ASSERT_NE(got, nullptr) << p.name;
        EXPECT_EQ(Bytes(got->codes), Bytes(want.codes)) << layout.units[u].name << " " << p.name;
        EXPECT_EQ(Bytes(got->scales), Bytes(want.scales)) << layout.units[u].name << " " << p.name;
        ++quantized;
      }
    }
    EXPECT_EQ(quantized, 8);
  }
  const LoraRun uninterrupted = Train(job, 4);
  ASSERT_EQ(uninterrupted.losses.size(), 4u);
  const std::filesystem::path ckpt = dir_ / "ckpt-int8-hf";
  job.mutable_checkpoint()->set_dir(ckpt.string());
  job.mutable_checkpoint()->set_interval_steps(2);
  ASSERT_EQ(Train(job, 2).losses.size(), 2u);
  std::unique_ptr<SafetensorsFile> file =
      SafetensorsFile::Open((ckpt / "step-00000002" / "rank-00000.safetensors").string()).value();
  for (const SafetensorsTensorInfo& t : file->tensors()) {
    EXPECT_FALSE(IsQuantizedBaseBuffer(t.name)) << t.name << ": the base is reloaded";
  }
  TrainOptions resume;
  resume.resume_dir = ckpt.string();
  const LoraRun resumed = Train(job, 4, resume);
  ASSERT_EQ(resumed.losses.size(), 2u);
  for (size_t s = 0; s < 2; ++s) EXPECT_EQ(resumed.losses[s], uninterrupted.losses[2 + s]);
  EXPECT_TRUE(resumed.base_before == uninterrupted.base_before);

  // The merged model comes out in the base's original dtype (the file's BF16) unless asked
  // otherwise.
  const std::string merged = (dir_ / "merged-int8-bf16").string();
  ASSERT_TRUE(ExportLoraCheckpoint(ckpt.string(), merged, {.merge_adapters = true}).ok());
  std::unique_ptr<SafetensorsFile> out =
      SafetensorsFile::Open((std::filesystem::path(merged) / "model.safetensors").string()).value();
  ASSERT_FALSE(out->tensors().empty());
  for (const SafetensorsTensorInfo& t : out->tensors()) {
    EXPECT_EQ(t.dtype, StDType::kBF16) << t.name;
  }
  const std::string f32 = (dir_ / "merged-int8-f32").string();
  ASSERT_TRUE(
      ExportLoraCheckpoint(ckpt.string(), f32, {.merge_adapters = true, .dtype = DType::kF32})
          .ok());
  out = SafetensorsFile::Open((std::filesystem::path(f32) / "model.safetensors").string()).value();
  for (const SafetensorsTensorInfo& t : out->tensors()) {
    EXPECT_EQ(t.dtype, StDType::kF32) << t.name;
  }
}

// The merged export of an INT8 base: W̃ (the int8 codes read back, Int8DequantizeWeight: what
// the job computed with) plus scale·B·A, for a seeded base (the checkpoint's int8 buffers) and
// one from a Hugging Face file (quantized again from the file as the start did).
TEST_F(LoraInt8TrainingTest, MergedExportIsTheReadBackBasePlusTheAdapters) {
  for (const bool from_hf : {false, true}) {
    const std::string what = from_hf ? "from a Hugging Face file" : "seeded";
    JobSpec job = Int8Job(1, 0, 2);
    job.mutable_train()->set_max_steps(3);
    job.mutable_optimizer()->set_lr(1e-2f);
    if (from_hf) {
      job.mutable_model()->set_init_from(ExportBase(
          MakeHfBase(job), (dir_ / "int8-merge-base.safetensors").string(), DType::kF32));
    }
    const std::filesystem::path ckpt = dir_ / (from_hf ? "int8-merge-hf" : "int8-merge-seeded");
    job.mutable_checkpoint()->set_dir(ckpt.string());
    const LoraRun run = Train(job, 3);
    ASSERT_EQ(run.losses.size(), 3u);
    const JobSpec validated = ValidatedJob(job).value();
    const ModelLayout layout = BuildModelLayout(validated.model());
    const std::string merged = (dir_ / (from_hf ? "merged-int8-hf" : "merged-int8")).string();
    absl::StatusOr<LoraExportResult> exported =
        ExportLoraCheckpoint(ckpt.string(), merged, {.merge_adapters = true});
    ASSERT_TRUE(exported.ok()) << what << ": " << exported.status();
    const std::string file = (std::filesystem::path(merged) / "model.safetensors").string();

    const UnitLayout& block = layout.block(1);
    const ParamSpec& w = *block.Find("mlp.fc.weight");  // gate | up
    ASSERT_TRUE(w.quantized);
    auto bytes = [&](const std::string& part) {
      return const_cast<char*>(run.base_after.at("block.1.int8.mlp.fc.weight." + part).data());
    };
    const Int8Weight q{.codes = Tensor(bytes("codes"), DType::kU8, {w.shape[0], w.shape[1]}),
                       .scales = Tensor(bytes("scales"), DType::kF32, {w.shape[0]})};
    std::vector<float> read_back(static_cast<size_t>(w.numel));
    ASSERT_TRUE(Int8DequantizeWeight(CpuContext(1), {.src = q,
                                                     .dst = Tensor(read_back.data(), DType::kF32,
                                                                   {w.shape[0], w.shape[1]})})
                    .ok());
    const double scale = validated.model().lora().alpha() / validated.model().lora().rank();
    const float* adapters = run.adapters[0][2].data();
    const int64_t in = w.shape[1], r = validated.model().lora().rank();
    int sites = 0;
    for (const LoraSite& site : block.lora) {
      if (site.weight != "mlp.fc.weight") continue;
      const std::vector<float> got = ReadTensor(file, "model.layers.1." + site.hf_path + ".weight");
      ASSERT_EQ(static_cast<int64_t>(got.size()), site.rows * in) << site.hf_path;
      const auto [worst, moved] =
          MergedSiteError(site, read_back.data(), adapters, in, r, scale, got);
      // One f32 rounding of a value below 1 (the merge sums in float64 and rounds once).
      EXPECT_LT(worst, 1e-6) << what << " " << site.hf_path;
      EXPECT_GT(moved, 1e-5) << what << " " << site.hf_path << ": the adapters trained";
      ++sites;
    }
    EXPECT_EQ(sites, 2) << what;  // gate_proj and up_proj
  }
}

}  // namespace
}  // namespace zt
