// LoRA on ranks whose memory the host cannot address (separate_memory_device.h: arenas on a
// device of their own, staged communicators, every kernel and staged collective refusing
// memory from the other side), what a CUDA rank is, less the streams: the adapters are
// initialised on the host (PEFT's init, or a PEFT directory) and uploaded through the rank's
// copy engine, trained, checkpointed through the host (BufferBytes) and resumed. Each run is
// the same job on plain CPU ranks bit for bit (the same ops on the same values in the same
// order; only where the bytes live differs): losses, every rank's adapters and their
// optimizer states. A quantized base is still quantized into memory the host shares, and is
// refused by name on such a rank (docs/lora.md).
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/trainer/lora_training_fixture.h"
#include "tests/unit/worker/trainer/separate_memory_device.h"
#include "worker/checkpoint/peft_adapter.h"

namespace zt {
namespace {

using testing::LoraRun;
using testing::LoraTrainingTest;
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
    const JobSpec job = BaseJob(c.world, c.stage, c.base);
    const LoraRun plain = Train(job, 4);
    const LoraRun separate = Train(job, 4, Separate());
    ASSERT_EQ(plain.losses.size(), 4u) << what;
    ExpectSameRun(separate, plain, what);
    EXPECT_TRUE(separate.unclaimed.empty()) << what;
    // The adapters trained (B starts at zero): a run that never uploaded them, or never
    // downloaded them, would not match the plain one above, nor move.
    EXPECT_NE(plain.losses.front(), plain.losses.back()) << what;
  }
}

// A checkpoint written through the host from a rank of its own memory resumes on one, and the
// resumed run continues as the plain run that never stopped.
TEST_F(LoraSeparateMemoryTest, AdapterCheckpointsResumeThroughTheCopyEngine) {
  for (const Config& c : {kConfigs[0], kConfigs[2], kConfigs[4]}) {
    const std::string what = Name(c);
    const LoraRun straight = Train(BaseJob(c.world, c.stage, c.base), 4);
    JobSpec job = BaseJob(c.world, c.stage, c.base);
    const std::filesystem::path ckpt =
        dir_ / absl::StrCat("ckpt-", c.world, "-", c.stage, "-", c.base);
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
    EXPECT_EQ(first.losses[0], straight.losses[0]) << what;
    EXPECT_EQ(first.losses[1], straight.losses[1]) << what;
    EXPECT_EQ(second.losses[0], straight.losses[2]) << what;
    EXPECT_EQ(second.losses[1], straight.losses[3]) << what;
    second.losses = straight.losses;  // compared step by step above
    ExpectSameRun(second, straight, what);
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

// NF4 and INT8 bases are quantized on the host into memory the device shares: a rank of its
// own memory refuses them by name until they are staged and uploaded too.
TEST_F(LoraSeparateMemoryTest, AQuantizedBaseIsRefusedByName) {
  for (const auto base : {ModelConfig::NF4, ModelConfig::INT8}) {
    JobSpec job = Job(1, 0, 4, 1, ModelConfig::LLAMA, base);
    absl::StatusOr<JobSpec> validated = ValidatedJob(job);
    ASSERT_TRUE(validated.ok()) << validated.status();
    TrainOptions options = Separate();
    InProcessStore store;
    options.store = &store;
    const absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(*validated, options);
    ASSERT_FALSE(t.ok()) << ModelConfig::BaseDType_Name(base);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kUnimplemented) << t.status();
    EXPECT_NE(t.status().message().find("model.base_dtype"), std::string::npos) << t.status();
  }
}

}  // namespace
}  // namespace zt
