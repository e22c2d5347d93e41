// LoRA on ranks whose memory the host cannot address (separate_memory_device.h: arenas on a
// device of their own, staged communicators, every kernel and staged collective refusing
// memory from the other side), what a CUDA rank is, less the streams: the adapters are
// initialised on the host (PEFT's init, or a PEFT directory) and uploaded through the rank's
// copy engine, trained, checkpointed through the host (BufferBytes) and resumed. Each run is
// the same job on plain CPU ranks bit for bit (the same ops on the same values in the same
// order; only where the bytes live differs): losses, every rank's adapters and their
// optimizer states. A quantized base (QLoRA) is quantized on the host into staging and
// uploaded the same way (docs/lora.md).
#include <filesystem>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/trainer/lora_training_fixture.h"
#include "tests/unit/worker/trainer/separate_memory_device.h"
#include "worker/checkpoint/peft_adapter.h"
#include "worker/plan/lora_plan.h"

namespace zt {
namespace {

using testing::ExportBase;
using testing::LoraRun;
using testing::LoraTrainingTest;
using testing::MakeHfBase;
using zerotrain::JobSpec;
using zerotrain::ModelConfig;
using zerotrain::PrecisionConfig;

class LoraSeparateMemoryTest : public LoraTrainingTest {
 protected:
  static TrainOptions Separate(TrainOptions options = {}) {
    options.make_device = testing::SeparateMemoryDevice;
    return options;
  }
  // `world` ranks at `stage` over an FP32 (GPT-2) or BF16 (Llama, bf16 parameters and
  // compute) base, 4 steps, adapter dropout on (its mask is drawn on the device).
  JobSpec BaseJob(int world, int stage, ModelConfig::BaseDType base) {
    const auto family = base == ModelConfig::FP32 ? ModelConfig::GPT2 : ModelConfig::LLAMA;
    JobSpec job = Job(world, stage, 4 / world, 1, family, base);
    job.mutable_train()->set_max_steps(4);
    job.mutable_model()->mutable_lora()->set_dropout(0.1f);
    if (base == ModelConfig::BF16) {
      job.mutable_precision()->set_param_dtype(PrecisionConfig::BF16);
      job.mutable_precision()->set_compute_dtype(PrecisionConfig::BF16);
    }
    return job;
  }
  // `job` (4 steps) checkpointed into `ckpt` after 2 steps on ranks of their own memory and
  // resumed there to 4: step for step, and at the end, the plain run that never stopped.
  void ExpectResumesAsThePlainRun(JobSpec job, const std::filesystem::path& ckpt,
                                  const std::string& what);
  // `job` (4 steps) on plain CPU ranks and on ranks of their own memory: the same run bit for
  // bit, every plan buffer used, the adapters trained (B starts at zero: a run that never
  // uploaded them, or never downloaded them, would not match the plain one, nor move).
  // Returns {plain, separate} for further checks.
  std::pair<LoraRun, LoraRun> ExpectSeparateIsPlain(const JobSpec& job, const std::string& what);
};

void ExpectSameRun(const LoraRun& got, const LoraRun& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  EXPECT_EQ(got.losses, want.losses) << what;
  ASSERT_EQ(got.adapters.size(), want.adapters.size()) << what;
  for (size_t r = 0; r < want.adapters.size(); ++r) {
    EXPECT_EQ(got.adapters[r], want.adapters[r]) << what << " rank " << r;
  }
  ASSERT_EQ(got.adapter_states.size(), want.adapter_states.size()) << what;
  for (size_t r = 0; r < want.adapter_states.size(); ++r) {
    EXPECT_FALSE(want.adapter_states[r].empty()) << what << " rank " << r;
    EXPECT_EQ(got.adapter_states[r], want.adapter_states[r]) << what << " rank " << r;
  }
}

void LoraSeparateMemoryTest::ExpectResumesAsThePlainRun(JobSpec job,
                                                        const std::filesystem::path& ckpt,
                                                        const std::string& what) {
  const LoraRun straight = Train(job, 4);
  job.mutable_checkpoint()->set_dir(ckpt.string());
  job.mutable_checkpoint()->set_interval_steps(2);
  // A device's state is written from the plan's page-locked staging (on CUDA always; here the
  // plan is a CPU job's, which holds it for asynchronous saves).
  job.mutable_checkpoint()->set_async(true);
  const LoraRun first = Train(job, 2, Separate());
  ASSERT_EQ(first.losses.size(), 2u) << what;
  TrainOptions resume;
  resume.resume_dir = ckpt.string();
  LoraRun second = Train(job, 4, Separate(resume));
  ASSERT_EQ(second.losses.size(), 2u) << what;
  ASSERT_EQ(straight.losses.size(), 4u) << what;
  EXPECT_EQ(first.losses[0], straight.losses[0]) << what;
  EXPECT_EQ(first.losses[1], straight.losses[1]) << what;
  EXPECT_EQ(second.losses[0], straight.losses[2]) << what;
  EXPECT_EQ(second.losses[1], straight.losses[3]) << what;
  second.losses = straight.losses;  // compared step by step above
  ExpectSameRun(second, straight, what);
}

std::pair<LoraRun, LoraRun> LoraSeparateMemoryTest::ExpectSeparateIsPlain(const JobSpec& job,
                                                                          const std::string& what) {
  LoraRun plain = Train(job, 4);
  LoraRun separate = Train(job, 4, Separate());
  EXPECT_EQ(plain.losses.size(), 4u) << what;
  ExpectSameRun(separate, plain, what);
  EXPECT_TRUE(separate.unclaimed.empty()) << what;
  if (!plain.losses.empty()) EXPECT_NE(plain.losses.front(), plain.losses.back()) << what;
  return {std::move(plain), std::move(separate)};
}

struct Config {
  int world, stage;
  ModelConfig::BaseDType base;
};

std::string Name(const Config& c) {
  return absl::StrCat(ModelConfig::BaseDType_Name(c.base), " world ", c.world, " stage ", c.stage);
}

constexpr Config kConfigs[] = {
    {1, 0, ModelConfig::FP32}, {2, 1, ModelConfig::FP32}, {2, 3, ModelConfig::FP32},
    {1, 0, ModelConfig::BF16}, {2, 1, ModelConfig::BF16}, {2, 3, ModelConfig::BF16},
};

TEST_F(LoraSeparateMemoryTest, AdaptersTrainThroughTheCopyEngineBitForBit) {
  for (const Config& c : kConfigs) {
    const std::string what = Name(c);
    ExpectSeparateIsPlain(BaseJob(c.world, c.stage, c.base), what);
  }
}

// A checkpoint written through the host from a rank of its own memory resumes on one, and the
// resumed run continues as the plain run that never stopped.
TEST_F(LoraSeparateMemoryTest, AdapterCheckpointsResumeThroughTheCopyEngine) {
  for (const Config& c : {kConfigs[0], kConfigs[2], kConfigs[4]}) {
    const std::string what = Name(c);
    ExpectResumesAsThePlainRun(BaseJob(c.world, c.stage, c.base),
                               dir_ / absl::StrCat("ckpt-", c.world, "-", c.stage, "-", c.base),
                               what);
  }
}

// Adapters read from a PEFT directory (model.lora.init_from) land in the host staging and go
// up as the seeded ones do: the run is the plain one bit for bit, and not the seeded one.
TEST_F(LoraSeparateMemoryTest, PeftAdaptersAreUploadedThroughTheCopyEngine) {
  JobSpec source = BaseJob(1, 0, ModelConfig::FP32);
  const LoraRun trained = Train(source, 4);
  ASSERT_EQ(trained.adapters.size(), 1u);
  // Trained adapters, so B is not zero and the start differs from PEFT's init.
  const std::string peft = (dir_ / "peft").string();
  {
    absl::StatusOr<JobSpec> validated = ValidatedJob(source);
    ASSERT_TRUE(validated.ok()) << validated.status();
    const ModelLayout layout = BuildModelLayout(validated->model());
    std::vector<Tensor> buffers;
    std::vector<std::vector<float>> adapters = trained.adapters[0];
    for (size_t u = 0; u < adapters.size(); ++u) {
      buffers.push_back(adapters[u].empty() ? Tensor()
                                            : Tensor(adapters[u].data(), DType::kF32,
                                                     {static_cast<int64_t>(adapters[u].size())}));
    }
    ASSERT_TRUE(WritePeftAdapter(validated->model(), layout, buffers, peft).ok());
  }
  JobSpec job = BaseJob(2, 1, ModelConfig::FP32);
  job.mutable_model()->mutable_lora()->set_init_from(peft);
  const LoraRun plain = Train(job, 4);
  const LoraRun separate = Train(job, 4, Separate());
  ExpectSameRun(separate, plain, "from a PEFT directory");
  const LoraRun seeded = Train(BaseJob(2, 1, ModelConfig::FP32), 4);
  ASSERT_EQ(seeded.losses.size(), 4u);
  EXPECT_NE(plain.losses[0], seeded.losses[0]);
}

// QLoRA: an NF4 or INT8 base is quantized on the host (the quantize ops run on the CPU only)
// into staging of one weight's quantized bytes and copied up through the rank's copy engine —
// each buffer below stage 3, the rank's bytes of its "<unit>.qbase" shard at 3. Every rank's
// quantized base is then the plain run's byte for byte, and the run is the plain run bit for
// bit; seeded and streamed from a Hugging Face file (model.init_from).
struct QuantizedConfig {
  int world, stage;
  ModelConfig::BaseDType base;
  bool from_file;
};

TEST_F(LoraSeparateMemoryTest, AQuantizedBaseIsStagedOnTheHostAndUploadedBitForBit) {
  constexpr QuantizedConfig kQuantized[] = {
      {1, 0, ModelConfig::NF4, false},  {2, 1, ModelConfig::NF4, false},
      {2, 3, ModelConfig::NF4, false},  {2, 3, ModelConfig::NF4, true},
      {1, 0, ModelConfig::INT8, false}, {2, 3, ModelConfig::INT8, false},
      {2, 1, ModelConfig::INT8, true},
  };
  for (const QuantizedConfig& c : kQuantized) {
    const std::string what = absl::StrCat(ModelConfig::BaseDType_Name(c.base), " world ", c.world,
                                          " stage ", c.stage, c.from_file ? " from a file" : "");
    JobSpec job = Job(c.world, c.stage, 4 / c.world, 1, ModelConfig::LLAMA, c.base);
    job.mutable_train()->set_max_steps(4);
    job.mutable_model()->mutable_lora()->set_dropout(0.1f);
    if (c.from_file) {
      job.mutable_model()->set_init_from(ExportBase(
          MakeHfBase(job),
          (dir_ / absl::StrCat("base-", c.world, "-", c.stage, "-", c.base, ".safetensors"))
              .string(),
          DType::kBF16));
    }
    const auto [plain, separate] = ExpectSeparateIsPlain(job, what);
    // The base the device trained over (read back through the host), every rank's: a piece
    // never uploaded, or uploaded into the wrong bytes of a shard, differs here.
    ASSERT_EQ(separate.rank_base_after.size(), plain.rank_base_after.size()) << what;
    for (size_t r = 0; r < plain.rank_base_after.size(); ++r) {
      int quantized = 0;
      for (const auto& [name, bytes] : plain.rank_base_after[r]) {
        if (IsQuantizedBaseBuffer(name) || name.ends_with(".qbase")) ++quantized;
      }
      EXPECT_GT(quantized, 0) << what << " rank " << r;
      EXPECT_EQ(separate.rank_base_after[r], plain.rank_base_after[r]) << what << " rank " << r;
    }
  }
}

// A checkpoint leaves the quantized base out; a rank of its own memory resuming one quantizes
// and uploads it again and continues as the run that never stopped.
TEST_F(LoraSeparateMemoryTest, AQuantizedBaseResumesThroughTheCopyEngine) {
  for (const auto base : {ModelConfig::NF4, ModelConfig::INT8}) {
    const std::string what = ModelConfig::BaseDType_Name(base);
    JobSpec job = Job(2, 3, 2, 1, ModelConfig::LLAMA, base);
    job.mutable_train()->set_max_steps(4);
    ExpectResumesAsThePlainRun(job, dir_ / absl::StrCat("ckpt-", what), what);
  }
}

}  // namespace
}  // namespace zt
