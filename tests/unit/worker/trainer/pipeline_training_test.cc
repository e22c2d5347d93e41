// Pipeline parallelism in the step loop: p = 2 and 4 stages (threads of this process, Gloo over
// loopback), GPipe and 1F1B over m = 4 micro-batches (train.grad_accum_steps), training GPT-2
// (tied embedding: the last stage's copy of wte, the copies' gradients summed) and Llama (GQA,
// untied) against one rank from the same seed: the same losses and gradient norms over 10
// steps and the same final weights (each stage's units against the one-rank model's, the wte
// copy against wte); interleaved 1F1B (two chunks per stage) beside GPipe and 1F1B at p = 2, 4,
// each against one rank, with every pipelined step's measured bubble reported; PP2 × DP2 under
// ZeRO-1, 2 and 3 against one rank reading the same global batch; a
// pipeline checkpoint resuming bit-identically at its own layout, and exported whole (by
// `zt export` of the checkpoint and by FullWeights, `zt train --export`, alike).
#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/status_macros.h"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "tests/unit/worker/trainer/pipeline_runs.h"
#include "tests/unit/worker/trainer/small_sharded_job.h"
#include "worker/checkpoint/checkpoint_export.h"
#include "worker/comm/store.h"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/memory_plan.h"
#include "worker/plan/parallel_plan.h"
#include "worker/plan/sharding_planner.h"
#include "worker/train/trainer.h"

namespace zt {
namespace {

using zerotrain::JobSpec;
using zerotrain::ParallelConfig;

using RankRun = testing::PipelineRankRun;
using Outcome = testing::PipelineOutcome;

class PipelineTrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TestScratchDir("zt-pp-test");
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), testing::PatternTokens(), 32).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // pp stages × dp replicas, m = 4 micro-batches of `micro_batch` sequences per step.
  JobSpec Gpt2(int pp, int dp, int stage, int micro_batch, ParallelConfig::PipelineSchedule s) {
    JobSpec job = testing::SmallShardedJob((dir_ / "train.bin").string(), pp * dp, stage,
                                           micro_batch, /*accum=*/4);
    job.mutable_parallel()->set_pipeline_parallel(pp);
    job.mutable_parallel()->set_pipeline_schedule(s);
    job.mutable_train()->set_max_steps(10);
    return job;
  }
  JobSpec Llama(int pp, int dp, int stage, int micro_batch, ParallelConfig::PipelineSchedule s) {
    JobSpec job = Gpt2(pp, dp, stage, micro_batch, s);
    testing::MakeSmallGqaLlama(job);
    return job;
  }

  // Every rank to `steps` (Run(), from `resume` when set).
  static Outcome Run(const JobSpec& spec, int steps, const std::string& resume = "") {
    return testing::RunPipelineRanks(spec, steps, resume);
  }

  std::filesystem::path dir_;
};

// Losses, gradient norms and every stage's final weights against one rank's, to fp32
// reduction noise (testing::ExpectSamePipelineTraining says why its bounds are what they are).
void ExpectSameTraining(const Outcome& got, const Outcome& want, const std::string& what) {
  testing::ExpectSamePipelineTraining(got, want, what);
}

constexpr ParallelConfig::PipelineSchedule kSchedules[] = {ParallelConfig::GPIPE,
                                                           ParallelConfig::ONE_F_ONE_B};

TEST_F(PipelineTrainingTest, Gpt2TiedOnTwoAndFourStagesMatchesOneRank) {
  const Outcome reference = Run(Gpt2(1, 1, 0, 1, ParallelConfig::ONE_F_ONE_B), 10);
  for (auto schedule : kSchedules) {
    for (int pp : {2, 4}) {
      ExpectSameTraining(
          Run(Gpt2(pp, 1, 0, 1, schedule), 10), reference,
          absl::StrCat("gpt2 pp ", pp, " ", ParallelConfig::PipelineSchedule_Name(schedule)));
    }
  }
}

TEST_F(PipelineTrainingTest, LlamaUntiedOnTwoAndFourStagesMatchesOneRank) {
  const Outcome reference = Run(Llama(1, 1, 0, 1, ParallelConfig::ONE_F_ONE_B), 10);
  for (auto schedule : kSchedules) {
    for (int pp : {2, 4}) {
      ExpectSameTraining(
          Run(Llama(pp, 1, 0, 1, schedule), 10), reference,
          absl::StrCat("llama pp ", pp, " ", ParallelConfig::PipelineSchedule_Name(schedule)));
    }
  }
}

// Interleaved 1F1B (v = 2 chunks per stage, rank r holding model chunks r and r + p) against
// GPipe, 1F1B and one rank: n_layer 2·p so that each of the p·v chunks holds blocks, m = 4
// micro-batches (a multiple of p, Megatron's rule). Every schedule runs the same ops on the
// same values; only the order of the gradient sums differs (ExpectSameTraining's fp32
// reduction noise), so all three schedules match the one-rank run to the same bounds, and
// hence each other. Every pipelined step reports its measured bubble, the one-rank run none.
TEST_F(PipelineTrainingTest, InterleavedGpipeAndOneFOneBMatchOneRank) {
  for (const bool llama : {false, true}) {
    for (int pp : {2, 4}) {
      auto job = [&](int stages, ParallelConfig::PipelineSchedule schedule) {
        JobSpec j = llama ? Llama(stages, 1, 0, 1, schedule) : Gpt2(stages, 1, 0, 1, schedule);
        j.mutable_model()->set_n_layer(2 * pp);
        if (schedule == ParallelConfig::INTERLEAVED) j.mutable_parallel()->set_virtual_stages(2);
        return j;
      };
      const Outcome reference = Run(job(1, ParallelConfig::ONE_F_ONE_B), 10);
      ASSERT_TRUE(reference.status.ok()) << reference.status;
      for (const auto& b : reference.ranks[0].bubbles) EXPECT_FALSE(b.has_value());
      for (auto schedule :
           {ParallelConfig::GPIPE, ParallelConfig::ONE_F_ONE_B, ParallelConfig::INTERLEAVED}) {
        const std::string what = absl::StrCat(llama ? "llama" : "gpt2", " pp ", pp, " ",
                                              ParallelConfig::PipelineSchedule_Name(schedule));
        const Outcome got = Run(job(pp, schedule), 10);
        ExpectSameTraining(got, reference, what);
        if (!got.status.ok()) continue;
        for (const RankRun& r : got.ranks) {
          if (schedule == ParallelConfig::INTERLEAVED) {
            EXPECT_TRUE(r.held_units.size() >= 2 && r.held_units.back() - r.held_units.front() >=
                                                        static_cast<int>(r.held_units.size()))
                << what << ": a stage holds two chunks apart";
          }
          for (const auto& b : r.bubbles) {
            ASSERT_TRUE(b.has_value()) << what;
            EXPECT_GE(*b, 0.0) << what;
            EXPECT_LT(*b, 1.0) << what;
          }
        }
      }
    }
  }
}

TEST_F(PipelineTrainingTest, TwoStagesByTwoReplicasAtZeroOneTwoAndThreeMatchOneRank) {
  // PP2 × DP2, ZeRO-1, 2 and 3 in each stage's data-parallel group (at stages 2–3 each stage
  // accumulates its micro-batches into full buffers, reduce-scattered once after the
  // schedule; at 3 its units are gathered from the shards at the step's start); the two
  // replicas' micro-batches k are the global batch's sequences 2k and 2k + 1, which one rank
  // reads as micro-batch k of 2. ZeRO-2 and ZeRO-3 also under INTERLEAVED.
  struct Case {
    bool llama;
    int zero;
    ParallelConfig::PipelineSchedule schedule;
  };
  for (const Case& c :
       {Case{false, 1, ParallelConfig::ONE_F_ONE_B}, Case{true, 1, ParallelConfig::ONE_F_ONE_B},
        Case{false, 2, ParallelConfig::ONE_F_ONE_B}, Case{true, 2, ParallelConfig::ONE_F_ONE_B},
        Case{false, 2, ParallelConfig::INTERLEAVED}, Case{false, 3, ParallelConfig::ONE_F_ONE_B},
        Case{true, 3, ParallelConfig::INTERLEAVED}}) {
    JobSpec job = c.llama ? Llama(2, 2, c.zero, 1, c.schedule) : Gpt2(2, 2, c.zero, 1, c.schedule);
    // ZeRO-3 stages keep their units gathered for the step (FSDP's reshard_after_forward
    // false); the shards are what the optimizer steps and checkpoints hold.
    if (c.zero == 3) job.mutable_parallel()->set_reshard_after_forward(false);
    JobSpec one = c.llama ? Llama(1, 1, 0, 2, ParallelConfig::ONE_F_ONE_B)
                          : Gpt2(1, 1, 0, 2, ParallelConfig::ONE_F_ONE_B);
    if (c.schedule == ParallelConfig::INTERLEAVED) {
      // Four chunks of blocks: n_layer 4 on both sides.
      job.mutable_parallel()->set_virtual_stages(2);
      job.mutable_model()->set_n_layer(4);
      one.mutable_model()->set_n_layer(4);
    }
    const Outcome reference = Run(one, 10);
    const std::string what = absl::StrCat(c.llama ? "llama" : "gpt2", " pp2 x dp2 zero-", c.zero,
                                          " ", ParallelConfig::PipelineSchedule_Name(c.schedule));
    Outcome got = Run(job, 10);
    if (c.zero == 3 && got.status.ok()) {
      // Each rank's parameters are its shard: DP member k holds elements
      // [k·s, (k + 1)·s) of the padded unit, so a stage's two shards joined are the unit.
      ASSERT_EQ(got.ranks.size(), 4u);
      for (int first : {0, 2}) {
        std::vector<std::vector<float>> joined = got.ranks[first].params;
        for (size_t u = 0; u < joined.size(); ++u) {
          const std::vector<float>& second = got.ranks[first + 1].params[u];
          joined[u].insert(joined[u].end(), second.begin(), second.end());
        }
        got.ranks[first].params = joined;
        got.ranks[first + 1].params = joined;
      }
    }
    ExpectSameTraining(got, reference, what);
    // Rank order: data-parallel inside pipeline, so ranks 0 and 1 are stage 0's replicas.
    ASSERT_EQ(got.ranks.size(), 4u);
    EXPECT_EQ(got.ranks[0].params, got.ranks[1].params) << what;
    EXPECT_EQ(got.ranks[2].params, got.ranks[3].params) << what;
  }
}

// Two chunks a rank (n_layer 4: six units), where a one-rank job keeps the same model.
JobSpec Interleaved(JobSpec job) {
  job.mutable_model()->set_n_layer(4);
  if (job.parallel().pipeline_schedule() == ParallelConfig::INTERLEAVED) {
    job.mutable_parallel()->set_virtual_stages(2);
  }
  return job;
}

// ZeRO-3 stages keep their units gathered for the step (reshard_after_forward false).
JobSpec ZeroThree(JobSpec job) {
  job.mutable_parallel()->set_reshard_after_forward(false);
  return job;
}

// data.val on pipeline stages: a forward-only pass of the validation micro-batches through
// the stages (each data-parallel rank its own), every eval_interval steps and after the last,
// against one rank reading the same batches — under 1F1B and interleaved 1F1B (the first
// stage's second chunk fed by the last stage's first), with tensor-parallel stages and with
// ZeRO-3 stages (their units gathered again after the optimizer stepped the shards). Three
// validation micro-batches: more than a 1F1B stage's in-flight slots, so slots are reused.
TEST_F(PipelineTrainingTest, EvaluationRunsForwardOnlyThroughTheStagesAndMatchesOneRank) {
  auto with_val = [&](JobSpec job) {
    job.mutable_model()->set_n_layer(4);
    job.mutable_data()->add_val((dir_ / "train.bin").string());
    job.mutable_train()->set_eval_interval(5);
    job.mutable_train()->set_eval_steps(3);
    return job;
  };
  struct Case {
    JobSpec job, one;
    std::string what;
  };
  JobSpec tp_pp = Gpt2(2, 1, 0, 1, ParallelConfig::INTERLEAVED);
  tp_pp.mutable_parallel()->set_world_size(4);
  tp_pp.mutable_parallel()->set_tensor_parallel(2);
  tp_pp.mutable_parallel()->set_virtual_stages(2);
  const Case cases[] = {
      {Llama(2, 1, 0, 1, ParallelConfig::ONE_F_ONE_B), Llama(1, 1, 0, 1, ParallelConfig::GPIPE),
       "llama pp2 1F1B"},
      {tp_pp, Gpt2(1, 1, 0, 1, ParallelConfig::GPIPE), "gpt2 tp2 x pp2 interleaved"},
      {ZeroThree(Gpt2(2, 2, 3, 1, ParallelConfig::ONE_F_ONE_B)),
       Gpt2(1, 1, 0, 2, ParallelConfig::GPIPE), "gpt2 pp2 x dp2 zero-3 1F1B"},
  };
  for (const Case& c : cases) {
    const Outcome reference = Run(with_val(c.one), 10);
    ASSERT_TRUE(reference.status.ok()) << c.what << ": " << reference.status;
    ASSERT_EQ(reference.ranks[0].val_losses.size(), 2u) << c.what;  // steps 5 and 10
    Outcome got = Run(with_val(c.job), 10);
    if (c.job.parallel().zero_stage() == 3 && got.status.ok()) {
      // Each stage's two DP shards joined are its units (as in the ZeRO-3 case above).
      testing::JoinDataParallelShards(got);
    }
    ExpectSameTraining(got, reference, c.what);
  }
}

// At its own layout a pipeline checkpoint resumes bit for bit: PP2 at ZeRO-1, and PP2 × DP2
// at ZeRO-2 (1F1B) and ZeRO-3 (interleaved with the units kept gathered for the step, and
// interleaved and 1F1B gathering them per use), whose shards are what the files hold.
// A step's comm_bytes count the stage links: stage 0 sends each micro-batch's activations
// (B·T·C f32) forward, stage 1 each one's gradient back, besides the tied wte's all-reduce
// between them (V·C f32: Gloo's ring on two ranks sends it once) and the step statistics.
TEST_F(PipelineTrainingTest, CommBytesCountTheStageLinks) {
  const JobSpec job = ValidatedJob(Gpt2(2, 1, 0, 2, ParallelConfig::ONE_F_ONE_B)).value();
  const Outcome got = Run(job, 2);
  ASSERT_TRUE(got.status.ok()) << got.status;
  const int64_t m = job.train().grad_accum_steps(), b = job.train().micro_batch_size(),
                t = job.data().seq_len(), c = job.model().d_model(), v = job.model().vocab_size();
  const int64_t links = m * b * t * c * 4, tied = v * c * 4;
  for (const RankRun& r : got.ranks) {
    ASSERT_EQ(r.comm_bytes.size(), 2u);
    for (const int64_t bytes : r.comm_bytes) {
      EXPECT_GE(bytes, links + tied);
      EXPECT_LE(bytes, links + tied + 1024);  // the statistics: a few scalars
    }
  }
}

// zt estimate --plan's comm_bytes_per_step is what the busiest rank sends a step: its stage
// links (2v − 1 micro-batch tensors per micro-batch on the first and last stage, 2v on a middle
// one) and, on the first and last, the tied wte's sum. The planner counted 2·A·B·T·C on every
// layout and left the tied sum out: short at PP2 by the sum, long by a direction.
TEST_F(PipelineTrainingTest, PlannedPipelineBytesAreTheBusiestRanks) {
  struct Case {
    int pp;
    ParallelConfig::PipelineSchedule schedule;
  };
  for (const Case& c : {Case{2, ParallelConfig::ONE_F_ONE_B}, Case{4, ParallelConfig::GPIPE},
                        Case{2, ParallelConfig::INTERLEAVED}}) {
    JobSpec spec = Gpt2(c.pp, 1, 0, 1, c.schedule);
    if (c.schedule == ParallelConfig::INTERLEAVED) {
      spec.mutable_model()->set_n_layer(4);
      spec.mutable_parallel()->set_virtual_stages(2);
    }
    const std::string what =
        absl::StrCat("pp ", c.pp, " ", ParallelConfig::PipelineSchedule_Name(c.schedule));
    const JobSpec job = ValidatedJob(spec).value();
    const Outcome got = Run(job, 2);
    ASSERT_TRUE(got.status.ok()) << what << ": " << got.status;
    int64_t busiest = 0;
    for (const RankRun& r : got.ranks) {
      for (const int64_t bytes : r.comm_bytes) busiest = std::max(busiest, bytes);
    }
    const absl::StatusOr<JobSpec> planning = JobForPlanning(job, {.check_paths = false});
    ASSERT_TRUE(planning.ok()) << what << ": " << planning.status();
    const absl::StatusOr<zerotrain::ShardingPlan> plan = PlanSharding(
        *planning, {.device_memory_bytes = int64_t{1} << 40, .layouts = LayoutSearch::kJob});
    ASSERT_TRUE(plan.ok()) << what << ": " << plan.status();
    int found = 0;
    for (const zerotrain::PlanCandidate& cand : plan->candidates()) {
      if (cand.pipeline_parallel() != c.pp || cand.zero_stage() != 0) continue;
      ++found;
      // The engine's step adds the step statistics, a few f32 scalars.
      EXPECT_GE(busiest, cand.comm_bytes_per_step()) << what;
      EXPECT_LE(busiest, cand.comm_bytes_per_step() + 1024) << what;
    }
    EXPECT_GT(found, 0) << what << ": no candidate of the job's layout";
  }
}

// With 16-bit gradients Gloo sums the tied wte's two copies in f32 conversion buffers
// ("comm.convert.tied.0/1"). They hold one piece of parallel.bucket_bytes, not the whole
// share (two 0.30 GiB buffers a tied stage for GPT-2 1.5B before), and the engine sums the
// share piece by piece: a sum of two is the same in any order, so the pieces change no bit.
// An engine that summed the share whole would be refused by the communicator (more elements
// than its conversion buffer) and the run fails.
TEST_F(PipelineTrainingTest, Bf16TiedSumRunsInPiecesThePlanSizes) {
  JobSpec whole = Gpt2(2, 1, 0, 1, ParallelConfig::ONE_F_ONE_B);
  zerotrain::PrecisionConfig* precision = whole.mutable_precision();
  precision->set_param_dtype(zerotrain::PrecisionConfig::BF16);
  precision->set_compute_dtype(zerotrain::PrecisionConfig::BF16);
  precision->set_grad_dtype(zerotrain::PrecisionConfig::BF16);
  whole.mutable_train()->set_max_steps(3);
  whole.mutable_parallel()->set_bucket_bytes(0);  // one piece: the whole share
  JobSpec pieces = whole;
  const int64_t share = int64_t{whole.model().vocab_size()} * whole.model().d_model();
  // Not a divisor of the share, so the last piece is short.
  const int64_t piece = share / 3 + 5;
  pieces.mutable_parallel()->set_bucket_bytes(piece * 2);
  for (const auto& [spec, expected] : {std::pair{whole, share}, std::pair{pieces, piece}}) {
    const JobSpec job = ValidatedJob(spec).value();
    for (int r = 0; r < 2; ++r) {
      const MemoryPlan plan = PlanMemory(job, ParallelLayout::ForJob(job, r));
      int found = 0;
      for (const BufferSpec& b : plan.buffers) {
        if (!b.name.starts_with("comm.convert.tied.")) continue;
        ++found;
        EXPECT_EQ(b.numel(), expected) << b.name << " rank " << r;
        EXPECT_EQ(b.dtype, DType::kF32) << b.name;
      }
      EXPECT_EQ(found, 2) << "rank " << r << ": comm.convert.tied.0/1";
    }
  }
  const Outcome a = Run(whole, 3), b = Run(pieces, 3);
  ASSERT_TRUE(a.status.ok()) << a.status;
  ASSERT_TRUE(b.status.ok()) << b.status;
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(b.ranks[r].losses, a.ranks[r].losses) << "rank " << r;
    EXPECT_EQ(b.ranks[r].grad_norms, a.ranks[r].grad_norms) << "rank " << r;
    EXPECT_EQ(b.ranks[r].whole, a.ranks[r].whole) << "rank " << r;
    EXPECT_EQ(b.ranks[r].comm_bytes, a.ranks[r].comm_bytes) << "rank " << r;
    EXPECT_TRUE(b.ranks[r].off_plan.empty()) << "rank " << r << ": " << b.ranks[r].off_plan.front();
  }
}

// The gradients a chunk sends back to the previous stage go from copies in the plan's
// "comm.pipeline.grad_send.<c>" (communication), one per micro-batch slot in flight: before,
// they were host vectors outside the plan, so a pipeline rank's memory exceeded its plan by
// them. Each rank's plan holds one for every chunk that does not hold the embedding, of
// [in_flight, "grad.residual"] in its dtype, and no other; the run claims them (a buffer the
// trainer did not take from the arena stays unclaimed) and every arena equals its plan (a copy
// kept outside the arena leaves the communication arena short of the plan); the trainer
// refuses a plan whose buffer is not that size. GPipe (m in flight), 1F1B (p − s), interleaved
// (two chunks a stage, the first stage's second one sending too), in f32 and bf16.
TEST_F(PipelineTrainingTest, GradientSendsUseThePlansCommunicationBuffers) {
  struct Case {
    ParallelConfig::PipelineSchedule schedule;
    int pp;
    bool bf16 = false;
  };
  for (const Case& c : {Case{ParallelConfig::GPIPE, 2}, Case{ParallelConfig::ONE_F_ONE_B, 4},
                        Case{ParallelConfig::INTERLEAVED, 2},
                        Case{ParallelConfig::ONE_F_ONE_B, 2, true}}) {
    JobSpec spec = Gpt2(c.pp, 1, 0, 1, c.schedule);
    if (c.schedule == ParallelConfig::INTERLEAVED) {
      spec.mutable_model()->set_n_layer(4);
      spec.mutable_parallel()->set_virtual_stages(2);
    }
    if (c.bf16) {
      spec.mutable_precision()->set_param_dtype(zerotrain::PrecisionConfig::BF16);
      spec.mutable_precision()->set_compute_dtype(zerotrain::PrecisionConfig::BF16);
    }
    const std::string what = absl::StrCat("pp ", c.pp, " ",
                                          ParallelConfig::PipelineSchedule_Name(c.schedule),
                                          c.bf16 ? " bf16" : "");
    const JobSpec job = ValidatedJob(spec).value();
    int sending_chunks = 0;
    for (int r = 0; r < c.pp; ++r) {
      const ParallelLayout layout = ParallelLayout::ForJob(job, r);
      const MemoryPlan plan = PlanMemory(job, layout);
      const BufferSpec* residual = nullptr;
      std::vector<const BufferSpec*> sends;
      for (const BufferSpec& b : plan.buffers) {
        if (b.name == "grad.residual") residual = &b;
        if (b.name.starts_with("comm.pipeline.grad_send.")) sends.push_back(&b);
      }
      ASSERT_NE(residual, nullptr) << what << " rank " << r;
      const std::vector<PipelineChunk> chunks = PipelineChunksOf(job, layout);
      size_t k = 0;
      for (size_t ch = 0; ch < chunks.size(); ++ch) {
        if (chunks[ch].first == 0) continue;  // holds the embedding: sends no gradient
        ASSERT_LT(k, sends.size()) << what << " rank " << r << " chunk " << ch;
        const BufferSpec& b = *sends[k++];
        EXPECT_EQ(b.name, PipelineGradSendBuffer(static_cast<int>(ch))) << what;
        EXPECT_EQ(b.category, MemoryCategory::kCommunication) << what << " " << b.name;
        EXPECT_EQ(b.dtype, residual->dtype) << what << " " << b.name;
        EXPECT_EQ(b.shape, (std::vector<int64_t>{chunks[ch].in_flight, residual->numel()}))
            << what << " rank " << r << " " << b.name;
        ++sending_chunks;
      }
      EXPECT_EQ(k, sends.size()) << what << " rank " << r << ": a send buffer of no chunk";
    }
    EXPECT_EQ(sending_chunks, c.pp * (c.schedule == ParallelConfig::INTERLEAVED ? 2 : 1) - 1)
        << what;
    const Outcome got = Run(job, 2);
    ASSERT_TRUE(got.status.ok()) << what << ": " << got.status;
    for (size_t r = 0; r < got.ranks.size(); ++r) {
      EXPECT_TRUE(got.ranks[r].unclaimed.empty())
          << what << " rank " << r << ": unused plan buffer " << got.ranks[r].unclaimed.front();
      EXPECT_TRUE(got.ranks[r].off_plan.empty())
          << what << " rank " << r << ": " << got.ranks[r].off_plan.front();
    }
  }
}

TEST_F(PipelineTrainingTest, CheckpointResumesBitIdenticallyAtItsOwnLayout) {
  const JobSpec layouts[] = {
      Gpt2(2, 1, 1, 1, ParallelConfig::ONE_F_ONE_B),
      Gpt2(2, 2, 2, 1, ParallelConfig::ONE_F_ONE_B),
      ZeroThree(Interleaved(Llama(2, 2, 3, 1, ParallelConfig::INTERLEAVED))),
      // ZeRO-3 stages gathering each unit per use (reshard_after_forward, the default).
      Interleaved(Llama(2, 2, 3, 1, ParallelConfig::INTERLEAVED)),
      Gpt2(2, 2, 3, 1, ParallelConfig::ONE_F_ONE_B),
  };
  for (JobSpec job : layouts) {
    const std::string what = absl::StrCat("pp2 x dp", job.parallel().world_size() / 2, " zero-",
                                          job.parallel().zero_stage());
    job.mutable_train()->set_max_steps(6);
    job.mutable_checkpoint()->set_interval_steps(3);
    JobSpec straight = job;
    straight.mutable_checkpoint()->set_dir((dir_ / "straight").string());
    const Outcome whole = Run(straight, 6);
    ASSERT_TRUE(whole.status.ok()) << what << ": " << whole.status;

    job.mutable_checkpoint()->set_dir((dir_ / "interrupted").string());
    const Outcome first = Run(job, 3);
    ASSERT_TRUE(first.status.ok()) << what << ": " << first.status;
    const Outcome second = Run(job, 6, job.checkpoint().dir());
    ASSERT_TRUE(second.status.ok()) << what << ": " << second.status;
    for (size_t r = 0; r < second.ranks.size(); ++r) {
      ASSERT_EQ(second.ranks[r].losses.size(), 3u) << what;
      for (int s = 0; s < 3; ++s) {
        EXPECT_EQ(second.ranks[r].losses[s], whole.ranks[r].losses[3 + s])
            << what << ", step " << 4 + s;
      }
      EXPECT_EQ(second.ranks[r].params, whole.ranks[r].params) << what << ", rank " << r;
    }
    std::filesystem::remove_all(dir_ / "straight");
    std::filesystem::remove_all(dir_ / "interrupted");
  }
}

// A checkpoint written at one pipeline layout resumes at another (each buffer rebuilt from the
// stages' rank files, the head stage's copy of a tied wte from the embedding's): steps 4–6
// after the switch are the uninterrupted run's at the first layout, to the reduction-order
// noise of another layout (the bound of ExpectSameTraining's losses, with room for three
// steps at the new layout).
TEST_F(PipelineTrainingTest, CheckpointsReshardAcrossPipelineLayouts) {
  struct Case {
    JobSpec from, to;
    std::string what;
  };
  // The same global batch each side: stages × replicas × micro-batch × 4 micro-batches.
  const Case cases[] = {
      {Gpt2(2, 1, 1, 2, ParallelConfig::ONE_F_ONE_B), Gpt2(1, 1, 1, 2, ParallelConfig::GPIPE),
       "gpt2 pp2 -> one rank (the tied copy dropped)"},
      {Gpt2(1, 1, 1, 2, ParallelConfig::GPIPE), Gpt2(2, 1, 1, 2, ParallelConfig::ONE_F_ONE_B),
       "gpt2 one rank -> pp2 (the tied copy made)"},
      {Llama(2, 1, 1, 2, ParallelConfig::ONE_F_ONE_B), Llama(1, 2, 1, 1, ParallelConfig::GPIPE),
       "llama pp2 -> dp2 zero-1"},
      {Interleaved(Gpt2(2, 1, 1, 2, ParallelConfig::INTERLEAVED)),
       Interleaved(Gpt2(1, 1, 1, 2, ParallelConfig::GPIPE)),
       "gpt2 pp2 interleaved (chunks 0+2 | 1+3) -> one rank"},
      {Interleaved(Llama(1, 1, 1, 2, ParallelConfig::GPIPE)),
       ZeroThree(Interleaved(Llama(2, 2, 3, 1, ParallelConfig::INTERLEAVED))),
       "llama one rank -> pp2 x dp2 zero-3 interleaved"},
  };
  for (const Case& c : cases) {
    JobSpec from = c.from, to = c.to;
    from.mutable_train()->set_max_steps(6);
    from.mutable_checkpoint()->set_interval_steps(3);
    JobSpec straight = from;
    straight.mutable_checkpoint()->set_dir((dir_ / "straight").string());
    const Outcome whole = Run(straight, 6);
    ASSERT_TRUE(whole.status.ok()) << c.what << ": " << whole.status;
    from.mutable_checkpoint()->set_dir((dir_ / "switch").string());
    const Outcome first = Run(from, 3);
    ASSERT_TRUE(first.status.ok()) << c.what << ": " << first.status;
    to.mutable_train()->set_max_steps(6);
    to.mutable_checkpoint()->set_interval_steps(3);
    to.mutable_checkpoint()->set_dir(from.checkpoint().dir());
    const Outcome second = Run(to, 6, from.checkpoint().dir());
    ASSERT_TRUE(second.status.ok()) << c.what << ": " << second.status;
    for (const RankRun& r : second.ranks) {
      ASSERT_EQ(r.losses.size(), 3u) << c.what;
      for (int s = 0; s < 3; ++s) {
        const double want = whole.ranks[0].losses[3 + s];
        EXPECT_NEAR(r.losses[s], want, 1e-5 * want) << c.what << ", step " << 4 + s;
      }
    }
    std::filesystem::remove_all(dir_ / "straight");
    std::filesystem::remove_all(dir_ / "switch");
  }
}

// `zt export` and model.init_from read a pipeline-parallel checkpoint as the whole model: each
// unit from the rank files of its stage (and, for GPT-2's tied embedding, not from the head
// stage's copy). The weights read are every stage's own, bit for bit, and the head stage's copy
// of wte is the embedding's.
TEST_F(PipelineTrainingTest, CheckpointExportsAndInitsTheWholeModel) {
  for (const bool llama : {false, true}) {
    JobSpec job = llama ? Llama(2, 2, 1, 1, ParallelConfig::ONE_F_ONE_B)
                        : Gpt2(2, 2, 1, 1, ParallelConfig::GPIPE);
    job.mutable_train()->set_max_steps(4);
    job.mutable_checkpoint()->set_interval_steps(4);
    job.mutable_checkpoint()->set_dir((dir_ / (llama ? "llama" : "gpt2")).string());
    const Outcome trained = Run(job, 4);
    ASSERT_TRUE(trained.status.ok()) << trained.status;
    job = ValidatedJob(job).value();  // the model's defaults (d_ff) filled in
    const ModelLayout whole = BuildModelLayout(job.model());
    std::vector<std::vector<float>> read(whole.units.size());
    std::vector<float*> units;
    for (size_t u = 0; u < whole.units.size(); ++u) {
      read[u].assign(whole.units[u].numel, std::nanf(""));
      units.push_back(read[u].data());
    }
    const absl::Status read_status =
        ReadCheckpointWeights(job.checkpoint().dir(), job.model(), units);
    ASSERT_TRUE(read_status.ok()) << read_status;
    // `zt train --export` of the pipeline (FullWeights: each unit from its stage, the head
    // stage's copy of wte left out) is `zt export` of its checkpoint, bit for bit, on every rank.
    for (const RankRun& rank : trained.ranks) {
      EXPECT_TRUE(rank.whole == read) << (llama ? "llama" : "gpt2") << ": zt train --export";
    }
    int compared = 0;
    for (const RankRun& rank : trained.ranks) {
      for (size_t k = 0; k < rank.layout.units.size(); ++k) {
        const UnitLayout& mine = rank.layout.units[k];
        const auto at = std::find_if(whole.units.begin(), whole.units.end(),
                                     [&](const UnitLayout& w) { return w.name == mine.name; });
        ASSERT_NE(at, whole.units.end()) << mine.name;
        const std::vector<float>& want = read[at - whole.units.begin()];
        const std::vector<float>& got = rank.params[k];
        ASSERT_GE(got.size(), want.size()) << mine.name;
        EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin())) << mine.name;
        if (const ParamSpec* copy = mine.Find("lm_head.weight");
            copy != nullptr && at->Find("lm_head.weight") == nullptr) {
          // The tied head's copy of wte on the last stage.
          const ParamSpec& wte = *whole.embedding().Find("wte");
          EXPECT_TRUE(std::equal(got.begin() + copy->offset,
                                 got.begin() + copy->offset + copy->numel,
                                 read[0].begin() + wte.offset))
              << "the head stage's copy of wte";
          ++compared;
        }
        ++compared;
      }
    }
    EXPECT_EQ(compared,
              static_cast<int>(trained.ranks.size() / 2 * whole.units.size()) + (llama ? 0 : 2));
    absl::StatusOr<CheckpointExportResult> exported = ExportCheckpoint(
        job.checkpoint().dir(), (dir_ / (llama ? "llama-export" : "gpt2-export")).string(), {});
    ASSERT_TRUE(exported.ok()) << exported.status();
    EXPECT_EQ(exported->step, 4);
  }
}

}  // namespace
}  // namespace zt
