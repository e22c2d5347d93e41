// Tests of worker/optim/host_optimizer.h: the host step of offloaded shards is bit for bit the
// device path's step (worker/optim/optimizer.h) for AdamW, 8-bit AdamW and Adafactor, with
// fp32 parameters and with bf16 parameters over fp32 master weights, over three steps, when
// the master weights and states live in the plan's pinned host buffers
// (offload.optimizer CPU) and the gradients and parameters on the device.
#include "worker/optim/host_optimizer.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/device_copy_engine.h"
#include "worker/job/job_defaults.h"
#include "worker/model/param_layout.h"
#include "worker/optim/delayed_host_step.h"
#include "worker/optim/gradient_downloads.h"
#include "worker/plan/arena.h"
#include "worker/plan/memory_plan.h"

namespace zt {
namespace {

using zerotrain::OffloadConfig;
using zerotrain::OptimizerConfig;
using zerotrain::PrecisionConfig;

struct Case {
  const char* name;
  OptimizerConfig::Type optimizer;
  PrecisionConfig::DType dtype;
  bool stochastic_rounding;
};

zerotrain::JobSpec Job(const Case& c, OffloadConfig::Device offload) {
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
  job.mutable_train()->set_max_steps(3);
  job.mutable_optimizer()->set_type(c.optimizer);
  job.mutable_optimizer()->set_lr(1e-2f);
  job.mutable_optimizer()->mutable_adafactor()->set_beta1(0.9f);  // Adafactor's m too
  job.mutable_precision()->set_param_dtype(c.dtype);
  job.mutable_precision()->set_grad_dtype(c.dtype);
  job.mutable_precision()->set_stochastic_rounding(c.stochastic_rounding);
  job.mutable_parallel()->set_zero_stage(1);
  job.mutable_offload()->set_optimizer(offload);
  // The block's 49984 fp32 elements (199936 bytes) are the largest transfer: 49 pages.
  job.mutable_offload()->set_buffer_size(49 * 4096);
  job.mutable_resources()->set_cpu_threads(1);
  ApplyJobDefaults(&job);
  return job;
}

// A model's rank: its plan's arenas, and the unit views the optimizer steps.
struct Rank {
  MemoryPlan plan;
  std::unique_ptr<Arenas> arenas;
  std::vector<Tensor> params, grads;
};

Rank MakeRank(const zerotrain::JobSpec& job) {
  Rank r;
  r.plan = PlanMemory(job);
  absl::StatusOr<std::unique_ptr<Arenas>> arenas = Arenas::Create(r.plan);
  EXPECT_TRUE(arenas.ok()) << arenas.status();
  r.arenas = std::move(*arenas);
  for (const UnitLayout& u : BuildModelLayout(job.model()).units) {
    r.params.push_back(*r.arenas->Get(u.name + ".params"));
    r.grads.push_back(*r.arenas->Get(u.name + ".grads"));
  }
  return r;
}

// Values a 16-bit float holds exactly (the high half of an fp32 in [-1, 1)), so the fp32 and
// bf16 cases start from the same numbers.
void Fill(const Tensor& t, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float f = dist(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if (t.dtype() == DType::kBF16) {
      const uint16_t high = static_cast<uint16_t>(bits >> 16);
      std::memcpy(static_cast<char*>(t.raw()) + 2 * i, &high, 2);
    } else {
      std::memcpy(static_cast<char*>(t.raw()) + 4 * i, &f, 4);
    }
  }
}

void CopyBuffer(const Rank& from, const Rank& to, const std::string& name) {
  const Tensor a = *from.arenas->Get(name), b = *to.arenas->Get(name);
  ASSERT_EQ(a.size_bytes(), b.size_bytes()) << name;
  std::memcpy(b.raw(), a.raw(), a.size_bytes());
}

// Parameters, master weights and every optimizer state of the two ranks, byte for byte.
void ExpectSameCheckpointedBuffers(const Rank& device, const Rank& host) {
  int compared = 0;
  for (const BufferSpec& b : device.plan.buffers) {
    if (!IsCheckpointed(b)) continue;
    const Tensor a = *device.arenas->Get(b.name), h = *host.arenas->Get(b.name);
    ASSERT_EQ(a.size_bytes(), h.size_bytes()) << b.name;
    EXPECT_EQ(std::memcmp(a.raw(), h.raw(), a.size_bytes()), 0) << b.name;
    ++compared;
  }
  EXPECT_GT(compared, 6);
}

Optimizer MakeOptimizer(const zerotrain::JobSpec& job, const Arenas& arenas) {
  const ModelLayout layout = BuildModelLayout(job.model());
  std::vector<FlatRange> ranges;
  for (const UnitLayout& u : layout.units)
    ranges.push_back(ShardOf(u.numel, ParallelLayout::ForJob(job, 0).shard()).owned);
  absl::StatusOr<Optimizer> opt =
      Optimizer::Create(job.optimizer(), job.precision(), layout, arenas, ranges);
  EXPECT_TRUE(opt.ok()) << opt.status();
  return std::move(*opt);
}

class HostOptimizerTest : public ::testing::TestWithParam<Case> {};

TEST_P(HostOptimizerTest, IsBitForBitTheDevicePathsStep) {
  const zerotrain::JobSpec device_job = Job(GetParam(), OffloadConfig::NONE);
  const zerotrain::JobSpec host_job = Job(GetParam(), OffloadConfig::CPU);
  Rank device = MakeRank(device_job), host = MakeRank(host_job);

  // The offloaded plan keeps master weights and states in the pinned host arena.
  int offloaded = 0;
  for (const BufferSpec& b : host.plan.buffers) {
    if (!b.offloaded_from) continue;
    ++offloaded;
    EXPECT_EQ(b.category, MemoryCategory::kPinnedHost) << b.name;
  }
  EXPECT_GT(offloaded, 0);

  // The same starting parameters and master weights in both.
  std::mt19937 rng(7);
  for (const BufferSpec& b : device.plan.buffers) {
    if (!IsCheckpointed(b)) continue;
    if (b.name.ends_with(".params") || b.name.ends_with(".master")) {
      Fill(*device.arenas->Get(b.name), rng);
      CopyBuffer(device, host, b.name);
    }
  }
  Optimizer reference = MakeOptimizer(device_job, *device.arenas);
  std::unique_ptr<DeviceCopyEngine> copies = MakeHostCopyEngine(Device{});
  // The plan's one ring buffer stages the parameters; the gradients, which the trainer copies
  // down during the backward into "<unit>.grads.host", this step copies itself, through a
  // buffer of the ring's size.
  const Tensor param_staging = *host.arenas->Get("offload.ring.0");
  EXPECT_FALSE(host.arenas->Spec("offload.ring.1").ok()) << "host-only offload stages one buffer";
  std::vector<std::byte> grad_bytes(param_staging.size_bytes());
  const Tensor grad_staging(grad_bytes.data(), DType::kU8, {param_staging.numel()});
  absl::StatusOr<HostOptimizer> offload =
      HostOptimizer::Create({.optimizer = MakeOptimizer(host_job, *host.arenas),
                             .copies = copies.get(),
                             .grad_staging = grad_staging,
                             .param_staging = param_staging});
  ASSERT_TRUE(offload.ok()) << offload.status();

  const DeviceContext ctx = JobDeviceContext(device_job);
  std::vector<char> before(device.params[1].size_bytes());
  std::memcpy(before.data(), device.params[1].raw(), before.size());
  for (int step = 0; step < 3; ++step) {
    for (size_t u = 0; u < device.grads.size(); ++u) {
      Fill(device.grads[u], rng);
      std::memcpy(host.grads[u].raw(), device.grads[u].raw(), device.grads[u].size_bytes());
    }
    const float lr = 1e-2f * static_cast<float>(step + 1), scale = 0.5f;
    ASSERT_TRUE(reference.Step(ctx, device.params, device.grads, lr, scale, 100 + step).ok());
    ASSERT_TRUE(offload->Step(ctx, host.params, host.grads, lr, scale, 100 + step).ok());
  }
  EXPECT_EQ(offload->optimizer().steps_taken(), 3);
  // The update moved the block's parameters, so equality below is not equality of zeros.
  EXPECT_NE(std::memcmp(before.data(), device.params[1].raw(), before.size()), 0);
  ExpectSameCheckpointedBuffers(device, host);
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, HostOptimizerTest,
    ::testing::Values(
        Case{"adamw_fp32", OptimizerConfig::ADAMW, PrecisionConfig::FP32, false},
        Case{"adamw_bf16_sr", OptimizerConfig::ADAMW, PrecisionConfig::BF16, true},
        Case{"adamw8bit_fp32", OptimizerConfig::ADAMW_8BIT, PrecisionConfig::FP32, false},
        Case{"adamw8bit_bf16", OptimizerConfig::ADAMW_8BIT, PrecisionConfig::BF16, false},
        Case{"adafactor_fp32", OptimizerConfig::ADAFACTOR, PrecisionConfig::FP32, false},
        Case{"adafactor_bf16", OptimizerConfig::ADAFACTOR, PrecisionConfig::BF16, false}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(HostOptimizerCreateTest, RefusesAMissingCopyEngineAndShortStaging) {
  const Case c{"adamw", OptimizerConfig::ADAMW, PrecisionConfig::FP32, false};
  const zerotrain::JobSpec job = Job(c, OffloadConfig::CPU);
  Rank rank = MakeRank(job);
  absl::StatusOr<HostOptimizer> none =
      HostOptimizer::Create({.optimizer = MakeOptimizer(job, *rank.arenas)});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  // A staging buffer the step needs (no gradient downloads, parameters on the device) missing.
  std::unique_ptr<DeviceCopyEngine> engine = MakeHostCopyEngine(Device{});
  absl::StatusOr<HostOptimizer> unstaged = HostOptimizer::Create(
      {.optimizer = MakeOptimizer(job, *rank.arenas),
       .copies = engine.get(),
       .param_staging = *rank.arenas->Get("offload.ring.0")});
  EXPECT_EQ(unstaged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unstaged.status().message().find("offload.ring"), std::string::npos)
      << unstaged.status().message();

  std::unique_ptr<DeviceCopyEngine> copies = MakeHostCopyEngine(Device{});
  std::vector<float> small(16);
  const Tensor tiny(small.data(), DType::kF32, {16});
  absl::StatusOr<HostOptimizer> opt =
      HostOptimizer::Create({.optimizer = MakeOptimizer(job, *rank.arenas),
                             .copies = copies.get(),
                             .grad_staging = tiny,
                             .param_staging = tiny});
  ASSERT_TRUE(opt.ok()) << opt.status();
  const absl::Status status =
      opt->Step(JobDeviceContext(job), rank.params, rank.grads, 1e-3f, 1.0f);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("unit 0's range of 20480 elements"), std::string::npos)
      << status.message();
}

// The delayed update's host step (delayed_host_step.h): launched on its own thread from the
// bank of gradients the downloads just drained, finished by uploading params.host, it is the
// device path's step bit for bit; a second launch before the first is finished is refused, and
// the banks alternate.
TEST(DelayedHostStepTest, IsTheDevicePathsStepOnItsOwnThread) {
  const Case c{"adamw_bf16_sr", OptimizerConfig::ADAMW, PrecisionConfig::BF16, true};
  const zerotrain::JobSpec device_job = Job(c, OffloadConfig::NONE);
  zerotrain::JobSpec host_job = Job(c, OffloadConfig::CPU);
  host_job.mutable_offload()->mutable_delayed_update()->set_enabled(true);
  Rank device = MakeRank(device_job), host = MakeRank(host_job);
  std::mt19937 rng(11);
  for (const BufferSpec& b : device.plan.buffers) {
    if (IsCheckpointed(b) && (b.name.ends_with(".params") || b.name.ends_with(".master"))) {
      Fill(*device.arenas->Get(b.name), rng);
      CopyBuffer(device, host, b.name);
    }
  }
  Optimizer reference = MakeOptimizer(device_job, *device.arenas);
  std::unique_ptr<DeviceCopyEngine> copies = MakeHostCopyEngine(Device{});
  const ModelLayout layout = BuildModelLayout(host_job.model());
  absl::StatusOr<std::unique_ptr<GradientDownloads>> downloads =
      GradientDownloadsFromPlan(*host.arenas, layout, host.grads, copies.get());
  ASSERT_TRUE(downloads.ok()) << downloads.status();
  ASSERT_NE(*downloads, nullptr);
  absl::StatusOr<HostOptimizer> offload =
      HostOptimizer::Create({.optimizer = MakeOptimizer(host_job, *host.arenas),
                             .copies = copies.get(),
                             .param_staging = *host.arenas->Get("offload.ring.0"),
                             .gradients = downloads->get()});
  ASSERT_TRUE(offload.ok()) << offload.status();
  std::vector<Tensor> params_host;
  for (const UnitLayout& u : layout.units) {
    params_host.push_back(*host.arenas->Get(u.name + ".params.host"));
  }
  const DeviceContext ctx = JobDeviceContext(device_job);
  absl::StatusOr<std::unique_ptr<DelayedHostStep>> delayed =
      DelayedHostStep::Create({.host = &*offload,
                               .gradients = downloads->get(),
                               .copies = copies.get(),
                               .params_host = params_host,
                               .host_ctx = ctx});
  ASSERT_TRUE(delayed.ok()) << delayed.status();
  DelayedHostStep& d = **delayed;
  absl::StatusOr<DelayedHostStep::Finished> idle = d.Finish(host.params);
  ASSERT_TRUE(idle.ok()) << idle.status();
  EXPECT_EQ(idle->step, 0) << "nothing was pending";
  for (int step = 0; step < 3; ++step) {
    for (size_t u = 0; u < device.grads.size(); ++u) {
      Fill(device.grads[u], rng);
      std::memcpy(host.grads[u].raw(), device.grads[u].raw(), device.grads[u].size_bytes());
      (*downloads)->Enqueue(static_cast<int>(u), {});
    }
    ASSERT_TRUE((*downloads)->Drain().ok());
    EXPECT_EQ((*downloads)->bank(), step % 2);
    const float lr = 1e-2f * static_cast<float>(step + 1), scale = 0.5f;
    ASSERT_TRUE(reference.Step(ctx, device.params, device.grads, lr, scale, 100 + step).ok());
    ASSERT_TRUE(d.Launch(host.params, step + 1, lr, scale, 100 + step).ok());
    EXPECT_TRUE(d.pending());
    EXPECT_EQ((*downloads)->bank(), (step + 1) % 2) << "the next backward fills the other bank";
    EXPECT_EQ(d.Launch(host.params, step + 2, lr, scale, 0).code(),
              absl::StatusCode::kFailedPrecondition);
    absl::StatusOr<DelayedHostStep::Finished> f = d.Finish(host.params);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->step, step + 1);
    EXPECT_GT(f->bytes_to_device, 0);
    // Only a chain's first launch reads the device's shard: later ones follow an upload.
    EXPECT_EQ(f->bytes_to_host > 0, step == 0);
  }
  EXPECT_EQ(d.launched(), 3);
  EXPECT_EQ(offload->optimizer().steps_taken(), 3);
  ExpectSameCheckpointedBuffers(device, host);
}

}  // namespace
}  // namespace zt
