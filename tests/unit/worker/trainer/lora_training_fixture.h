// The LoRA step-loop tests' fixture (lora_training_test.cc, lora_int8_training_test.cc): a
// small LoRA job over a pattern corpus, every rank of it run as a thread of this process, what
// each run leaves (losses, adapters, the frozen base's bytes), and a Hugging Face base file of
// values of its own.
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "tests/unit/worker/trainer/small_sharded_job.h"
#include "tests/unit/worker/trainer/test_swap_store.h"
#include "worker/checkpoint/hf_interop.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/comm/store.h"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"
#include "worker/job/job_validation.h"
#include "worker/model/param_layout.h"
#include "worker/offload/node_swap_store.h"
#include "worker/plan/lora_plan.h"
#include "worker/plan/memory_plan.h"
#include "worker/train/trainer.h"

namespace zt::testing {

using zerotrain::JobSpec;
using zerotrain::ModelConfig;

using Weights = std::vector<std::vector<float>>;

struct LoraRun {
  std::vector<double> losses;  // the job's mean, per step
  std::vector<double> loss_scales;
  std::vector<double> grad_norms;
  int64_t skipped = 0;
  // The norm of rank 0's "<unit>.lora_grads" after the last step (f32, stage 0: the reduced
  // gradients of the last step stay there until the next step zeroes them).
  double last_adapter_grad_norm = 0;
  std::vector<Weights> adapters;  // every rank's FullAdapters at the end
  // Rank 0's frozen base (every "<unit>.params" and NF4/INT8 buffer) before and after training.
  std::map<std::string, std::vector<char>> base_before, base_after;
  // Every rank's frozen base after training (at ZeRO stage 3 each holds its "<unit>.qbase"
  // shard), and per rank and memory category the bytes its arenas carved and its plan holds.
  std::vector<std::map<std::string, std::vector<char>>> rank_base_after;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> arena_and_plan_bytes;
  std::vector<std::string> unclaimed;
  // Per rank, its checkpointed adapter buffers and their optimizer states (read through the
  // store when swapped), by name.
  std::vector<std::map<std::string, std::vector<char>>> adapter_states;
  // offload.params NVME: per rank, its swapped base's gather reads and committed generation.
  std::vector<SwappedBase::Stats> base_swap;
  std::vector<uint64_t> base_generation;
  // Rank 0's parameter-shard uploads over the steps (StepRecord::param_upload_bytes, ...).
  int64_t param_upload_bytes = 0, param_uploads_ahead = 0, param_uploads_at_gather = 0;
};

// Swapped shards (offload.params NVME) are read back from the store.
inline std::map<std::string, std::vector<char>> BaseBytes(Trainer& t) {
  std::map<std::string, std::vector<char>> out;
  for (const BufferSpec& b : t.plan().buffers) {
    if (!b.name.ends_with(".params") && !b.name.ends_with(".qbase") &&
        !IsQuantizedBaseBuffer(b.name)) {
      continue;
    }
    const char* p = static_cast<const char*>(t.BufferBytes(b).value());
    out[b.name].assign(p, p + b.bytes());
  }
  return out;
}

class LoraTrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TestScratchDir("zt-lora-training-test");
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), testing::PatternTokens(), 32).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // SmallShardedJob's model with adapters on every adaptable module (rank 4, alpha 8) over a
  // `base` of the family's.
  JobSpec Job(int world, int stage, int micro_batch, int accum = 1,
              ModelConfig::Family family = ModelConfig::GPT2,
              ModelConfig::BaseDType base = ModelConfig::FP32) {
    JobSpec job =
        testing::SmallShardedJob((dir_ / "train.bin").string(), world, stage, micro_batch, accum);
    auto* m = job.mutable_model();
    m->set_family(family);
    if (family == ModelConfig::LLAMA) {
      m->set_n_kv_head(2);
      m->set_tie_embeddings(false);
    }
    m->set_base_dtype(base);
    auto* lora = m->mutable_lora();
    lora->set_rank(4);
    lora->set_alpha(8.0f);
    const std::vector<const char*> modules =
        family == ModelConfig::GPT2
            ? std::vector<const char*>{"c_attn", "c_proj", "c_fc"}
            : std::vector<const char*>{"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                       "gate_proj", "up_proj", "down_proj"};
    for (const char* module : modules) lora->add_target_modules(module);
    return job;
  }

  // Runs every rank to global step `stop_after` (from 0, or from the resumed checkpoint's).
  static LoraRun Train(const JobSpec& spec, int stop_after, TrainOptions base_options = {}) {
    absl::StatusOr<JobSpec> validated = ValidatedJob(spec);
    EXPECT_TRUE(validated.ok()) << validated.status();
    if (!validated.ok()) return {};
    const JobSpec& job = *validated;
    EXPECT_TRUE(CheckEngineSupport(job).ok()) << CheckEngineSupport(job);
    const int n = job.parallel().world_size();
    InProcessStore store;
    // offload.optimizer NVME: one swap store for the process's ranks, as `zt train` opens it.
    std::shared_ptr<offload::SwapStore> swap;
    if (base_options.swap_store == nullptr) {
      absl::StatusOr<std::shared_ptr<offload::SwapStore>> opened = testing::OpenTestSwapStore(job);
      EXPECT_TRUE(opened.ok()) << opened.status();
      if (!opened.ok()) return {};
      swap = *std::move(opened);
      base_options.swap_store = swap.get();
    }
    LoraRun run;
    run.adapter_states.resize(n);
    run.adapters.resize(n);
    run.rank_base_after.resize(n);
    run.arena_and_plan_bytes.resize(n);
    run.base_swap.resize(n);
    run.base_generation.resize(n);
    std::vector<absl::Status> status(n);
    std::vector<std::vector<std::string>> unclaimed(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        status[r] = [&]() -> absl::Status {
          TrainOptions options = base_options;
          options.stop_after_step = stop_after;
          options.rank = r;
          options.store = &store;
          absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(job, options);
          if (!t.ok()) return t.status();
          if (r == 0) run.base_before = BaseBytes(**t);
          // Run(), not Step(): it is what saves the checkpoints.
          absl::Status ran = (*t)->Run([&](const StepRecord& rec) {
            if (r != 0) return;
            run.losses.push_back(rec.loss);
            run.loss_scales.push_back(rec.loss_scale);
            run.grad_norms.push_back(rec.grad_norm);
            run.skipped = rec.skipped;
            run.param_upload_bytes += rec.param_upload_bytes;
            run.param_uploads_ahead += rec.param_uploads_ahead;
            run.param_uploads_at_gather += rec.param_uploads_at_gather;
          });
          if (!ran.ok()) return ran;
          if (r == 0 && job.parallel().zero_stage() == 0) {
            double sum_sq = 0;
            for (const BufferSpec& b : (*t)->plan().buffers) {
              if (!b.name.ends_with(".lora_grads") || b.dtype != DType::kF32) continue;
              const Tensor g = (*t)->arenas().Get(b.name).value();
              for (int64_t i = 0; i < g.numel(); ++i) {
                sum_sq += static_cast<double>(g.data<float>()[i]) * g.data<float>()[i];
              }
            }
            run.last_adapter_grad_norm = std::sqrt(sum_sq);
          }
          absl::StatusOr<Weights> adapters = (*t)->FullAdapters();
          if (!adapters.ok()) return adapters.status();
          run.adapters[r] = std::move(*adapters);
          if (r == 0) run.base_after = BaseBytes(**t);
          run.rank_base_after[r] = BaseBytes(**t);
          for (int c = 0; c < kMemoryCategoryCount; ++c) {
            const auto category = static_cast<MemoryCategory>(c);
            run.arena_and_plan_bytes[r].emplace_back((*t)->arenas().BytesInUse(category),
                                                     (*t)->plan().CategoryBytes(category));
          }
          unclaimed[r] = (*t)->arenas().UnclaimedBuffers();
          if (const SwappedBase* base = (*t)->swapped_base()) {
            run.base_swap[r] = base->stats();
            run.base_generation[r] = base->generation();
          }
          for (const BufferSpec* b : CheckpointedBuffers((*t)->plan())) {
            if (!b->name.ends_with(".lora") && b->name.find(".lora.") == std::string::npos) {
              continue;
            }
            absl::StatusOr<const void*> bytes = (*t)->BufferBytes(*b);
            if (!bytes.ok()) return bytes.status();
            const char* p = static_cast<const char*>(*bytes);
            run.adapter_states[r][b->name].assign(p, p + b->bytes());
          }
          return absl::OkStatus();
        }();
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < n; ++r) EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
    for (const auto& u : unclaimed) run.unclaimed.insert(run.unclaimed.end(), u.begin(), u.end());
    return run;
  }

  std::filesystem::path dir_;
};

inline double MaxAbsDiff(const Weights& a, const Weights& b) {
  double worst = 0;
  EXPECT_EQ(a.size(), b.size());
  for (size_t u = 0; u < std::min(a.size(), b.size()); ++u) {
    EXPECT_EQ(a[u].size(), b[u].size());
    for (size_t i = 0; i < std::min(a[u].size(), b[u].size()); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(a[u][i]) - b[u][i]));
    }
  }
  return worst;
}

// 2 ranks against one rank reading the same global batch. The ranks' gradients are summed in
// another order than one rank's batch, so they differ in the last bits of fp32; over 5 Adam
// steps that reaches the adapters at ~1e-7 and the losses at ~1e-7 relative. 1e-5 relative on
// losses and 1e-5 absolute on adapters (lr 3e-3) stay well above that noise and well below
// what a missing reduction or a wrong shard gives (an adapter off by the lr in one step).
inline void ExpectMatches(const LoraRun& got, const LoraRun& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t s = 0; s < want.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], want.losses[s], 1e-5 * std::abs(want.losses[s]))
        << what << " step " << s + 1;
  }
  EXPECT_LT(MaxAbsDiff(got.adapters[0], want.adapters[0]), 1e-5) << what;
  for (size_t r = 1; r < got.adapters.size(); ++r) {
    EXPECT_EQ(MaxAbsDiff(got.adapters[r], got.adapters[0]), 0.0) << what << " rank " << r;
  }
  EXPECT_TRUE(got.base_before == got.base_after) << what << ": the frozen base changed";
  EXPECT_TRUE(got.unclaimed.empty()) << what << ": unused plan buffer " << got.unclaimed.front();
}

// Reads a safetensors file's tensor as f32.
inline std::vector<float> ReadTensor(const std::string& path, const std::string& name) {
  std::unique_ptr<SafetensorsFile> file = SafetensorsFile::Open(path).value();
  const SafetensorsTensorInfo* info = file->Find(name);
  EXPECT_NE(info, nullptr) << name << " in " << path;
  if (info == nullptr) return {};
  std::vector<float> out(static_cast<size_t>(info->numel()));
  EXPECT_TRUE(file->ReadAsF32(*info, absl::MakeSpan(out)).ok());
  return out;
}

// A Llama base in Hugging Face layout with values of its own: normal(0, 0.05) weights and
// norms around 1, so NF4's blocks see a spread of magnitudes.
// How far a merged export's rows of one adapted site (`got`: the file's (site.rows, in)
// tensor, Llama's (out, in) layout) are from the base's rows plus scale·B·A, computed in
// float64 from the trained adapters (`adapters`: the block's flat A and B buffers; `base`:
// the whole weight's (out, in) values, row 0 first). `moved`: the largest |scale·B·A|, so a
// test can tell that the adapters changed the weight at all.
struct MergeError {
  double worst = 0;
  double moved = 0;
};
inline MergeError MergedSiteError(const LoraSite& site, const float* base, const float* adapters,
                                  int64_t in, int64_t r, double scale,
                                  const std::vector<float>& got) {
  MergeError e;
  for (int64_t row = 0; row < site.rows; ++row) {
    for (int64_t col = 0; col < in; ++col) {
      double delta = 0;
      for (int64_t k = 0; k < r; ++k) {
        delta += static_cast<double>(adapters[site.b.offset + row * r + k]) *
                 adapters[site.a.offset + k * in + col];
      }
      const double want = base[(site.row_begin + row) * in + col] + scale * delta;
      e.worst = std::max(e.worst, std::abs(want - got[row * in + col]));
      e.moved = std::max(e.moved, std::abs(scale * delta));
    }
  }
  return e;
}

struct HfBase {
  zerotrain::ModelConfig plain;  // the job's model without adapters or base_dtype
  ModelLayout layout;
  Weights units;
};

inline HfBase MakeHfBase(const JobSpec& job) {
  HfBase b;
  b.plain = ValidatedJob(job).value().model();
  b.plain.clear_lora();
  b.plain.clear_base_dtype();
  b.layout = BuildModelLayout(b.plain);
  std::mt19937 rng(123);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (const UnitLayout& u : b.layout.units) {
    std::vector<float>& v = b.units.emplace_back(static_cast<size_t>(u.numel));
    for (const ParamSpec& p : u.params) {
      for (int64_t i = 0; i < p.numel; ++i) {
        v[p.offset + i] = p.shape.size() == 1 ? 1.0f + normal(rng) : normal(rng);
      }
    }
  }
  return b;
}

inline std::string ExportBase(const HfBase& b, const std::string& path, DType dtype) {
  std::vector<const float*> units;
  for (const std::vector<float>& u : b.units) units.push_back(u.data());
  const absl::Status s = ExportHuggingFace(path, b.plain, b.layout, units, dtype);
  EXPECT_TRUE(s.ok()) << s;
  return path;
}

inline std::vector<char> Bytes(const Tensor& t) {
  const char* p = static_cast<const char*>(t.raw());
  return std::vector<char>(p, p + t.size_bytes());
}

}  // namespace zt::testing
