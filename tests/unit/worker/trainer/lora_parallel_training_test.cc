// LoRA and QLoRA on pipeline stages and tensor-parallel ranks (threads of this process, Gloo
// over loopback). Pipeline: each stage trains its own blocks' adapters over its frozen base —
// PP2 under 1F1B and interleaved 1F1B, PP2 × DP2 at ZeRO 1–3 (at 3 gathering the base per use
// or for the step, an NF4 base's byte shards too), GPT-2 (tied: the head stage's
// frozen copy of wte) and Llama (GQA, untied), in f32 and bf16, with adapter dropout, and over an
// NF4 base. Tensor parallelism: the adapters split as their base weights (TP2, TP2 × DP2). Each
// against one rank's LoRA run from the same seed over 10 steps: the losses and gradient norms,
// the adapters every rank exports (FullAdapters, what `zt train --export` writes) and the
// frozen base bit for bit; each rank's arenas equal its plan (the adapters and base of its own
// blocks or shares only). Checkpoints resume between PP2 / TP2 and one rank; `zt export` of a
// staged checkpoint is the whole model's adapters.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/status_macros.h"
#include "tests/unit/worker/trainer/pattern_adapters.h"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "tests/unit/worker/trainer/rank_threads.h"
#include "tests/unit/worker/trainer/small_sharded_job.h"
#include "worker/checkpoint/hf_interop.h"
#include "worker/checkpoint/peft_adapter.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/comm/store.h"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"
#include "worker/job/job_validation.h"
#include "worker/lora_export.h"
#include "worker/model/param_layout.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/lora_plan.h"
#include "worker/plan/memory_plan.h"
#include "worker/trainer.h"

namespace zt {
namespace {

using zerotrain::JobSpec;
using zerotrain::ModelConfig;
using zerotrain::ParallelConfig;
using Bytes = std::map<std::string, std::vector<char>>;

struct RankRun {
  std::vector<double> losses, grad_norms;
  std::vector<std::vector<float>> adapters;  // FullAdapters at the end (the whole model's)
  Bytes base_before, base_after;             // the rank's frozen base buffers
  std::vector<std::string> off_plan, unclaimed, lora_buffers;
  std::vector<int> held_units;
};

struct Outcome {
  absl::Status status;
  JobSpec job;
  std::vector<RankRun> ranks;
};

// Every "<unit>.params" and quantized base buffer of the rank (its stage's units), at ZeRO 3 a
// block's quantized byte shard "<unit>.qbase".
Bytes BaseBytes(const Trainer& t) {
  Bytes out;
  for (const BufferSpec& b : t.plan().buffers) {
    if (!b.name.ends_with(".params") && !b.name.ends_with(".qbase") &&
        !IsQuantizedBaseBuffer(b.name)) {
      continue;
    }
    const Tensor buffer = t.arenas().Get(b.name).value();
    const char* p = static_cast<const char*>(buffer.raw());
    out[b.name].assign(p, p + buffer.size_bytes());
  }
  return out;
}

// Every rank to `steps` (from the checkpoint in `resume` when set).
Outcome RunAll(const JobSpec& spec, int steps, const std::string& resume = "") {
  Outcome out;
  absl::StatusOr<JobSpec> validated = ValidatedJob(spec);
  if (!validated.ok()) {
    out.status = validated.status();
    return out;
  }
  out.job = *validated;
  if (absl::Status s = CheckEngineSupport(out.job); !s.ok()) {
    out.status = s;
    return out;
  }
  const JobSpec& job = out.job;
  const int n = job.parallel().world_size();
  InProcessStore store;
  out.ranks.resize(n);
  out.status = testing::RunRankThreads(n, [&](int r) -> absl::Status {
    TrainOptions options;
    options.rank = r;
    options.store = &store;
    options.stop_after_step = steps;
    options.resume_dir = resume;
    ZT_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(job, options));
    RankRun& mine = out.ranks[r];
    mine.base_before = BaseBytes(*t);
    ZT_RETURN_IF_ERROR(t->Run([&](const StepRecord& rec) {
      mine.losses.push_back(rec.loss);
      mine.grad_norms.push_back(rec.grad_norm);
    }));
    mine.base_after = BaseBytes(*t);
    ZT_ASSIGN_OR_RETURN(mine.adapters, t->FullAdapters());
    mine.held_units = t->model().held_units();
    mine.unclaimed = t->arenas().UnclaimedBuffers();
    const MemoryPlan plan = PlanMemory(job, ParallelLayout::ForJob(job, r));
    for (const BufferSpec& b : plan.buffers) {
      if (b.name.ends_with(".lora")) mine.lora_buffers.push_back(b.name);
    }
    for (int c = 0; c < kMemoryCategoryCount; ++c) {
      const auto category = static_cast<MemoryCategory>(c);
      if (t->arenas().BytesInUse(category) != plan.CategoryBytes(category)) {
        mine.off_plan.push_back(absl::StrCat(MemoryCategoryName(category), " arena ",
                                             t->arenas().BytesInUse(category), " plan ",
                                             plan.CategoryBytes(category)));
      }
    }
    return absl::OkStatus();
  });
  return out;
}

// A run of `to` straight through 10 steps, and the same 10 steps resumed at step 5 from the
// checkpoint `from` writes into `dir`: what every reshard-on-read check compares.
struct StraightAndResumed {
  Outcome whole;
  Outcome resumed;
};

StraightAndResumed RunStraightAndResumed(JobSpec from, JobSpec to, const std::string& dir,
                                         const std::string& what) {
  StraightAndResumed out;
  from.mutable_checkpoint()->set_interval_steps(5);
  from.mutable_checkpoint()->set_dir(dir);
  out.whole = RunAll(to, 10);
  EXPECT_TRUE(out.whole.status.ok()) << what << ": " << out.whole.status;
  const Outcome first = RunAll(from, 5);
  EXPECT_TRUE(first.status.ok()) << what << ": " << first.status;
  to.mutable_checkpoint()->set_dir(dir);
  to.mutable_checkpoint()->set_interval_steps(5);
  out.resumed = RunAll(to, 10, dir);
  EXPECT_TRUE(out.resumed.status.ok()) << what << ": " << out.resumed.status;
  return out;
}

struct Bounds {
  double loss = 1e-6, norm = 2e-5, adapter = 1e-4;
};

// `got` (pipeline stages) against `want` (one rank). Bounds: a stage runs the one-rank model's
// ops on the same values; what differs is the order of sums — the gradient norm summed per
// stage then over the stages, ZeRO's reductions over DP. In f32 those are reduction noise
// carried through 10 Adam steps: 1e-6 relative in the loss, 2e-5 in the norm, 1e-4 per adapter
// element are the pipeline tests' bounds for the same noise (testing::ExpectSamePipelineTraining
// says why), far below a lost micro-batch, a stage's adapters stepped twice or not at all, or
// a wrong dropout seed (≥ 1e-3). The frozen base is never written: bit for bit, and each
// stage's buffers are the one-rank model's of the same name.
void ExpectSame(const Outcome& got, const Outcome& want, const std::string& what,
                Bounds bounds = {}) {
  ASSERT_TRUE(want.status.ok()) << what << ": " << want.status;
  ASSERT_TRUE(got.status.ok()) << what << ": " << got.status;
  const RankRun& ref = want.ranks[0];
  ASSERT_EQ(ref.losses.size(), 10u) << what;
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.05) << what << ": the adapters learn";
  const ModelLayout whole = BuildModelLayout(got.job.model());
  std::vector<int> blocks_seen(whole.units.size(), 0);
  for (size_t r = 0; r < got.ranks.size(); ++r) {
    const RankRun& run = got.ranks[r];
    const std::string rank = absl::StrCat(what, " rank ", r);
    EXPECT_TRUE(run.off_plan.empty()) << rank << ": " << run.off_plan.front();
    EXPECT_TRUE(run.unclaimed.empty()) << rank << ": unused plan buffer " << run.unclaimed.front();
    ASSERT_EQ(run.losses.size(), ref.losses.size()) << rank;
    for (size_t s = 0; s < ref.losses.size(); ++s) {
      EXPECT_NEAR(run.losses[s], ref.losses[s], bounds.loss * ref.losses[s])
          << rank << " step " << s + 1;
      EXPECT_NEAR(run.grad_norms[s], ref.grad_norms[s], bounds.norm * ref.grad_norms[s])
          << rank << " gradient norm, step " << s + 1;
    }
    // The exported adapters: every rank the same bits (broadcast from their stages), and the
    // one-rank run's within the bound.
    EXPECT_TRUE(run.adapters == got.ranks[0].adapters) << rank << ": every rank exports alike";
    ASSERT_EQ(run.adapters.size(), ref.adapters.size()) << rank;
    double worst = 0;
    for (size_t u = 0; u < ref.adapters.size(); ++u) {
      ASSERT_EQ(run.adapters[u].size(), ref.adapters[u].size()) << rank << " unit " << u;
      for (size_t i = 0; i < ref.adapters[u].size(); ++i) {
        worst = std::max(worst, std::abs(double{run.adapters[u][i]} - ref.adapters[u][i]));
      }
    }
    EXPECT_LT(worst, bounds.adapter) << rank << ": adapters";
    // The frozen base: untouched by training, and each buffer the one-rank base's.
    EXPECT_TRUE(run.base_after == run.base_before) << rank << ": the base changed";
    // (A tensor-parallel rank's base is its shares: checked unchanged above.)
    const bool shares = got.job.parallel().tensor_parallel() > 1;
    for (const auto& [name, bytes] : shares ? Bytes{} : run.base_after) {
      // A ZeRO-3 quantized base's byte shards have no one-rank buffer of their name: checked
      // unchanged above, and against the stage that gathers for the step bit for bit
      // (ZeroThreeStagesGatheringPerUseMatchTheKeptStageAndOneRank).
      if (name.ends_with(".qbase")) continue;
      const auto it = ref.base_after.find(name);
      if (name == "head.params" && it != ref.base_after.end() &&
          it->second.size() != bytes.size()) {
        continue;  // the head stage's copy of the tied wte rides in its head (checked below)
      }
      ASSERT_NE(it, ref.base_after.end()) << rank << " " << name;
      if (got.job.parallel().zero_stage() == 3) {
        // The rank's shard of the unit: the one-rank unit's elements [offset, offset + n).
        const UnitLayout* unit = nullptr;
        for (const UnitLayout& u : whole.units) {
          if (name == u.name + ".params") unit = &u;
        }
        ASSERT_NE(unit, nullptr) << rank << " " << name;
        const UnitShard shard =
            ShardOf(unit->numel, ParallelLayout::ForJob(got.job, static_cast<int>(r)).shard());
        const size_t element = it->second.size() / static_cast<size_t>(unit->numel);
        const size_t begin = static_cast<size_t>(shard.offset) * element;
        const size_t n = std::min(bytes.size(), it->second.size() - std::min(begin, it->second.size()));
        EXPECT_TRUE(std::equal(bytes.begin(), bytes.begin() + n, it->second.begin() + begin))
            << rank << " " << name << ": not the one-rank base's shard";
        continue;
      }
      // At ZeRO stage ≥ 1 a unit's buffer is padded to the shard quantum: its first bytes are
      // the unit's, the padding zero.
      ASSERT_GE(bytes.size(), it->second.size()) << rank << " " << name;
      EXPECT_TRUE(std::equal(it->second.begin(), it->second.end(), bytes.begin()))
          << rank << " " << name << ": not the one-rank base";
      EXPECT_TRUE(std::all_of(bytes.begin() + it->second.size(), bytes.end(),
                              [](char c) { return c == 0; }))
          << rank << " " << name << ": padding";
    }
    // The plan holds the adapters of the stage's own blocks, no other's.
    std::vector<std::string> expected;
    for (int u : run.held_units) {
      if (!whole.units[u].lora.empty()) {
        expected.push_back(whole.units[u].name + ".lora");
        ++blocks_seen[u];
      }
    }
    std::vector<std::string> planned = run.lora_buffers;
    std::sort(planned.begin(), planned.end());
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(planned, expected) << rank;
  }
  for (size_t u = 0; u < whole.units.size(); ++u) {
    if (!whole.units[u].lora.empty()) EXPECT_GE(blocks_seen[u], 1) << what << " unit " << u;
  }
}

// `job` in bf16 (parameters, activations, gradients, and so its base; the adapters stay f32).
JobSpec Bf16(JobSpec job) {
  auto* p = job.mutable_precision();
  p->set_param_dtype(zerotrain::PrecisionConfig::BF16);
  p->set_compute_dtype(zerotrain::PrecisionConfig::BF16);
  p->set_grad_dtype(zerotrain::PrecisionConfig::BF16);
  job.mutable_model()->set_base_dtype(ModelConfig::BF16);
  return job;
}

class LoraParallelTrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TestScratchDir("zt-lora-pp-test");
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), testing::PatternTokens(), 32).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // pp stages × dp replicas, m = 4 micro-batches of `micro_batch` sequences, adapters (rank 4,
  // alpha 8) on every adaptable module of the family. A bf16 job stores its base in bf16.
  JobSpec Job(bool llama, int pp, int dp, int zero, int micro_batch,
              ParallelConfig::PipelineSchedule schedule,
              ModelConfig::BaseDType base = ModelConfig::FP32) {
    JobSpec job = testing::SmallShardedJob((dir_ / "train.bin").string(), pp * dp, zero,
                                           micro_batch, /*accum=*/4);
    if (llama) testing::MakeSmallGqaLlama(job);
    job.mutable_parallel()->set_pipeline_parallel(pp);
    job.mutable_parallel()->set_pipeline_schedule(schedule);
    job.mutable_train()->set_max_steps(10);
    auto* m = job.mutable_model();
    m->set_base_dtype(base);
    auto* lora = m->mutable_lora();
    lora->set_rank(4);
    lora->set_alpha(8.0f);
    const std::vector<const char*> modules =
        llama ? std::vector<const char*>{"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                         "gate_proj", "up_proj", "down_proj"}
              : std::vector<const char*>{"c_attn", "c_proj", "c_fc"};
    for (const char* module : modules) lora->add_target_modules(module);
    return job;
  }

  std::filesystem::path dir_;
};

TEST_F(LoraParallelTrainingTest, TwoStagesOneFOneBAndInterleavedMatchOneRank) {
  for (const bool llama : {false, true}) {
    const std::string family = llama ? "llama" : "gpt2";
    const Outcome reference = RunAll(Job(llama, 1, 1, 0, 1, ParallelConfig::ONE_F_ONE_B), 10);
    ExpectSame(RunAll(Job(llama, 2, 1, 0, 1, ParallelConfig::ONE_F_ONE_B), 10), reference,
               family + " pp2 1f1b");
    // Interleaved: two chunks a stage, so four chunks of blocks (n_layer 4 on both sides).
    JobSpec interleaved = Job(llama, 2, 1, 0, 1, ParallelConfig::INTERLEAVED);
    interleaved.mutable_model()->set_n_layer(4);
    interleaved.mutable_parallel()->set_virtual_stages(2);
    JobSpec one = Job(llama, 1, 1, 0, 1, ParallelConfig::ONE_F_ONE_B);
    one.mutable_model()->set_n_layer(4);
    ExpectSame(RunAll(interleaved, 10), RunAll(one, 10), family + " pp2 interleaved");
  }
}

// With lora.dropout each stage draws, for micro-batch k, the masks one rank draws for the same
// global micro-batch (the seed is set per scheduled micro-batch, again before its backward), so
// the f32 bounds hold; a stage drawing another micro-batch's masks parts by far more.
TEST_F(LoraParallelTrainingTest, DropoutMasksAreOneRanksOnEveryStage) {
  for (const bool llama : {false, true}) {
    auto dropout = [](JobSpec job) {
      job.mutable_model()->mutable_lora()->set_dropout(0.1f);
      return job;
    };
    ExpectSame(RunAll(dropout(Job(llama, 2, 1, 0, 1, ParallelConfig::ONE_F_ONE_B)), 10),
               RunAll(dropout(Job(llama, 1, 1, 0, 1, ParallelConfig::ONE_F_ONE_B)), 10),
               absl::StrCat(llama ? "llama" : "gpt2", " pp2 dropout"));
  }
}

TEST_F(LoraParallelTrainingTest, TwoStagesByTwoReplicasAtZeroOneTwoAndThreeMatchOneRank) {
  // The replicas' micro-batches k are the global batch's sequences 2k and 2k + 1, which one
  // rank reads as micro-batch k of 2. ZeRO-2: each stage accumulates its adapters' gradients
  // into ".lora_grad_accum", reduce-scattered after the schedule; ZeRO-3 (reshard_after_forward
  // false): the frozen base's shards are gathered for the step, the adapters as at ZeRO-2.
  for (const bool llama : {false, true}) {
    for (const int zero : {1, 2, 3}) {
      JobSpec job = Job(llama, 2, 2, zero, 1, ParallelConfig::ONE_F_ONE_B);
      if (zero == 3) job.mutable_parallel()->set_reshard_after_forward(false);
      ExpectSame(RunAll(job, 10), RunAll(Job(llama, 1, 1, 0, 2, ParallelConfig::ONE_F_ONE_B), 10),
                 absl::StrCat(llama ? "llama" : "gpt2", " pp2 x dp2 zero-", zero));
    }
  }
}

// ZeRO-3 stages with reshard_after_forward (the default): each use of a block gathers its frozen
// base's shard — an NF4 or INT8 base's quantized byte shard "<unit>.qbase" beside its norms — into the
// pool and binds it for that use, and the adapters' gradients are reduce-scattered after each
// micro-batch (StageGradientsPerMicroBatch). Against the stage that gathers its units for the
// step (reshard_after_forward false): the same frozen base bit for bit on every rank (gathers
// copy), the losses, norms and adapters within the f32 bounds (the adapters' gradient sums run
// in another order); against one rank as every stage layout here (ExpectSame); and resumed
// from a checkpoint after 5 steps, steps 6–10 and the adapters are the uninterrupted run's bit
// for bit.
TEST_F(LoraParallelTrainingTest, ZeroThreeStagesGatheringPerUseMatchTheKeptStageAndOneRank) {
  for (const bool llama : {false, true}) {
    for (const ModelConfig::BaseDType base :
         {ModelConfig::FP32, ModelConfig::NF4, ModelConfig::INT8}) {
      const std::string what = absl::StrCat(llama ? "llama" : "gpt2", " pp2 x dp2 zero-3 ",
                                            ModelConfig::BaseDType_Name(base));
      JobSpec per_use = Job(llama, 2, 2, 3, 1, ParallelConfig::ONE_F_ONE_B, base);
      per_use.mutable_parallel()->set_reshard_after_forward(true);
      JobSpec kept = per_use;
      kept.mutable_parallel()->set_reshard_after_forward(false);
      const Outcome one = RunAll(Job(llama, 1, 1, 0, 2, ParallelConfig::ONE_F_ONE_B, base), 10);
      const Outcome got = RunAll(per_use, 10);
      const Outcome want = RunAll(kept, 10);
      // An INT8 base on PP2 × DP2 parts from one rank by slightly more than the f32 bounds at
      // any ZeRO stage (2.2e-6 relative in the loss at step 10, the Llama norm past 2e-5 at
      // step 9, measured at ZeRO-1 too: not the ZeRO-3 gathers'): the per-token int8 rounding
      // of the layers' inputs turns DP's reduction-order noise into a flipped code
      // (Int8BaseStagesQuantizeAsOneRankBitForBit shows the base is one rank's
      // bit for bit and bounds that gap), so here it is held to the kept stage only, below.
      if (base != ModelConfig::INT8) {
        ExpectSame(got, one, what + " per use");
        ExpectSame(want, one, what + " kept");
      }
      ASSERT_TRUE(got.status.ok()) << what << ": " << got.status;
      ASSERT_TRUE(want.status.ok()) << what << ": " << want.status;
      ASSERT_EQ(got.ranks.size(), want.ranks.size()) << what;
      for (size_t r = 0; r < got.ranks.size(); ++r) {
        const std::string rank = absl::StrCat(what, " rank ", r);
        EXPECT_TRUE(got.ranks[r].base_after == want.ranks[r].base_after) << rank << ": base";
        // The adapters' gradients: two rotating slots per use, full accumulation buffers kept.
        const ParallelLayout place = ParallelLayout::ForJob(got.job, static_cast<int>(r));
        int accumulated[2] = {};
        for (const Outcome* o : {&got, &want}) {
          for (const BufferSpec& b : PlanMemory(o->job, place).buffers) {
            accumulated[o == &want] += b.name.ends_with(".lora_grad_accum");
          }
        }
        EXPECT_EQ(accumulated[0], 0) << rank;
        EXPECT_GT(accumulated[1], 0) << rank;
        if (base != ModelConfig::FP32) {
          int qbase = 0;
          for (const auto& [name, bytes] : got.ranks[r].base_after) qbase += name.ends_with(".qbase");
          EXPECT_GT(qbase, 0) << rank << ": the quantized base's shards";
        }
        for (size_t s = 0; s < want.ranks[r].losses.size(); ++s) {
          EXPECT_NEAR(got.ranks[r].losses[s], want.ranks[r].losses[s],
                      1e-6 * want.ranks[r].losses[s])
              << rank << " step " << s + 1;
        }
      }

      // Resumed at its own layout after 5 steps: the uninterrupted run's steps 6–10.
      const std::string dir = (dir_ / absl::StrCat("zero3-", llama, base)).string();
      JobSpec saving = per_use;
      saving.mutable_checkpoint()->set_interval_steps(5);
      saving.mutable_checkpoint()->set_dir(dir);
      const Outcome first = RunAll(saving, 5);
      ASSERT_TRUE(first.status.ok()) << what << ": " << first.status;
      const Outcome resumed = RunAll(saving, 10, dir);
      ASSERT_TRUE(resumed.status.ok()) << what << ": " << resumed.status;
      for (size_t r = 0; r < resumed.ranks.size(); ++r) {
        const std::string rank = absl::StrCat(what, " resumed, rank ", r);
        const std::vector<double> tail(got.ranks[r].losses.begin() + 5, got.ranks[r].losses.end());
        EXPECT_EQ(resumed.ranks[r].losses, tail) << rank;
        EXPECT_TRUE(resumed.ranks[r].adapters == got.ranks[r].adapters) << rank << ": adapters";
        EXPECT_TRUE(resumed.ranks[r].base_after == got.ranks[r].base_after) << rank << ": base";
      }
    }
  }
}

TEST_F(LoraParallelTrainingTest, Bf16StagesMatchOneRankInBf16) {
  // Bounds: bf16 parameters, activations and gradients with the adapters in f32. A stage rounds
  // what one rank rounds (the link carries the 16-bit activation itself); what differs is the
  // order of the norm's and DP's sums, as in the pipeline's own bf16 test, whose bounds these
  // are (docs/parallelism.md, "Pipelines in mixed precision": losses 1e-3 relative, norms
  // 4e-2); adapters 2e-2, below its weights' 0.1: an adapter element moves by about lr = 3e-3
  // a step, so 2e-2 still catches a stage whose adapters are not stepped.
  // The one-rank reference is itself the regression test of a bf16 gradient buffer that the
  // adapters' backward wrote as f32, twice its size (heap corruption; AdapterView).
  for (const bool llama : {false, true}) {
    ExpectSame(RunAll(Bf16(Job(llama, 2, 1, 0, 1, ParallelConfig::ONE_F_ONE_B)), 10),
               RunAll(Bf16(Job(llama, 1, 1, 0, 1, ParallelConfig::ONE_F_ONE_B)), 10),
               absl::StrCat(llama ? "llama" : "gpt2", " bf16 pp2"),
               {.loss = 1e-3, .norm = 4e-2, .adapter = 2e-2});
  }
}

TEST_F(LoraParallelTrainingTest, QloraNf4BaseOnTwoStagesMatchesOneRank) {
  // Each stage quantizes its own blocks' weights from the seeded init, as one rank does: the
  // same NF4 bytes (checked bit for bit by name), so the f32 bounds hold.
  for (const bool llama : {false, true}) {
    ExpectSame(
        RunAll(Job(llama, 2, 1, 0, 1, ParallelConfig::ONE_F_ONE_B, ModelConfig::NF4), 10),
        RunAll(Job(llama, 1, 1, 0, 1, ParallelConfig::ONE_F_ONE_B, ModelConfig::NF4), 10),
        absl::StrCat(llama ? "llama" : "gpt2", " nf4 pp2"));
  }
}

// An INT8 (LLM.int8()) base on stages. Each stage quantizes its own blocks' weights from the
// seeded init with per-output-row absmax scales, as one rank does: every quantized buffer of
// every rank (codes and scales, PP2 and PP2 × DP2 at ZeRO-1) is the one-rank buffer of the same
// name bit for bit, so no quantization block or scale spans a stage's units differently. PP2
// alone is within the f32 bounds of one rank. PP2 × DP2's gap to one rank (reading the same
// global batch as micro-batches of two) is not in the base: step 1, which reads the base with
// the adapters' B still zero, has the same loss (measured 0 difference, GPT-2 and Llama), and
// the runs then stay at reduction noise (~1e-9 relative in the loss, ~1e-8 in the norm: DP's
// gradient sums in another order leave the adapters a few ulps apart) until one step jumps by
// three orders (GPT-2 step 7: 1e-6; Llama step 9: 6.7e-7 in the loss, 3.4e-5 in the norm;
// 2026-11-28). A jump, not a drift: LLM.int8() rounds each layer's input to int8 per token
// (kernels/int8_linear.h), and an input a few ulps off a rounding boundary flips its code,
// moving the activation by one code, a 127th of its row's absmax — f32 noise made a quantization
// step. The same happens with the outlier decomposition off (int8_threshold Infinity, seen
// 7.4e-6 at step 10: more columns quantized), so it is not the batch's outlier columns either.
// NF4 quantizes weights only, so NF4 stages keep the f32 bounds. Bounds for PP2 × DP2 here:
// step 1 at 1e-8 (the base and the forward are one rank's), every step at 1e-5 in the loss and
// 1e-4 in the norm (3–4× the largest seen), still far below a lost micro-batch or an adapter
// stepped twice (≥ 1e-3).
TEST_F(LoraParallelTrainingTest, Int8BaseStagesQuantizeAsOneRankBitForBit) {
  for (const bool llama : {false, true}) {
    const std::string family = llama ? "llama" : "gpt2";
    // Every quantized buffer of the run's ranks against one rank's of the same name.
    auto expect_one_rank_quantized_base = [](const Outcome& got, const Outcome& one,
                                             const std::string& what) {
      ASSERT_TRUE(got.status.ok()) << what << ": " << got.status;
      ASSERT_TRUE(one.status.ok()) << what << ": " << one.status;
      int compared = 0;
      for (size_t r = 0; r < got.ranks.size(); ++r) {
        for (const auto& [name, bytes] : got.ranks[r].base_before) {
          if (!IsQuantizedBaseBuffer(name)) continue;
          const auto it = one.ranks[0].base_before.find(name);
          ASSERT_NE(it, one.ranks[0].base_before.end()) << what << " rank " << r << " " << name;
          EXPECT_TRUE(bytes == it->second) << what << " rank " << r << " " << name;
          ++compared;
        }
      }
      EXPECT_GT(compared, 0) << what << ": int8 codes and scales compared";
    };
    const Outcome one = RunAll(Job(llama, 1, 1, 0, 1, ParallelConfig::ONE_F_ONE_B,
                                   ModelConfig::INT8), 10);
    const Outcome pp2 = RunAll(Job(llama, 2, 1, 0, 1, ParallelConfig::ONE_F_ONE_B,
                                   ModelConfig::INT8), 10);
    expect_one_rank_quantized_base(pp2, one, family + " int8 pp2");
    ExpectSame(pp2, one, family + " int8 pp2");

    const JobSpec dp = Job(llama, 2, 2, 1, 1, ParallelConfig::ONE_F_ONE_B, ModelConfig::INT8);
    const JobSpec one_dp = Job(llama, 1, 1, 0, 2, ParallelConfig::ONE_F_ONE_B, ModelConfig::INT8);
    const Outcome one_two = RunAll(one_dp, 10);
    const Outcome staged = RunAll(dp, 10);
    const std::string what = family + " int8 pp2 x dp2 zero-1";
    expect_one_rank_quantized_base(staged, one_two, what);
    ASSERT_EQ(one_two.ranks[0].losses.size(), 10u) << what;
    for (size_t k = 0; k < staged.ranks.size(); ++k) {
      const RankRun& r = staged.ranks[k];
      ASSERT_EQ(r.losses.size(), 10u) << what;
      EXPECT_TRUE(r.off_plan.empty()) << what << " rank " << k << ": " << r.off_plan.front();
      for (size_t s = 0; s < 10; ++s) {
        const double want = one_two.ranks[0].losses[s];
        const double norm = one_two.ranks[0].grad_norms[s];
        EXPECT_NEAR(r.losses[s], want, (s == 0 ? 1e-8 : 1e-5) * want)
            << what << " rank " << k << " step " << s + 1;
        EXPECT_NEAR(r.grad_norms[s], norm, 1e-4 * norm)
            << what << " rank " << k << " gradient norm, step " << s + 1;
      }
    }
  }
}

// A LoRA checkpoint written on PP2 (1F1B, and PP2 × DP2 at ZeRO-1) or TP2 (and TP2 × DP2 at
// ZeRO-1; TP4 with one KV head replicated on every rank) after 5 steps resumes at one rank, and
// one rank's at PP2, TP2 and TP2 with a replicated KV head: steps 6–10 are the uninterrupted run's, and the adapters at the
// end agree. The adapters, the seeded frozen base (with the head stage's copy of the tied wte
// taken from the embedding) and the AdamW moments are copied or placed element by element,
// exactly, so what differs is the other layout's reduction order: the f32 bounds (ExpectSame).
TEST_F(LoraParallelTrainingTest, CheckpointsResumeBetweenStagesAndOneRank) {
  struct Case {
    bool llama;
    int dp;  // of the pipelined side
    bool to_one_rank;
    bool tensor = false;  // TP2 instead of PP2 (the adapters joined from and split into shares)
    bool both = false;    // with `tensor`: TP2 × PP2
    int tp = 2;           // with `tensor`
    int kv_heads = 0;     // Llama's n_kv_head when set (below tp: replicated KV heads)
  };
  for (const Case& c : {Case{false, 1, true}, Case{true, 1, true}, Case{false, 1, false},
                        Case{true, 2, true}, Case{false, 1, true, true}, Case{true, 2, true, true},
                        Case{true, 1, false, true}, Case{false, 1, true, true, true},
                        Case{true, 1, true, true, false, 4, 1}, Case{true, 1, false, true, false, 2, 1}}) {
    // The global batch is the same on both sides: 4 micro-batches of dp sequences.
    JobSpec pp = Job(c.llama, c.tensor && !c.both ? 1 : 2, c.dp, c.dp > 1 ? 1 : 0, 1,
                     ParallelConfig::ONE_F_ONE_B);
    if (c.tensor) {
      pp.mutable_parallel()->set_world_size((c.both ? 2 : 1) * c.tp * c.dp);
      pp.mutable_parallel()->set_tensor_parallel(c.tp);
    }
    JobSpec one = Job(c.llama, 1, 1, 0, c.dp, ParallelConfig::ONE_F_ONE_B);
    if (c.kv_heads > 0) {
      pp.mutable_model()->set_n_kv_head(c.kv_heads);
      one.mutable_model()->set_n_kv_head(c.kv_heads);
    }
    JobSpec from = c.to_one_rank ? pp : one, to = c.to_one_rank ? one : pp;
    const std::string staged =
        c.both ? "tp2 x pp2"
        : c.tensor
            ? absl::StrCat("tp", c.tp, c.kv_heads > 0 ? absl::StrCat(" n_kv_head ", c.kv_heads) : "")
            : "pp2";
    const std::string what =
        absl::StrCat(c.llama ? "llama " : "gpt2 ", c.to_one_rank ? staged : "one rank",
                     c.dp > 1 ? " x dp2" : "", " -> ", c.to_one_rank ? "one rank" : staged);
    const std::string dir =
        (dir_ / absl::StrCat("resume-", c.llama, c.dp, c.to_one_rank, c.tensor, c.both, c.tp,
                             c.kv_heads))
            .string();
    const auto [whole, resumed] = RunStraightAndResumed(from, to, dir, what);
    ASSERT_TRUE(whole.status.ok() && resumed.status.ok()) << what;
    ASSERT_EQ(resumed.ranks.size(), whole.ranks.size()) << what;
    for (size_t k = 0; k < resumed.ranks.size(); ++k) {
      const RankRun& r = resumed.ranks[k];
      ASSERT_EQ(r.losses.size(), 5u) << what;
      for (int s = 0; s < 5; ++s) {
        const double want = whole.ranks[0].losses[5 + s];
        EXPECT_NEAR(r.losses[s], want, 1e-6 * want) << what << ", step " << 6 + s;
      }
      ASSERT_EQ(r.adapters.size(), whole.ranks[0].adapters.size()) << what;
      double worst = 0;
      for (size_t u = 0; u < r.adapters.size(); ++u) {
        ASSERT_EQ(r.adapters[u].size(), whole.ranks[0].adapters[u].size()) << what;
        for (size_t i = 0; i < r.adapters[u].size(); ++i) {
          worst = std::max(worst, std::abs(double{r.adapters[u][i]} - whole.ranks[0].adapters[u][i]));
        }
      }
      EXPECT_LT(worst, 1e-4) << what << ": adapters";
      // The frozen base came back bit for bit: the uninterrupted run's same rank's buffers of
      // the same name.
      for (const auto& [name, bytes] : r.base_after) {
        const auto it = whole.ranks[k].base_after.find(name);
        if (it == whole.ranks[k].base_after.end()) continue;
        const size_t n = std::min(bytes.size(), it->second.size());
        EXPECT_TRUE(std::equal(bytes.begin(), bytes.begin() + n, it->second.begin()))
            << what << " " << name;
      }
    }
  }
}

// 8-bit AdamW's adapter states across layouts (QuantizedAdapterMoments): TP2 → one rank, one
// rank → TP2, PP2 → one rank and TP2 × DP2 at ZeRO-1 → one rank, steps 6–10 against the
// uninterrupted run at the resuming layout. A TP share's A or B is another tensor than the whole
// one, so every block is dequantized and requantized on the new layout's blocks; blocks of 128 over
// adapters of 256–768 elements (a row-parallel A's 128-element share keeps f32 moments under
// min_quantized_numel 256, its whole A quantized ones: both kinds cross). The bound is
// ResumeTest.ReshardsEightBitAdamWStatesWithinOneQuantizationStep's 1e-3 relative on the loss,
// for the same reason: each layout quantizes its own blocks, so the runs differ by the
// moments' quantization noise (~1% per element) entering the update scaled by the learning
// rate, where a misplaced state changes the update by the moments' own size (m halved on load
// fails steps 7–10 here). The adapters after step 10 within 3e-3 absolute: the layouts' own
// quantization noise measured 1.0e-3 to 1.7e-3, m halved on load moves them 5.9e-3.
TEST_F(LoraParallelTrainingTest, EightBitAdamWAdapterStatesReshardAcrossLayouts) {
  struct Case {
    bool llama;
    int tp, pp;
    bool to_one_rank;
    int dp = 1;  // TP2 × DP2 at ZeRO-1: each share's states split by range too
  };
  for (const Case& c :
       {Case{false, 2, 1, true}, Case{true, 2, 1, true}, Case{false, 2, 1, false},
        Case{true, 2, 1, false}, Case{false, 1, 2, true}, Case{true, 2, 1, true, 2}}) {
    auto eight_bit = [](JobSpec job) {
      job.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAMW_8BIT);
      job.mutable_optimizer()->set_min_quantized_numel(256);
      job.mutable_optimizer()->set_quant_block_size(128);
      return job;
    };
    // The global batch is the same on both sides: 4 micro-batches of dp sequences.
    JobSpec split =
        eight_bit(Job(c.llama, c.pp, c.dp, c.dp > 1 ? 1 : 0, 1, ParallelConfig::ONE_F_ONE_B));
    split.mutable_parallel()->set_world_size(c.tp * c.pp * c.dp);
    split.mutable_parallel()->set_tensor_parallel(c.tp);
    const JobSpec one = eight_bit(Job(c.llama, 1, 1, 0, c.dp, ParallelConfig::ONE_F_ONE_B));
    JobSpec from = c.to_one_rank ? split : one, to = c.to_one_rank ? one : split;
    const std::string what =
        absl::StrCat(c.llama ? "llama " : "gpt2 ", c.to_one_rank ? "" : "1 -> ", "tp", c.tp, " pp",
                     c.pp, " dp", c.dp, c.to_one_rank ? " -> 1" : "");
    const std::string dir =
        (dir_ / absl::StrCat("adam8-", c.llama, c.tp, c.pp, c.dp, c.to_one_rank)).string();
    const auto [whole, resumed] = RunStraightAndResumed(from, to, dir, what);
    ASSERT_TRUE(whole.status.ok() && resumed.status.ok()) << what;
    ASSERT_EQ(resumed.ranks.size(), whole.ranks.size()) << what;
    for (const RankRun& r : resumed.ranks) {
      ASSERT_EQ(r.losses.size(), 5u) << what;
      for (int s = 0; s < 5; ++s) {
        const double want = whole.ranks[0].losses[5 + s];
        EXPECT_NEAR(r.losses[s], want, 1e-3 * want) << what << ", step " << 6 + s;
      }
      double worst = 0;
      ASSERT_EQ(r.adapters.size(), whole.ranks[0].adapters.size()) << what;
      for (size_t u = 0; u < r.adapters.size(); ++u) {
        for (size_t i = 0; i < r.adapters[u].size(); ++i) {
          worst =
              std::max(worst, std::abs(double{r.adapters[u][i]} - whole.ranks[0].adapters[u][i]));
        }
      }
      EXPECT_LT(worst, 3e-3) << what << ": adapters";
    }
  }
}

// `zt export` of a PP2, TP2, TP2 × PP2 or TP2 × DP2 (ZeRO-3) LoRA checkpoint: the PEFT
// adapters are each block's from the stage that held it, its TP shares joined
// (ReadWholeAdaptersFromShares), bit for bit what the run's `zt train --export` writes
// (FullAdapters, gathered from the live ranks);
// --merge-adapters joins the f32 base from the stages' shares. Against one rank's checkpoint
// of the same 3 steps: every merged tensor within the adapters' reduction noise (1e-4,
// ExpectSame's), the unadapted ones bit for bit.
TEST_F(LoraParallelTrainingTest, ExportOfAStagedCheckpointIsTheWholeModelsAdapters) {
  struct Case {
    bool llama;
    int pp, tp;
    int dp = 1;  // TP2 × DP2 at ZeRO-3: the f32 base's shares split by range too
  };
  for (const Case& c : {Case{false, 2, 1}, Case{true, 2, 1}, Case{false, 1, 2}, Case{true, 1, 2},
                        Case{true, 2, 2}, Case{false, 1, 2, 2}}) {
    const bool llama = c.llama;
    const std::string what =
        absl::StrCat(llama ? "llama" : "gpt2", " pp", c.pp, " tp", c.tp, " dp", c.dp);
    JobSpec pp = Job(llama, c.pp, c.dp, c.dp > 1 ? 3 : 0, 1, ParallelConfig::ONE_F_ONE_B);
    if (c.tp > 1) {
      pp.mutable_parallel()->set_world_size(c.pp * c.tp * c.dp);
      pp.mutable_parallel()->set_tensor_parallel(c.tp);
    }
    JobSpec one = Job(llama, 1, 1, 0, c.dp, ParallelConfig::ONE_F_ONE_B);
    const std::string tag = absl::StrCat(llama, c.pp, c.tp, c.dp);
    pp.mutable_checkpoint()->set_dir((dir_ / ("export-pp-" + tag)).string());
    one.mutable_checkpoint()->set_dir((dir_ / ("export-one-" + tag)).string());
    pp.mutable_checkpoint()->set_interval_steps(3);
    one.mutable_checkpoint()->set_interval_steps(3);
    const Outcome staged = RunAll(pp, 3);
    ASSERT_TRUE(staged.status.ok()) << what << ": " << staged.status;
    ASSERT_TRUE(RunAll(one, 3).status.ok()) << what;

    const std::string peft = (dir_ / ("peft-" + tag)).string();
    absl::StatusOr<LoraExportResult> exported =
        ExportLoraCheckpoint(pp.checkpoint().dir(), peft, {});
    ASSERT_TRUE(exported.ok()) << what << ": " << exported.status();
    const ModelLayout layout = BuildModelLayout(staged.job.model());
    std::vector<std::vector<float>> read(layout.units.size());
    std::vector<Tensor> views(layout.units.size());
    for (size_t u = 0; u < layout.units.size(); ++u) {
      read[u].assign(static_cast<size_t>(layout.units[u].lora_numel), -7.0f);
      if (!read[u].empty()) {
        views[u] = Tensor(read[u].data(), DType::kF32, {layout.units[u].lora_numel});
      }
    }
    ASSERT_TRUE(ReadPeftAdapter(staged.job.model(), layout, peft, views).ok()) << what;
    EXPECT_TRUE(read == staged.ranks[0].adapters) << what << ": the PEFT adapters";

    const std::string merged = (dir_ / ("merged-pp-" + tag)).string();
    const std::string merged_one = (dir_ / ("merged-one-" + tag)).string();
    exported = ExportLoraCheckpoint(pp.checkpoint().dir(), merged, {.merge_adapters = true});
    ASSERT_TRUE(exported.ok()) << what << ": " << exported.status();
    ASSERT_TRUE(
        ExportLoraCheckpoint(one.checkpoint().dir(), merged_one, {.merge_adapters = true}).ok());
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> got =
        SafetensorsFile::Open((std::filesystem::path(merged) / "model.safetensors").string());
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> want =
        SafetensorsFile::Open((std::filesystem::path(merged_one) / "model.safetensors").string());
    ASSERT_TRUE(got.ok() && want.ok()) << what;
    ASSERT_EQ((*got)->tensors().size(), (*want)->tensors().size()) << what;
    for (const SafetensorsTensorInfo& w : (*want)->tensors()) {
      const SafetensorsTensorInfo* g = (*got)->Find(w.name);
      ASSERT_NE(g, nullptr) << what << " " << w.name;
      std::vector<float> a(static_cast<size_t>(w.numel())), b(a.size());
      ASSERT_TRUE((*want)->ReadAsF32(w, absl::MakeSpan(a)).ok());
      ASSERT_TRUE((*got)->ReadAsF32(*g, absl::MakeSpan(b)).ok());
      double worst = 0;
      for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double{a[i]} - b[i]));
      const bool adapted = w.name.find("attn") != std::string::npos ||
                           w.name.find("mlp") != std::string::npos;
      if (adapted) {
        EXPECT_LT(worst, 1e-4) << what << " " << w.name;
      } else {
        EXPECT_EQ(worst, 0.0) << what << " " << w.name;
      }
    }
  }
}

// Tensor parallelism (Megatron's rule for adapters, worker/model/lora_tensor_parallel.h): TP2
// and TP2 × DP2 at ZeRO-1 against one rank. The ranks run one rank's ops on shares; what
// differs is the order of sums — the row-parallel partial products, h = Σ_k x_k·A_kᵀ, the
// column-parallel A gradient's partials, the norm's per-rank sums — fp32 reduction noise:
// ExpectSame's bounds, the tensor-parallel tests' for the same noise. The exported adapters
// (FullAdapters, joined from the shares) are one rank's within them.
TEST_F(LoraParallelTrainingTest, TensorParallelAdaptersMatchOneRank) {
  for (const bool llama : {false, true}) {
    for (const int dp : {1, 2}) {
      JobSpec job = Job(llama, 1, dp, dp > 1 ? 1 : 0, 1, ParallelConfig::ONE_F_ONE_B);
      job.mutable_parallel()->set_world_size(2 * dp);
      job.mutable_parallel()->set_tensor_parallel(2);
      ExpectSame(RunAll(job, 10),
                 RunAll(Job(llama, 1, 1, 0, dp, ParallelConfig::ONE_F_ONE_B), 10),
                 absl::StrCat(llama ? "llama" : "gpt2", " tp2", dp > 1 ? " x dp2 zero-1" : ""));
    }
    // bf16 (parameters, activations, gradients; the adapters f32): the h and A-gradient sums
    // go through the TP group's 16-bit all-reduce (f32 adds, one rounding), where one rank
    // rounds its GEMM once: the pipeline bf16 test's bounds (Bf16StagesMatchOneRankInBf16).
    JobSpec tp_bf16 = Bf16(Job(llama, 1, 1, 0, 1, ParallelConfig::ONE_F_ONE_B));
    tp_bf16.mutable_parallel()->set_world_size(2);
    tp_bf16.mutable_parallel()->set_tensor_parallel(2);
    ExpectSame(RunAll(tp_bf16, 10),
               RunAll(Bf16(Job(llama, 1, 1, 0, 1, ParallelConfig::ONE_F_ONE_B)), 10),
               absl::StrCat(llama ? "llama" : "gpt2", " bf16 tp2"),
               {.loss = 1e-3, .norm = 4e-2, .adapter = 2e-2});
    // TP2 × PP2: each stage's blocks' adapters at the stage's TP shares.
    JobSpec both = Job(llama, 2, 1, 0, 1, ParallelConfig::ONE_F_ONE_B);
    both.mutable_parallel()->set_world_size(4);
    both.mutable_parallel()->set_tensor_parallel(2);
    ExpectSame(RunAll(both, 10), RunAll(Job(llama, 1, 1, 0, 1, ParallelConfig::ONE_F_ONE_B), 10),
               absl::StrCat(llama ? "llama" : "gpt2", " tp2 x pp2"));
  }
}

// Replicated KV heads (n_kv_head < t): each rank's k_proj / v_proj B is its one KV head's
// rows, held alike by the t / n_kv_head ranks sharing the head; each of them computes the
// gradient of its own query heads' share of dK / dV, summed over those ranks before the step
// (Transformer::ReduceReplicatedKvGrads), and the norm counts the rows once per head
// (CountsLoraShareInNorm). Llama at TP2 with one KV head and TP4 with two and one, against one
// rank at the f32 bounds: an unsummed head's B moves at half (or a quarter) of its gradient,
// a head counted twice in the norm moves it by far more than 2e-5.
TEST_F(LoraParallelTrainingTest, ReplicatedKvHeadsAdaptersMatchOneRank) {
  struct Case {
    int tp, kv_heads;
  };
  for (const Case& c : {Case{2, 1}, Case{4, 2}, Case{4, 1}}) {
    JobSpec one = Job(/*llama=*/true, 1, 1, 0, 1, ParallelConfig::ONE_F_ONE_B);
    one.mutable_model()->set_n_kv_head(c.kv_heads);
    JobSpec job = one;
    job.mutable_parallel()->set_world_size(c.tp);
    job.mutable_parallel()->set_tensor_parallel(c.tp);
    ExpectSame(RunAll(job, 10), RunAll(one, 10),
               absl::StrCat("llama tp", c.tp, ", n_kv_head ", c.kv_heads));
  }
  // bf16: the head's B gradient summed through the 16-bit KV all-reduce (the plan's
  // comm.convert.tensor_kv, B's rows × r): the bf16 TP bounds of TensorParallelAdaptersMatchOneRank.
  JobSpec one = Bf16(Job(/*llama=*/true, 1, 1, 0, 1, ParallelConfig::ONE_F_ONE_B));
  one.mutable_model()->set_n_kv_head(1);
  JobSpec job = one;
  job.mutable_parallel()->set_world_size(2);
  job.mutable_parallel()->set_tensor_parallel(2);
  ExpectSame(RunAll(job, 10), RunAll(one, 10), "llama bf16 tp2, n_kv_head 1",
             {.loss = 1e-3, .norm = 4e-2, .adapter = 2e-2});
}

// Adafactor on adapter shares: a row-parallel site's A split by columns and a column-parallel
// site's B by rows have their factored statistics summed over the TP group as the base's split
// weights do (LoraAdafactorSplits; a replicated KV head's rows counted once), so TP2 (GPT-2,
// Llama) and TP4 with one KV head step one rank's logical matrices: the f32 bounds, where a
// share's local statistics alone move C and mean(R) by the share factor. A TP2 checkpoint of
// the share-shaped factored states resumes on TP2 bit for bit, and is refused by name on one
// rank (the TP reshard places elementwise states only).
TEST_F(LoraParallelTrainingTest, TensorParallelAdafactorMatchesOneRank) {
  auto adafactor = [](JobSpec job) {
    job.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAFACTOR);
    job.mutable_optimizer()->mutable_adafactor()->set_beta1(0.9f);
    // The step is optimizer.lr, not lr · RMS(param): B starts at zero, where the parameter
    // scale (eps2 = 1e-3) would leave the adapters nearly still over 10 steps; and Adafactor's
    // RMS-normalised update at the small job's AdamW rate moves the loss less than the 0.05
    // that ExpectSame asks of learning adapters.
    job.mutable_optimizer()->mutable_adafactor()->set_scale_parameter(false);
    job.mutable_optimizer()->set_lr(1e-2f);
    return job;
  };
  struct Case {
    bool llama;
    int tp, kv_heads;
  };
  for (const Case& c : {Case{false, 2, 0}, Case{true, 2, 0}, Case{true, 4, 1}}) {
    JobSpec one = adafactor(Job(c.llama, 1, 1, 0, 1, ParallelConfig::ONE_F_ONE_B));
    if (c.kv_heads > 0) one.mutable_model()->set_n_kv_head(c.kv_heads);
    JobSpec job = one;
    job.mutable_parallel()->set_world_size(c.tp);
    job.mutable_parallel()->set_tensor_parallel(c.tp);
    ExpectSame(RunAll(job, 10), RunAll(one, 10),
               absl::StrCat(c.llama ? "llama" : "gpt2", " adafactor tp", c.tp,
                            c.kv_heads > 0 ? absl::StrCat(", n_kv_head ", c.kv_heads) : ""));
  }
  JobSpec tp2 = adafactor(Job(/*llama=*/true, 1, 1, 0, 1, ParallelConfig::ONE_F_ONE_B));
  tp2.mutable_parallel()->set_world_size(2);
  tp2.mutable_parallel()->set_tensor_parallel(2);
  const Outcome whole = RunAll(tp2, 10);
  ASSERT_TRUE(whole.status.ok()) << whole.status;
  const std::string dir = (dir_ / "adafactor-tp2").string();
  JobSpec first = tp2;
  first.mutable_checkpoint()->set_dir(dir);
  first.mutable_checkpoint()->set_interval_steps(5);
  ASSERT_TRUE(RunAll(first, 5).status.ok());
  const Outcome resumed = RunAll(first, 10, dir);
  ASSERT_TRUE(resumed.status.ok()) << resumed.status;
  for (size_t r = 0; r < resumed.ranks.size(); ++r) {
    ASSERT_EQ(resumed.ranks[r].losses.size(), 5u);
    for (int s = 0; s < 5; ++s) {
      EXPECT_EQ(resumed.ranks[r].losses[s], whole.ranks[r].losses[5 + s]) << "rank " << r;
    }
    EXPECT_TRUE(resumed.ranks[r].adapters == whole.ranks[r].adapters) << "rank " << r;
  }
  // At another TP degree the factored states are not resharded yet: refused, the buffer named.
  JobSpec one = adafactor(Job(/*llama=*/true, 1, 1, 0, 1, ParallelConfig::ONE_F_ONE_B));
  one.mutable_checkpoint()->set_dir(dir);
  one.mutable_checkpoint()->set_interval_steps(5);
  const Outcome elsewhere = RunAll(one, 10, dir);
  EXPECT_EQ(elsewhere.status.code(), absl::StatusCode::kUnimplemented) << elsewhere.status;
  EXPECT_NE(elsewhere.status.message().find(
                "resuming at another tensor- or pipeline-parallel layout: buffer block.0.lora."),
            std::string::npos)
      << elsewhere.status;
}

// Sequence parallelism with adapters: the column-parallel sites read the gathered input (x
// whole, as without it), the row-parallel sites add h·Bᵀ on rank 0 into the partial product the
// reduce-scatter sums, and the frozen norms' partial gradients are not summed into the adapter
// gradients (ReduceSequenceParallelNormGrads skips a frozen unit). TP2 + SP, with dropout (a
// column-parallel site's mask over the gathered rows is one rank's), against one rank at the
// f32 bounds: a norm sum landing in the adapters' gradient moves them far outside.
TEST_F(LoraParallelTrainingTest, SequenceParallelAdaptersMatchOneRank) {
  for (const bool llama : {false, true}) {
    for (const float dropout : {0.0f, 0.1f}) {
      JobSpec one = Job(llama, 1, 1, 0, 1, ParallelConfig::ONE_F_ONE_B);
      one.mutable_model()->mutable_lora()->set_dropout(dropout);
      JobSpec job = one;
      job.mutable_parallel()->set_world_size(2);
      job.mutable_parallel()->set_tensor_parallel(2);
      job.mutable_parallel()->set_sequence_parallel(true);
      ExpectSame(RunAll(job, 10), RunAll(one, 10),
                 absl::StrCat(llama ? "llama" : "gpt2", " tp2 + sp", dropout > 0 ? " dropout" : ""));
    }
  }
}

// model.init_from and model.lora.init_from on TP ranks: the whole base (a Hugging Face file)
// and the whole adapters (a PEFT directory) are read on every rank and each keeps its shares
// (the base as any TP job's, the adapters by LoraSliceOf: Transformer::SetLoraFromWhole). The
// base is another seed's and the adapters are not PEFT's init (B nonzero), so a rank that
// ignored either, or kept another rank's share, starts elsewhere than one rank and parts from
// it at once; against one rank from the same files at the f32 bounds. GPT-2 and Llama at TP2,
// Llama with one KV head at TP2 (a replicated k_proj / v_proj B).
TEST_F(LoraParallelTrainingTest, InitFromFilesStartTensorParallelRanksWhereOneRankStarts) {
  struct Case {
    bool llama;
    int kv_heads;
  };
  for (const Case& c : {Case{false, 0}, Case{true, 0}, Case{true, 1}}) {
    const std::string what =
        absl::StrCat(c.llama ? "llama" : "gpt2", c.kv_heads > 0 ? " n_kv_head 1" : "", " tp2");
    JobSpec one = Job(c.llama, 1, 1, 0, 1, ParallelConfig::ONE_F_ONE_B);
    if (c.kv_heads > 0) one.mutable_model()->set_n_kv_head(c.kv_heads);
    const JobSpec validated = ValidatedJob(one).value();
    // The base: one rank's seeded init under another seed, exported as a Hugging Face file.
    JobSpec other_seed = one;
    other_seed.mutable_train()->set_seed(one.train().seed() + 17);
    const Outcome source = RunAll(other_seed, 1);
    ASSERT_TRUE(source.status.ok()) << what << ": " << source.status;
    zerotrain::ModelConfig plain = validated.model();
    plain.clear_lora();
    const ModelLayout plain_layout = BuildModelLayout(plain);
    std::vector<std::vector<float>> base(plain_layout.units.size());
    std::vector<const float*> units;
    for (size_t u = 0; u < plain_layout.units.size(); ++u) {
      const std::vector<char>& bytes =
          source.ranks[0].base_before.at(plain_layout.units[u].name + ".params");
      base[u].resize(static_cast<size_t>(plain_layout.units[u].numel));
      ASSERT_GE(bytes.size(), base[u].size() * sizeof(float)) << what;
      std::memcpy(base[u].data(), bytes.data(), base[u].size() * sizeof(float));
      units.push_back(base[u].data());
    }
    const std::string hf = (dir_ / absl::StrCat("base-", c.llama, c.kv_heads, ".safetensors")).string();
    ASSERT_TRUE(ExportHuggingFace(hf, plain, plain_layout, units).ok()) << what;
    // The adapters: a pattern, B included.
    const std::string peft = (dir_ / absl::StrCat("peft-", c.llama, c.kv_heads)).string();
    ASSERT_TRUE(testing::WritePatternPeftAdapter(validated.model(),
                                                 BuildModelLayout(validated.model()), peft)
                    .ok())
        << what;
    one.mutable_model()->set_init_from(hf);
    one.mutable_model()->mutable_lora()->set_init_from(peft);
    JobSpec tp = one;
    tp.mutable_parallel()->set_world_size(2);
    tp.mutable_parallel()->set_tensor_parallel(2);
    ExpectSame(RunAll(tp, 10), RunAll(one, 10), what);
  }
}

// With lora.dropout on TP2 each rank draws the masks of the logical elements it holds (a
// row-parallel site's input columns by their place in the whole input, LoraDropoutOf), so
// the group drops exactly what one rank drops: the f32 bounds hold, where masks drawn by share
// index part the runs by far more (the pipeline dropout test's ≥ 5e-2).
TEST_F(LoraParallelTrainingTest, TensorParallelDropoutMasksAreOneRanks) {
  for (const bool llama : {false, true}) {
    auto dropout = [](JobSpec job) {
      job.mutable_model()->mutable_lora()->set_dropout(0.1f);
      return job;
    };
    JobSpec job = dropout(Job(llama, 1, 1, 0, 1, ParallelConfig::ONE_F_ONE_B));
    job.mutable_parallel()->set_world_size(2);
    job.mutable_parallel()->set_tensor_parallel(2);
    ExpectSame(RunAll(job, 10),
               RunAll(dropout(Job(llama, 1, 1, 0, 1, ParallelConfig::ONE_F_ONE_B)), 10),
               absl::StrCat(llama ? "llama" : "gpt2", " tp2 dropout"));
  }
}

}  // namespace
}  // namespace zt
