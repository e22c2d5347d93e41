// Tests of worker/plan/parallel_plan.h and of PlanMemory under tensor, sequence and pipeline
// parallelism, against figures computed by hand from the header's rules.
#include "worker/plan/parallel_plan.h"
#include "worker/plan/pipeline_schedule.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/job/job_defaults.h"
#include "worker/job/job_validation.h"
#include "worker/model/activation_table.h"
#include "worker/plan/memory_plan.h"

namespace zt {
namespace {

using ::testing::ElementsAre;
using zerotrain::JobSpec;
using zerotrain::ParallelConfig;

// GPT-2 family: C 64, H 4 (D 16), F 256, V 256, P 64, 4 blocks; B 2, T 32 (B·T 64), f32.
JobSpec Gpt2(int world, int tp, int pp) {
  JobSpec job;
  auto* m = job.mutable_model();
  m->set_family(zerotrain::ModelConfig::GPT2);
  m->set_n_layer(4);
  m->set_n_head(4);
  m->set_d_model(64);
  m->set_vocab_size(256);
  m->set_max_seq_len(64);
  job.set_name("plan");
  job.mutable_data()->add_train("train.bin");
  job.mutable_data()->set_seq_len(32);
  job.mutable_train()->set_micro_batch_size(2);
  job.mutable_train()->set_max_steps(1);
  job.mutable_optimizer()->set_lr(1e-3f);
  job.mutable_resources()->set_cpu_threads(1);
  job.mutable_parallel()->set_world_size(world);
  job.mutable_parallel()->set_tensor_parallel(tp);
  job.mutable_parallel()->set_pipeline_parallel(pp);
  return job;
}

JobSpec Completed(JobSpec job) {
  ApplyJobDefaults(&job);
  EXPECT_TRUE(ValidateJobSpec(job).ok()) << ValidateJobSpec(job);
  return job;
}

int64_t BytesWithPrefix(const std::vector<BufferSpec>& buffers, const std::string& prefix) {
  int64_t total = 0;
  for (const BufferSpec& b : buffers) {
    if (absl::StartsWith(b.name, prefix)) total += b.bytes();
  }
  return total;
}

const BufferSpec* Find(const std::vector<BufferSpec>& buffers, const std::string& name) {
  for (const BufferSpec& b : buffers) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

TEST(TensorParallelLayoutTest, SplitsHeadsAndMlpAndReplicatesNormsAndRowBiases) {
  const JobSpec job = Completed(Gpt2(2, 2, 1));
  const ModelLayout whole = BuildModelLayout(job.model());
  const ModelLayout half = TensorParallelModelLayout(job.model(), 2);
  // wte (256/2, 64) + wpe (64, 64) replicated.
  EXPECT_EQ(half.embedding().numel, 128 * 64 + 64 * 64);
  // Block: ln1 2·64; qkv (2 + 2·2 heads)·16 = 96 rows of 64, bias 96; proj (64, 32), bias 64;
  // ln2 2·64; fc (128, 64), bias 128; proj (64, 128), bias 64.
  EXPECT_EQ(half.block(0).numel,
            128 + 96 * 64 + 96 + 64 * 32 + 64 + 128 + 128 * 64 + 128 + 64 * 128 + 64);
  EXPECT_EQ(half.block(0).numel, 25184);
  // What is replicated (norms 256, the row-parallel biases 128) stays whole; the rest halves.
  EXPECT_EQ(half.block(0).numel, 384 + (whole.block(0).numel - 384) / 2);
  EXPECT_EQ(half.head().numel, whole.head().numel);  // tied: ln_f only
  // Offsets pack each unit's tensors back to back again.
  const ParamSpec* proj = half.block(0).Find("attn.proj.weight");
  ASSERT_NE(proj, nullptr);
  EXPECT_THAT(proj->shape, ElementsAre(64, 32));
  EXPECT_EQ(proj->offset, 128 + 96 * 64 + 96);
}

TEST(TensorParallelLayoutTest, GroupedKvHeadsAreSplitOrReplicated) {
  JobSpec job = Gpt2(8, 1, 1);
  auto* m = job.mutable_model();
  m->set_family(zerotrain::ModelConfig::LLAMA);
  m->set_n_head(8);
  m->set_n_kv_head(2);
  m->set_d_model(256);  // D 32
  m->set_d_ff(768);
  job = Completed(job);
  auto qkv_rows = [&](int tp) {
    return TensorParallelModelLayout(job.model(), tp).block(0).Find("attn.qkv.weight")->shape[0];
  };
  EXPECT_EQ(qkv_rows(1), (8 + 2 * 2) * 32);
  EXPECT_EQ(qkv_rows(2), (4 + 2 * 1) * 32);  // one KV head each: split
  EXPECT_EQ(qkv_rows(4), (2 + 2 * 1) * 32);  // each KV head on 2 ranks: replicated
  EXPECT_EQ(qkv_rows(8), (1 + 2 * 1) * 32);
  // LLAMA's fc holds [gate | up]: 2F rows, split.
  EXPECT_EQ(TensorParallelModelLayout(job.model(), 4).block(0).Find("mlp.fc.weight")->shape[0],
            2 * 768 / 4);
}

// The smallest largest-run sum over every way to cut `costs` into `chunks` non-empty runs.
int64_t BruteForceBest(const std::vector<int64_t>& costs, int chunks) {
  const int n = static_cast<int>(costs.size());
  int64_t best = INT64_MAX;
  for (int mask = 0; mask < (1 << (n - 1)); ++mask) {
    if (__builtin_popcount(mask) != chunks - 1) continue;
    int64_t run = 0, largest = 0;
    for (int u = 0; u < n; ++u) {
      run += costs[u];
      if (u == n - 1 || (mask >> u) & 1) {
        largest = std::max(largest, run);
        run = 0;
      }
    }
    best = std::min(best, largest);
  }
  return best;
}

TEST(BalancedPartitionTest, MatchesTheBestCutAndLeavesNoRunEmpty) {
  EXPECT_THAT(BalancedPartition({5, 1, 1, 1, 1, 5}, 3), ElementsAre(0, 1, 5, 6));
  EXPECT_THAT(BalancedPartition({10, 1, 1}, 3), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(BalancedPartition({1, 1, 1, 1}, 4), ElementsAre(0, 1, 2, 3, 4));
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 10);
    std::vector<int64_t> costs(n);
    for (int64_t& c : costs) c = 1 + static_cast<int64_t>(rng() % 20);
    const int chunks = 1 + static_cast<int>(rng() % n);
    const std::vector<int> starts = BalancedPartition(costs, chunks);
    ASSERT_EQ(static_cast<int>(starts.size()), chunks + 1);
    EXPECT_EQ(starts.front(), 0);
    EXPECT_EQ(starts.back(), n);
    int64_t largest = 0;
    for (int c = 0; c < chunks; ++c) {
      ASSERT_LT(starts[c], starts[c + 1]) << "empty run " << c;
      int64_t sum = 0;
      for (int u = starts[c]; u < starts[c + 1]; ++u) sum += costs[u];
      largest = std::max(largest, sum);
    }
    EXPECT_EQ(largest, BruteForceBest(costs, chunks)) << "trial " << trial;
  }
}

// Every unit on exactly one pipeline rank, in contiguous chunks; interleaved ranks hold every
// pp-th chunk.
TEST(PipelineChunksTest, EveryUnitLivesOnExactlyOneStage) {
  for (const auto& [pp, schedule, v] :
       {std::tuple{2, ParallelConfig::ONE_F_ONE_B, 1}, std::tuple{3, ParallelConfig::GPIPE, 1},
        std::tuple{6, ParallelConfig::ONE_F_ONE_B, 1},
        std::tuple{2, ParallelConfig::INTERLEAVED, 2}}) {
    JobSpec job = Gpt2(pp, 1, pp);
    job.mutable_parallel()->set_pipeline_schedule(schedule);
    job.mutable_parallel()->set_virtual_stages(v);
    job.mutable_parallel()->set_micro_batches(2 * pp);
    job = Completed(job);
    std::map<int, int> owners;
    for (int p = 0; p < pp; ++p) {
      const ParallelLayout place = ParallelLayout::ForJob(job, p);
      const std::vector<PipelineChunk> chunks = PipelineChunksOf(job, place);
      EXPECT_EQ(static_cast<int>(chunks.size()), v);
      for (const PipelineChunk& c : chunks) {
        EXPECT_LT(c.first, c.last);
        for (int u = c.first; u < c.last; ++u) ++owners[u];
      }
    }
    ASSERT_EQ(owners.size(), 6u) << pp;  // embedding, 4 blocks, head
    for (const auto& [unit, count] : owners) EXPECT_EQ(count, 1) << unit;
  }
}

TEST(PipelineChunksTest, InFlightMicroBatchesFollowTheSchedule) {
  auto in_flight = [](ParallelConfig::PipelineSchedule schedule, int pp, int v, int m) {
    JobSpec job = Gpt2(pp, 1, pp);
    job.mutable_model()->set_n_layer(8);
    job.mutable_parallel()->set_pipeline_schedule(schedule);
    job.mutable_parallel()->set_virtual_stages(v);
    job.mutable_parallel()->set_micro_batches(m);
    job = Completed(job);
    std::vector<std::vector<int>> out;
    for (int p = 0; p < pp; ++p) {
      std::vector<int> counts;
      for (const PipelineChunk& c : PipelineChunksOf(job, ParallelLayout::ForJob(job, p))) {
        counts.push_back(c.in_flight);
      }
      out.push_back(counts);
    }
    return out;
  };
  // 1F1B: stage p holds pp − p (Narayanan et al. 2021); GPipe: all m.
  EXPECT_THAT(in_flight(ParallelConfig::ONE_F_ONE_B, 4, 1, 8),
              ElementsAre(ElementsAre(4), ElementsAre(3), ElementsAre(2), ElementsAre(1)));
  EXPECT_THAT(in_flight(ParallelConfig::GPIPE, 2, 1, 8),
              ElementsAre(ElementsAre(8), ElementsAre(8)));
  // Interleaved, pp 2, v 2, m 4, Megatron's order (F(c, k) chunk c micro-batch k):
  //   rank 0: F00 F01 F10 F11 | F02 B10 F03 B11 F12 B00 F13 B01 | B12 B13 B02 B03
  //   rank 1: F00 F01 | F10 B10 F11 B11 F02 B00 F03 B01 F12 B12 F13 B13 | B02 B03
  // Rank 0's chunk 0 has all 4 forwards in before its first backward (4, not the warmup
  // window's 3); its chunk 1 at most 2. Rank 1: chunk 0 holds 3 (F02, F03 before B01),
  // chunk 1 (the head) 1.
  EXPECT_THAT(in_flight(ParallelConfig::INTERLEAVED, 2, 2, 4),
              ElementsAre(ElementsAre(4, 2), ElementsAre(3, 1)));
  // Every schedule's plan is its order's peak per chunk, for many shapes.
  // (pp · v divides the 8-layer model's blocks, validation's rule.)
  for (const auto& [pp, v] : {std::pair{2, 2}, std::pair{2, 4}, std::pair{4, 2}}) {
    {
      for (int m : {pp, 2 * pp, 3 * pp}) {
        const auto planned = in_flight(ParallelConfig::INTERLEAVED, pp, v, m);
        for (int r = 0; r < pp; ++r) {
          const std::vector<PipelineOp> ops =
              PipelineStageOps(ParallelConfig::INTERLEAVED, pp, r, m, v);
          for (int c = 0; c < v; ++c) {
            EXPECT_EQ(planned[r][c], MaxInFlight(ops, c))
                << "pp " << pp << " v " << v << " m " << m << " rank " << r << " chunk " << c;
          }
        }
      }
    }
  }
}

// One block's saved activations (activation_checkpointing NONE), in f32 elements, B·T = 64:
//   kept whole under TP:  ln1, res2, ln2 (64 × 64 each) + four norm statistics (64 each) = 12544
//   divided by tp:        qkv 64 × 192, fch 64 × 256, atty 64 × 64, att_lse 2 × 4 × 32,
//                         fch_act 64 × 256 = 49408
// This is Korthikanti et al. 2022's split: their eq. 2 (no parallelism) sbh(34 + 5as/h) has
// 10·sbh that tensor parallelism leaves whole (norm inputs, the first GEMMs' inputs, dropout
// masks) and eq. 3 divides the rest by t; with sequence parallelism (eq. 4) everything is
// divided by t. Ours has no dropout and keeps the attention's log-sum-exp instead of the
// (s × s) scores, so its two parts differ in size, not in which tensors fall where.
TEST(RankActivationTableTest, TensorAndSequenceParallelDivideAsKorthikanti) {
  const int64_t whole = 12544 + 49408;
  auto block_bytes = [](int tp, bool sequence) {
    JobSpec job = Gpt2(tp, tp, 1);
    job.mutable_parallel()->set_sequence_parallel(sequence);
    job = Completed(job);
    return BytesWithPrefix(
        RankActivationTable(job, ParallelLayout::ForJob(job, 0), 2, 32, DType::kF32), "block.0.");
  };
  EXPECT_EQ(block_bytes(1, false), 4 * whole);
  // qkv (2 + 2·2)·16 = 96 wide; the rest of the divided part halves.
  EXPECT_EQ(block_bytes(2, false), 4 * (12544 + 64 * 96 + (49408 - 64 * 192) / 2));
  EXPECT_EQ(block_bytes(2, true), 4 * whole / 2);
  EXPECT_EQ(block_bytes(4, true), 4 * whole / 4);
}

// The whole plan with sequence parallelism against TP alone (GPT-2, 4 blocks, B·T 64, C 64,
// f32): the activations smaller by exactly (1 − 1/t) of the norms' and residual stream's share
// — every block's ln1, res2, ln2 (B·T·C) and their 4 statistics (B·T), residual.0…4, the final
// norm's output and 2 statistics — and the workspace adding the engine's one whole-sequence
// buffer tp.sequence_full (B·T·C) while grad.residual keeps only the rank's rows.
TEST(PlanMemoryLayoutTest, SequenceParallelShrinksActivationsByTheNormAndResidualShare) {
  auto bytes = [](const MemoryPlan& plan, MemoryCategory category) {
    int64_t total = 0;
    for (const BufferSpec& b : plan.buffers) {
      if (b.category == category) total += b.bytes();
    }
    return total;
  };
  const int64_t BT = 64, C = 64, L = 4;
  const int64_t share = 4 * (L * (3 * BT * C + 4 * BT) + (L + 1) * BT * C + BT * C + 2 * BT);
  for (int tp : {2, 4}) {
    JobSpec job = Gpt2(tp, tp, 1);
    const MemoryPlan plain = PlanMemory(Completed(job), 0);
    job.mutable_parallel()->set_sequence_parallel(true);
    const MemoryPlan sequence = PlanMemory(Completed(job), 0);
    EXPECT_EQ(
        bytes(plain, MemoryCategory::kActivations) - bytes(sequence, MemoryCategory::kActivations),
        share - share / tp)
        << "tp " << tp;
    const BufferSpec* full = Find(sequence.buffers, "tp.sequence_full");
    ASSERT_NE(full, nullptr);
    EXPECT_EQ(full->numel(), BT * C);
    EXPECT_EQ(Find(plain.buffers, "tp.sequence_full"), nullptr);
    EXPECT_EQ(Find(sequence.buffers, "grad.residual")->numel(), BT * C / tp);
    EXPECT_EQ(
        bytes(sequence, MemoryCategory::kWorkspace) - bytes(plain, MemoryCategory::kWorkspace),
        4 * BT * C / tp);
  }
}

TEST(RankActivationTableTest, PipelineStagesKeepTheirBlocksForTheirInFlightMicroBatches) {
  JobSpec job = Gpt2(2, 1, 2);
  job.mutable_parallel()->set_micro_batches(4);
  job = Completed(job);
  std::map<int, int> block_owner;
  for (int p = 0; p < 2; ++p) {
    const ParallelLayout place = ParallelLayout::ForJob(job, p);
    const std::vector<BufferSpec> table = RankActivationTable(job, place, 2, 32, DType::kF32);
    const int in_flight = 2 - p;  // 1F1B
    for (const BufferSpec& b : table) {
      if (!absl::StartsWith(b.name, "block.")) continue;
      const int i = b.name[6] - '0';
      EXPECT_TRUE(block_owner.emplace(i, p).second || block_owner[i] == p) << b.name;
      if (in_flight > 1) {
        EXPECT_EQ(b.shape.front(), in_flight) << b.name;
        EXPECT_EQ(
            b.numel(),
            in_flight * Find(ActivationTable(job.model(), job.memory(), 2, 32, DType::kF32), b.name)
                            ->numel());
      }
    }
    // The head's buffers only on the last stage.
    EXPECT_EQ(Find(table, "head.lnf") != nullptr, p == 1);
  }
  EXPECT_EQ(block_owner.size(), 4u);
}

TEST(RankModelLayoutTest, TiedEmbeddingsSplitAcrossStagesGiveTheHeadACopy) {
  JobSpec job = Gpt2(4, 2, 2);
  job.mutable_parallel()->set_micro_batches(2);
  job = Completed(job);
  const ModelLayout first = RankModelLayout(job, ParallelLayout::ForJob(job, 0));
  // tp 2 innermost, dp 1, pp outermost: ranks 2 and 3 are the second stage.
  const ModelLayout last = RankModelLayout(job, ParallelLayout::ForJob(job, 2));
  EXPECT_EQ(ParallelLayout::ForJob(job, 2).coordinates().pipeline, 1);
  EXPECT_FALSE(first.tied_embeddings);
  EXPECT_FALSE(last.tied_embeddings);
  EXPECT_EQ(first.units.front().name, "embedding");
  EXPECT_EQ(last.units.back().name, "head");
  const ParamSpec* copy = last.units.back().Find("lm_head.weight");
  ASSERT_NE(copy, nullptr);
  EXPECT_THAT(copy->shape, ElementsAre(128, 64));  // vocabulary-parallel, as wte
  // Together the stages hold the tensor-parallel model once, plus the copy.
  EXPECT_EQ(first.total_numel + last.total_numel,
            TensorParallelModelLayout(job.model(), 2).total_numel + 128 * 64);
}

// ZeRO divides inside the data-parallel group: 8 ranks at tp 2, pp 1 are 4 data-parallel
// ranks, and a block's padded TP share splits 4 ways.
TEST(PlanMemoryLayoutTest, ZeroShardsTheTensorParallelShareInsideTheDataGroup) {
  JobSpec job = Gpt2(8, 2, 1);
  job.mutable_parallel()->set_zero_stage(3);
  job = Completed(job);
  const MemoryPlan plan = PlanMemory(job, ParallelLayout::ForJob(job, 5));
  const BufferSpec* params = Find(plan.buffers, "block.0.params");
  ASSERT_NE(params, nullptr);
  EXPECT_EQ(params->numel(), PaddedUnitNumel(25184, 4) / 4);
  const BufferSpec* adam_m = Find(plan.buffers, "block.0.adam_m");
  ASSERT_NE(adam_m, nullptr);
  EXPECT_EQ(adam_m->numel(), PaddedUnitNumel(25184, 4) / 4);  // rank 5 is dp 2: a full shard
  // The same job at tp 1 plans every block whole over 8 ranks; tp = pp = 1 stays the old plan.
  const JobSpec flat = Completed(Gpt2(8, 1, 1));
  const MemoryPlan flat_plan = PlanMemory(flat, 5);
  EXPECT_EQ(Find(flat_plan.buffers, "block.0.params")->numel(),
            BuildModelLayout(flat.model()).block(0).numel);
}

// A 16-bit tensor-parallel job plans its shares, activations and gradients in their 16-bit
// dtypes (half the f32 job's bytes), the f32 master weights, the parallel cross-entropy's f32
// statistics, and the f32 conversion buffers its TP communicators reduce 16-bit data through:
// B·T·C elements for the activations' all-reduces, and with replicated KV heads (n_kv_head 1 <
// tp 2) the largest replicated KV range of a block's 16-bit gradient (2 heads' rows of attn.qkv:
// weight 2·D·C, then bias 2·D, as separate ranges).
TEST(PlanMemoryLayoutTest, SixteenBitTensorParallelPlansItsDtypesAndConversionBuffers) {
  JobSpec job = Gpt2(2, 2, 1);
  job.mutable_model()->set_family(zerotrain::ModelConfig::LLAMA);
  job.mutable_model()->set_n_kv_head(1);
  const MemoryPlan f32 = PlanMemory(Completed(job), 1);
  auto* p = job.mutable_precision();
  p->set_param_dtype(zerotrain::PrecisionConfig::BF16);
  p->set_compute_dtype(zerotrain::PrecisionConfig::BF16);
  p->set_grad_dtype(zerotrain::PrecisionConfig::BF16);
  job = Completed(job);
  const MemoryPlan plan = PlanMemory(job, 1);
  const BufferSpec* params = Find(plan.buffers, "block.0.params");
  const BufferSpec* master = Find(plan.buffers, "block.0.master");
  ASSERT_NE(params, nullptr);
  ASSERT_NE(master, nullptr);
  EXPECT_EQ(params->dtype, DType::kBF16);
  EXPECT_EQ(master->dtype, DType::kF32);
  EXPECT_EQ(params->numel(), Find(f32.buffers, "block.0.params")->numel());
  EXPECT_EQ(Find(plan.buffers, "block.0.grads")->dtype, DType::kBF16);
  EXPECT_EQ(Find(plan.buffers, "block.0.qkv")->dtype, DType::kBF16);
  EXPECT_EQ(2 * Find(plan.buffers, "block.0.qkv")->bytes(),
            Find(f32.buffers, "block.0.qkv")->bytes());
  EXPECT_EQ(Find(plan.buffers, "tp.ce_sums")->dtype, DType::kF32);
  EXPECT_EQ(Find(plan.buffers, "tp.ce_maxes")->dtype, DType::kF32);
  const int64_t C = 64, D = 16, BT = 2 * 32;
  for (const char* k : {"0", "1"}) {
    const BufferSpec* tensor = Find(plan.buffers, std::string("comm.convert.tensor.") + k);
    ASSERT_NE(tensor, nullptr);
    EXPECT_EQ(tensor->dtype, DType::kF32);
    EXPECT_EQ(tensor->numel(), BT * C);
    const BufferSpec* kv = Find(plan.buffers, std::string("comm.convert.tensor_kv.") + k);
    ASSERT_NE(kv, nullptr);
    EXPECT_EQ(kv->numel(), 2 * D * C);
  }
  // f32 converts nothing.
  EXPECT_EQ(BytesWithPrefix(f32.buffers, "comm.convert."), 0);
}

TEST(PlanMemoryLayoutTest, OneTensorAndPipelineRankPlansTheWholeModel) {
  // tp = pp = 1: the rank tables are the model's own, buffer for buffer.
  const JobSpec job = Completed(Gpt2(2, 1, 1));
  const ParallelLayout place = ParallelLayout::ForJob(job, 1);
  const std::vector<BufferSpec> mine = RankActivationTable(job, place, 2, 32, DType::kF32);
  const std::vector<BufferSpec> model = ActivationTable(job.model(), job.memory(), 2, 32);
  ASSERT_EQ(mine.size(), model.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_EQ(mine[i].name, model[i].name);
    EXPECT_EQ(mine[i].shape, model[i].shape);
  }
  EXPECT_EQ(RankModelLayout(job, place).total_numel, BuildModelLayout(job.model()).total_numel);
}

}  // namespace
}  // namespace zt
