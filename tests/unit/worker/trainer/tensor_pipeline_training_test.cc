// Tensor × pipeline parallelism (3D parallelism, issue 18) in the step loop: each pipeline
// stage's units split over its tensor-parallel group (threads of this process, Gloo over
// loopback), the whole residual stream sent from each TP rank of a stage to the same TP rank of
// the next, the vocabulary-parallel head and loss on the last stage's TP group, and a tied
// wte's two copies summed shard by shard between the first and last stage. Against one rank
// from the same seed over 10 steps (losses, gradient norms, every stage's weights against the
// one-rank weights sliced; arenas equal to the plan): TP2 × PP2 under GPipe, 1F1B and
// interleaved 1F1B, TP4 × PP2 with Llama's KV heads replicated, TP2 × PP2 × DP2 under ZeRO-1,
// 2 and 3; GPT-2 (tied) and Llama (GQA, untied) each. Checkpoints written at TP2 × PP2 resume at
// one rank's layout × DP4 and the other way round; `zt export` of a TP2 × PP2 checkpoint is the
// whole model; PP2 and TP2 × PP2 start from model.init_from, each stage reading its own units.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "tests/unit/worker/trainer/pipeline_runs.h"
#include "tests/unit/worker/trainer/small_sharded_job.h"
#include "worker/checkpoint/hf_interop.h"
#include "worker/checkpoint/checkpoint_export.h"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"

namespace zt {
namespace {

using testing::PipelineOutcome;
using zerotrain::JobSpec;
using zerotrain::ParallelConfig;

class TensorPipelineTrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TestScratchDir("zt-tp-pp-test");
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), testing::PatternTokens(), 32).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // tp × pp × dp ranks, m = 4 micro-batches of `micro_batch` sequences per step.
  JobSpec Gpt2(int tp, int pp, int dp, int zero, int micro_batch,
               ParallelConfig::PipelineSchedule schedule = ParallelConfig::ONE_F_ONE_B) {
    JobSpec job = testing::SmallShardedJob((dir_ / "train.bin").string(), tp * pp * dp, zero,
                                           micro_batch, /*accum=*/4);
    job.mutable_parallel()->set_tensor_parallel(tp);
    job.mutable_parallel()->set_pipeline_parallel(pp);
    job.mutable_parallel()->set_pipeline_schedule(schedule);
    job.mutable_train()->set_max_steps(10);
    return job;
  }
  // Llama with GQA, its KV heads split at t = 2 and replicated at t = 4, and an untied head.
  JobSpec Llama(int tp, int pp, int dp, int zero, int micro_batch,
                ParallelConfig::PipelineSchedule schedule = ParallelConfig::ONE_F_ONE_B) {
    JobSpec job = Gpt2(tp, pp, dp, zero, micro_batch, schedule);
    testing::MakeSmallGqaLlama(job);
    return job;
  }
  JobSpec Model(bool llama, int tp, int pp, int dp, int zero, int micro_batch,
                ParallelConfig::PipelineSchedule schedule = ParallelConfig::ONE_F_ONE_B) {
    return llama ? Llama(tp, pp, dp, zero, micro_batch, schedule)
                 : Gpt2(tp, pp, dp, zero, micro_batch, schedule);
  }

  std::filesystem::path dir_;
};

PipelineOutcome RunRanks(const JobSpec& job, int steps, const std::string& resume = "") {
  return testing::RunPipelineRanks(job, steps, resume);
}

// Rank order is TP innermost, then DP, then PP (rank = t + tp·(d + dp·p)): every rank of the
// job reports the same losses, and its tensor coordinate is rank mod tp.
void ExpectRankOrder(const PipelineOutcome& got, const std::string& what) {
  const int tp = got.job.parallel().tensor_parallel();
  for (size_t r = 0; r < got.ranks.size(); ++r) {
    EXPECT_EQ(got.ranks[r].tp_rank, static_cast<int>(r) % tp) << what << " rank " << r;
    EXPECT_EQ(got.ranks[r].losses, got.ranks[0].losses) << what << " rank " << r;
  }
}

TEST_F(TensorPipelineTrainingTest, TwoByTwoMatchesOneRankUnderEverySchedule) {
  // n_layer 4: six units, so that interleaved 1F1B's p·v = 4 chunks all hold blocks. Weights to
  // 2e-4, not 1e-4: at this depth three of Llama's MLP weights end 1.09e-4 from one rank's
  // (2026-11-27), the same bits under every schedule and under TP2 without a pipeline — tensor
  // parallelism's reduction-order noise, which Adam's m/√v turns into up to lr a step on
  // weights whose gradient is near zero. A wrong slice or update is ~lr = 3e-3 off.
  for (const bool llama : {false, true}) {
    auto job = [&](int tp, int pp, ParallelConfig::PipelineSchedule schedule) {
      JobSpec j = Model(llama, tp, pp, 1, 0, 1, schedule);
      j.mutable_model()->set_n_layer(4);
      if (schedule == ParallelConfig::INTERLEAVED) j.mutable_parallel()->set_virtual_stages(2);
      return j;
    };
    const PipelineOutcome reference = RunRanks(job(1, 1, ParallelConfig::ONE_F_ONE_B), 10);
    for (auto schedule :
         {ParallelConfig::GPIPE, ParallelConfig::ONE_F_ONE_B, ParallelConfig::INTERLEAVED}) {
      const std::string what = absl::StrCat(llama ? "llama" : "gpt2", " tp2 x pp2 ",
                                            ParallelConfig::PipelineSchedule_Name(schedule));
      const PipelineOutcome got = RunRanks(job(2, 2, schedule), 10);
      testing::ExpectSamePipelineTraining(got, reference, what, /*weight_bound=*/2e-4);
      ExpectRankOrder(got, what);
    }
  }
}

TEST_F(TensorPipelineTrainingTest, LlamaReplicatedKvHeadsOnFourByTwoMatchOneRank) {
  // t = 4 > n_kv_head 2: each KV head on two ranks of a stage's TP group, its partial
  // gradients summed after the schedule (unsummed, they are half the gradient).
  testing::ExpectSamePipelineTraining(RunRanks(Llama(4, 2, 1, 0, 1), 10),
                                      RunRanks(Llama(1, 1, 1, 0, 1), 10), "llama tp4 x pp2 1F1B");
}

// Sequence parallelism on TP × PP: the residual stream between stages is each TP rank's token
// rows (B·T/t of them), so each of a TP group's t links carries its own shard, 1/t of what
// TP × PP sends without it; the stage's norms, residual adds and the head's final norm run on
// the shard as on one stage. Against one rank: GPT-2 and Llama at TP2 × PP2 (1F1B and
// interleaved), Llama at TP4 × PP2 with its KV heads replicated.
TEST_F(TensorPipelineTrainingTest, SequenceParallelStagesCarryTheirShardsAndMatchOneRank) {
  for (const bool llama : {false, true}) {
    auto job = [&](int tp, int pp, ParallelConfig::PipelineSchedule schedule) {
      JobSpec j = Model(llama, tp, pp, 1, 0, 1, schedule);
      j.mutable_model()->set_n_layer(4);
      if (schedule == ParallelConfig::INTERLEAVED) j.mutable_parallel()->set_virtual_stages(2);
      j.mutable_parallel()->set_sequence_parallel(tp > 1);
      return j;
    };
    const PipelineOutcome reference = RunRanks(job(1, 1, ParallelConfig::ONE_F_ONE_B), 10);
    for (auto schedule : {ParallelConfig::ONE_F_ONE_B, ParallelConfig::INTERLEAVED}) {
      const std::string what = absl::StrCat(llama ? "llama" : "gpt2", " sp tp2 x pp2 ",
                                            ParallelConfig::PipelineSchedule_Name(schedule));
      const PipelineOutcome got = RunRanks(job(2, 2, schedule), 10);
      // TwoByTwoMatchesOneRankUnderEverySchedule's bound (the same noise at this depth).
      testing::ExpectSamePipelineTraining(got, reference, what, /*weight_bound=*/2e-4);
      ExpectRankOrder(got, what);
    }
    if (llama) {
      testing::ExpectSamePipelineTraining(RunRanks(job(4, 2, ParallelConfig::ONE_F_ONE_B), 10),
                                          reference, "llama sp tp4 x pp2 1F1B",
                                          /*weight_bound=*/2e-4);
    }
  }
}

TEST_F(TensorPipelineTrainingTest, TwoByTwoByTwoUnderZeroOneTwoAndThreeMatchesOneRank) {
  // TP2 × PP2 × DP2: ZeRO inside each data-parallel group (the ranks of equal tensor and
  // pipeline coordinates); the two replicas' micro-batches k are the global batch's sequences
  // 2k and 2k + 1, which one rank reads as micro-batch k of 2. ZeRO-3 stages keep their units
  // gathered for the step (reshard_after_forward false).
  for (const bool llama : {false, true}) {
    const PipelineOutcome reference = RunRanks(Model(llama, 1, 1, 1, 0, 2), 10);
    for (int zero : {1, 2, 3}) {
      const std::string what =
          absl::StrCat(llama ? "llama" : "gpt2", " tp2 x pp2 x dp2 zero-", zero, " 1F1B");
      JobSpec job = Model(llama, 2, 2, 2, zero, 1);
      job.mutable_parallel()->set_reshard_after_forward(false);
      PipelineOutcome got = RunRanks(job, 10);
      if (zero == 3 && got.status.ok()) {
        // Each rank's parameters are its shard: data-parallel member d holds elements
        // [d·s, (d + 1)·s) of its padded share, so the two members' shards joined are the share.
        for (int r : {0, 1, 4, 5}) {  // data coordinate 0; its replica is rank r + tp
          for (size_t u = 0; u < got.ranks[r].params.size(); ++u) {
            const std::vector<float>& second = got.ranks[r + 2].params[u];
            got.ranks[r].params[u].insert(got.ranks[r].params[u].end(), second.begin(),
                                          second.end());
          }
          got.ranks[r + 2].params = got.ranks[r].params;
        }
      }
      testing::ExpectSamePipelineTraining(got, reference, what);
      ExpectRankOrder(got, what);
      if (!got.status.ok()) continue;
      // Each rank's data-parallel replica (rank + tp) ends with its parameters.
      for (int r : {0, 1, 4, 5}) {
        EXPECT_EQ(got.ranks[r].params, got.ranks[r + 2].params) << what << " rank " << r;
      }
    }
  }
}

// Written at TP2 × PP2 × DP1 after 3 steps and resumed at TP1 × PP1 × DP4 for 3 more, and the
// other way round: steps 4–6 are the uninterrupted run's at the first layout, and the final
// weights of the two runs agree (each rank's shares against the whole model), to the
// reduction-order noise of another layout (ExpectSamePipelineTraining's bounds: 1e-6 per loss
// here too, as the tensor-parallel reshard test bounds it; parameters and AdamW moments are
// placed element by element, exactly). The global batch is the same on both sides: 16
// sequences a step (4 micro-batches of 4, or 4 replicas of 4 micro-batches of 1).
TEST_F(TensorPipelineTrainingTest, CheckpointsReshardBetweenTwoByTwoAndFourReplicas) {
  for (const bool llama : {false, true}) {
    for (const bool to_replicas : {true, false}) {
      JobSpec tp_pp = Model(llama, 2, 2, 1, 1, 4);
      JobSpec replicas = Model(llama, 1, 1, 4, 1, 1);
      JobSpec from = to_replicas ? tp_pp : replicas, to = to_replicas ? replicas : tp_pp;
      const std::string what = absl::StrCat(llama ? "llama " : "gpt2 ",
                                            to_replicas ? "tp2 x pp2 -> dp4" : "dp4 -> tp2 x pp2");
      const std::string dir = (dir_ / absl::StrCat("reshard-", llama, to_replicas)).string();
      from.mutable_train()->set_max_steps(6);
      from.mutable_checkpoint()->set_interval_steps(3);
      JobSpec straight = from;
      straight.mutable_checkpoint()->set_dir(dir + "-straight");
      const PipelineOutcome whole = RunRanks(straight, 6);
      ASSERT_TRUE(whole.status.ok()) << what << ": " << whole.status;
      from.mutable_checkpoint()->set_dir(dir);
      ASSERT_TRUE(RunRanks(from, 3).status.ok()) << what;
      to.mutable_train()->set_max_steps(6);
      to.mutable_checkpoint()->set_interval_steps(3);
      to.mutable_checkpoint()->set_dir(dir);
      const PipelineOutcome resumed = RunRanks(to, 6, dir);
      ASSERT_TRUE(resumed.status.ok()) << what << ": " << resumed.status;
      for (const testing::PipelineRankRun& r : resumed.ranks) {
        ASSERT_EQ(r.losses.size(), 3u) << what;
        for (int s = 0; s < 3; ++s) {
          const double want = whole.ranks[0].losses[3 + s];
          EXPECT_NEAR(r.losses[s], want, 1e-6 * want) << what << ", step " << 4 + s;
        }
      }
      // The TP2 × PP2 run's shares against the DP4 run's whole units (ZeRO-1: whole on every
      // replica).
      if (to_replicas) {
        testing::ExpectSameStageWeights(whole, resumed, what);
      } else {
        testing::ExpectSameStageWeights(resumed, whole, what);
      }
    }
  }
}

// The largest difference between two runs' whole models (FullWeights) at the end.
double WorstWholeWeight(const PipelineOutcome& got, const PipelineOutcome& want) {
  double worst = 0;
  for (const testing::PipelineRankRun& r : got.ranks) {
    EXPECT_EQ(r.whole.size(), want.ranks[0].whole.size());
    for (size_t u = 0; u < std::min(r.whole.size(), want.ranks[0].whole.size()); ++u) {
      for (size_t i = 0; i < std::min(r.whole[u].size(), want.ranks[0].whole[u].size()); ++i) {
        worst = std::max(worst, std::abs(double{r.whole[u][i]} - want.ranks[0].whole[u][i]));
      }
    }
  }
  return worst;
}

// A full model's 8-bit AdamW and Adafactor states across layouts (LogicalOptimizerState,
// worker/checkpoint/logical_optimizer_state.h): written after 3 steps at TP2, one rank, TP2 ×
// PP2 or DP4 (ZeRO-1) and resumed at another for 3 more, against the uninterrupted run at the
// resuming layout (the same global batch of 16 sequences a step on both sides).
//   8-bit AdamW: blocks of 64 over tensors of ≥ 64 elements, so nearly every tensor is
//     quantized on both sides and no share's block lines up with a whole tensor's; every block
//     is dequantized and requantized. Losses within 1e-3 relative (the bound of
//     ResumeTest.ReshardsEightBitAdamWStatesWithinOneQuantizationStep, for the same reason: the
//     two layouts quantize different blocks, so the moments differ by one quantization step,
//     ~1% of a value, entering the update scaled by lr), weights within 2e-3 (measured 0.7e-3
//     to 1.1e-3 here); m halved on load moves the weights by 4.7e-3 and fails both.
//   Adafactor (beta1 0.9): the shares' factored statistics are the logical matrix's, joined
//     and sliced bit for bit, and m per element: only the layouts' reduction order differs, so
//     the f32 bounds of CheckpointsReshardBetweenTwoByTwoAndFourReplicas (1e-6 per loss, 1e-4
//     per weight; measured 1.2e-7 for Llama, 7.8e-6 for GPT-2's relative step). A column
//     statistic read at the share's own column index fails the Llama cases into TP2 (4.6e-3),
//     a row statistic at its own row index the cases out of TP2.
TEST_F(TensorPipelineTrainingTest, EightBitAdamWAndAdafactorStatesReshardAcrossLayouts) {
  struct Layout {
    int tp, pp, dp, micro_batch;
  };
  constexpr Layout kOne{1, 1, 1, 4}, kTp2{2, 1, 1, 4}, kTp2Pp2{2, 2, 1, 4}, kDp4{1, 1, 4, 1};
  struct Case {
    zerotrain::OptimizerConfig::Type optimizer;
    bool llama;
    Layout from, to;
  };
  using Opt = zerotrain::OptimizerConfig;
  const Case cases[] = {
      {Opt::ADAMW_8BIT, true, kTp2, kOne},     {Opt::ADAMW_8BIT, false, kOne, kTp2},
      {Opt::ADAMW_8BIT, false, kTp2Pp2, kDp4}, {Opt::ADAMW_8BIT, true, kTp2Pp2, kDp4},
      {Opt::ADAMW_8BIT, true, kDp4, kTp2Pp2},  {Opt::ADAFACTOR, true, kTp2, kOne},
      {Opt::ADAFACTOR, true, kOne, kTp2},      {Opt::ADAFACTOR, false, kOne, kTp2},
      {Opt::ADAFACTOR, false, kTp2Pp2, kDp4},  {Opt::ADAFACTOR, true, kDp4, kTp2Pp2},
  };
  int n = 0;
  for (const Case& c : cases) {
    const auto job = [&](const Layout& l) {
      JobSpec j = Model(c.llama, l.tp, l.pp, l.dp, 1, l.micro_batch);
      j.mutable_optimizer()->set_type(c.optimizer);
      if (c.optimizer == Opt::ADAMW_8BIT) {
        j.mutable_optimizer()->set_min_quantized_numel(64);
        j.mutable_optimizer()->set_quant_block_size(64);
      } else {
        j.mutable_optimizer()->mutable_adafactor()->set_beta1(0.9f);
        // Llama: an absolute step of 1e-2 (Hugging Face's fine-tuning setting), so a wrong
        // statistic moves the weights well past the bound. GPT-2: the relative step, since its
        // K bias has a gradient of zero up to reduction noise, which Adafactor's normalized
        // step would carry at full size (AdafactorOnTwoRanksMatchesOneRank).
        if (c.llama) {
          j.mutable_optimizer()->mutable_adafactor()->set_scale_parameter(false);
          j.mutable_optimizer()->mutable_adafactor()->set_relative_step(false);
          j.mutable_optimizer()->set_lr(1e-2f);
        }
      }
      j.mutable_train()->set_max_steps(6);
      return j;
    };
    const auto name = [](const Layout& l) {
      return absl::StrCat("tp", l.tp, " pp", l.pp, " dp", l.dp);
    };
    const bool adam8 = c.optimizer == Opt::ADAMW_8BIT;
    const std::string what =
        absl::StrCat(adam8 ? "8-bit adamw " : "adafactor ", c.llama ? "llama " : "gpt2 ",
                     name(c.from), " -> ", name(c.to));
    const std::string dir = (dir_ / absl::StrCat("states-", n++)).string();
    const PipelineOutcome whole = RunRanks(job(c.to), 6);
    ASSERT_TRUE(whole.status.ok()) << what << ": " << whole.status;
    JobSpec from = job(c.from);
    from.mutable_checkpoint()->set_interval_steps(3);
    from.mutable_checkpoint()->set_dir(dir);
    ASSERT_TRUE(RunRanks(from, 3).status.ok()) << what;
    JobSpec to = job(c.to);
    to.mutable_checkpoint()->set_interval_steps(3);
    to.mutable_checkpoint()->set_dir(dir);
    const PipelineOutcome resumed = RunRanks(to, 6, dir);
    ASSERT_TRUE(resumed.status.ok()) << what << ": " << resumed.status;
    for (const testing::PipelineRankRun& r : resumed.ranks) {
      ASSERT_EQ(r.losses.size(), 3u) << what;
      for (int s = 0; s < 3; ++s) {
        const double want = whole.ranks[0].losses[3 + s];
        EXPECT_NEAR(r.losses[s], want, (adam8 ? 1e-3 : 1e-6) * want) << what << ", step " << 4 + s;
      }
    }
    EXPECT_LT(WorstWholeWeight(resumed, whole), adam8 ? 2e-3 : 1e-4) << what << ": weights";
  }
}

// `zt export` of a TP2 × PP2 × DP2 checkpoint joins each unit from the rank files of its stage's
// TP group: model.init_from's reading of it is every rank's shares bit for bit (elements are
// placed, not computed), the exported Hugging Face file holds those weights, and they are the
// one-rank run's export to the training noise (ExpectSamePipelineTraining's 1e-4 a weight).
TEST_F(TensorPipelineTrainingTest, ExportOfTwoByTwoIsTheOneRankExport) {
  for (const bool llama : {false, true}) {
    const std::string name = llama ? "llama" : "gpt2";
    auto trained = [&](JobSpec job, const std::string& tag) {
      job.mutable_train()->set_max_steps(4);
      job.mutable_checkpoint()->set_interval_steps(4);
      job.mutable_checkpoint()->set_dir((dir_ / (name + tag)).string());
      return RunRanks(job, 4);
    };
    const PipelineOutcome tp_pp = trained(Model(llama, 2, 2, 2, 1, 1), "-tp-pp");
    const PipelineOutcome one = trained(Model(llama, 1, 1, 1, 0, 2), "-one");
    ASSERT_TRUE(tp_pp.status.ok()) << tp_pp.status;
    ASSERT_TRUE(one.status.ok()) << one.status;
    const zerotrain::ModelConfig& model = tp_pp.job.model();
    const ModelLayout whole = BuildModelLayout(model);
    // The whole model read from a checkpoint, or imported from an export of it.
    auto read = [&](const std::string& from,
                    bool exported) -> absl::StatusOr<std::vector<std::vector<float>>> {
      std::vector<std::vector<float>> values(whole.units.size());
      std::vector<float*> units;
      for (size_t u = 0; u < whole.units.size(); ++u) {
        values[u].assign(whole.units[u].numel, std::nanf(""));
        units.push_back(values[u].data());
      }
      if (!exported) {
        ZT_RETURN_IF_ERROR(ReadCheckpointWeights(from, model, units));
        return values;
      }
      const std::string out = from + "-export";
      ZT_RETURN_IF_ERROR(ExportCheckpoint(from, out, {}).status());
      ZT_RETURN_IF_ERROR(ImportHuggingFace(out, model, whole, units));
      return values;
    };
    const std::string tp_pp_dir = tp_pp.job.checkpoint().dir();
    absl::StatusOr<std::vector<std::vector<float>>> joined = read(tp_pp_dir, false);
    ASSERT_TRUE(joined.ok()) << joined.status();
    // Every rank's shares are the joined model's slices, bit for bit.
    for (const testing::PipelineRankRun& r : tp_pp.ranks) {
      for (size_t local = 0; local < r.params.size(); ++local) {
        for (const ParamSpec& p : r.layout.units[local].params) {
          const int u = r.held_units[local];
          const ParamSpec* w = whole.units[u].Find(p.name);
          const int wu = w != nullptr ? u : 0;  // a head stage's copy of the tied wte
          if (w == nullptr) w = whole.units[0].Find("wte");
          std::vector<float> expected(p.numel);
          ExtractSlice(SliceOf(model, w->name, w->shape, 2, r.tp_rank),
                       joined->at(wu).data() + w->offset, expected.data());
          EXPECT_TRUE(
              std::equal(expected.begin(), expected.end(), r.params[local].begin() + p.offset))
              << name << " " << whole.units[u].name << "." << p.name << " tp rank " << r.tp_rank;
        }
      }
    }
    // `zt train --export` (FullWeights: the stages' units joined over the pipeline group, each
    // from its TP shares) is `zt export` of the same step's checkpoint, bit for bit, on every
    // rank.
    for (const testing::PipelineRankRun& r : tp_pp.ranks) {
      EXPECT_TRUE(r.whole == *joined) << name << ": zt train --export of TP2 x PP2 x DP2";
    }
    EXPECT_TRUE(one.ranks[0].whole == *read(one.job.checkpoint().dir(), false))
        << name << ": zt train --export of one rank";
    absl::StatusOr<std::vector<std::vector<float>>> exported = read(tp_pp_dir, true);
    ASSERT_TRUE(exported.ok()) << exported.status();
    EXPECT_TRUE(*exported == *joined) << name << ": the export holds the joined weights";
    absl::StatusOr<std::vector<std::vector<float>>> one_export =
        read(one.job.checkpoint().dir(), true);
    ASSERT_TRUE(one_export.ok()) << one_export.status();
    double worst = 0;
    for (size_t u = 0; u < whole.units.size(); ++u) {
      for (size_t i = 0; i < (*exported)[u].size(); ++i) {
        worst = std::max(worst, std::abs(double{(*exported)[u][i]} - (*one_export)[u][i]));
      }
    }
    EXPECT_LT(worst, 1e-4) << name << ": the TP2 x PP2 x DP2 export against the one-rank export";
  }
}

// model.init_from on pipeline stages: each stage reads only its own units (a null buffer for
// the others, which ReadCheckpointWeights and ImportHuggingFace then leave alone) and each rank
// keeps its tensor-parallel share, a head stage's tied copy starting as wte's. From a Hugging
// Face export of trained weights and from a checkpoint of another layout (DP2 ZeRO-1), PP2 and
// TP2 × PP2 train as one rank started from the same source (ExpectSamePipelineTraining's
// bounds).
TEST_F(TensorPipelineTrainingTest, InitFromAWholeModelOrACheckpointMatchesOneRank) {
  for (const bool llama : {false, true}) {
    const std::string name = llama ? "llama" : "gpt2";
    JobSpec first = Model(llama, 1, 1, 2, 1, 2);
    first.mutable_train()->set_max_steps(3);
    first.mutable_checkpoint()->set_interval_steps(3);
    first.mutable_checkpoint()->set_dir((dir_ / (name + "-ckpt")).string());
    ASSERT_TRUE(RunRanks(first, 3).status.ok()) << name;
    const std::string hf = (dir_ / (name + "-hf")).string();
    ASSERT_TRUE(ExportCheckpoint(first.checkpoint().dir(), hf, {}).ok()) << name;

    // A null unit is not read: the others are what a whole read gives.
    const JobSpec validated = ValidatedJob(first).value();
    const ModelLayout whole = BuildModelLayout(validated.model());
    std::vector<std::vector<float>> all(whole.units.size()), some(whole.units.size());
    std::vector<float*> all_units, some_units;
    for (size_t u = 0; u < whole.units.size(); ++u) {
      all[u].assign(whole.units[u].numel, 0.0f);
      all_units.push_back(all[u].data());
      if (u != 1) some[u].assign(whole.units[u].numel, 0.0f);
      some_units.push_back(u != 1 ? some[u].data() : nullptr);
    }
    for (const std::string& source : {first.checkpoint().dir(), hf}) {
      const bool checkpoint = source == first.checkpoint().dir();
      auto read = [&](const std::vector<float*>& units) {
        return checkpoint ? ReadCheckpointWeights(source, validated.model(), units)
                          : ImportHuggingFace(source, validated.model(), whole, units);
      };
      ASSERT_TRUE(read(all_units).ok()) << name << " " << source;
      ASSERT_TRUE(read(some_units).ok()) << name << " " << source;
      for (size_t u = 0; u < whole.units.size(); ++u) {
        if (u != 1) EXPECT_EQ(some[u], all[u]) << name << " " << source << " unit " << u;
      }

      JobSpec one = Model(llama, 1, 1, 1, 0, 1);
      one.mutable_model()->set_init_from(source);
      const PipelineOutcome reference = RunRanks(one, 10);
      ASSERT_TRUE(reference.status.ok()) << reference.status;
      // The start is the trained model, not a fresh one.
      EXPECT_LT(reference.ranks[0].losses[0],
                RunRanks(Model(llama, 1, 1, 1, 0, 1), 1).ranks[0].losses[0])
          << name;
      for (const int tp : {1, 2}) {
        JobSpec job = Model(llama, tp, 2, 1, 0, 1);
        job.mutable_model()->set_init_from(source);
        testing::ExpectSamePipelineTraining(
            RunRanks(job, 10), reference,
            absl::StrCat(name, " tp", tp, " x pp2 from ", checkpoint ? "a checkpoint" : "hf"));
      }
    }
  }
}

}  // namespace
}  // namespace zt
