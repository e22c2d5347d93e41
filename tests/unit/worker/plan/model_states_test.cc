// The plan's model states against the literature: 16 bytes per parameter for mixed-precision
// AdamW (2 parameter + 2 gradient + 4 master + 4 + 4 moments), divided as ZeRO divides them,
// and 6 bytes per parameter fewer with 8-bit AdamW. Nothing is allocated: GPT-2 1.5B plans
// in an instant on any machine.
#include <cmath>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "worker/job/job_defaults.h"
#include "worker/model/param_layout.h"
#include "worker/plan/memory_plan.h"

namespace zt {
namespace {

using zerotrain::OptimizerConfig;
using zerotrain::PrecisionConfig;

zerotrain::JobSpec Gpt2Xl(OptimizerConfig::Type optimizer, int world_size, int stage) {
  zerotrain::JobSpec job;
  auto* m = job.mutable_model();
  m->set_family(zerotrain::ModelConfig::GPT2);
  m->set_n_layer(48);
  m->set_n_head(25);
  m->set_d_model(1600);
  m->set_vocab_size(50257);
  m->set_max_seq_len(1024);
  job.mutable_data()->add_train("unused.bin");
  job.mutable_data()->set_seq_len(1024);
  job.mutable_train()->set_micro_batch_size(1);
  job.mutable_train()->set_max_steps(1);
  job.mutable_optimizer()->set_type(optimizer);
  job.mutable_optimizer()->set_lr(1e-4f);
  job.mutable_precision()->set_param_dtype(PrecisionConfig::FP16);
  job.mutable_precision()->set_grad_dtype(PrecisionConfig::FP16);
  job.mutable_parallel()->set_world_size(world_size);
  job.mutable_parallel()->set_zero_stage(stage);
  ApplyJobDefaults(&job);
  return job;
}

int64_t ModelStates(const MemoryPlan& plan) {
  return plan.CategoryBytes(MemoryCategory::kParameters) +
         plan.CategoryBytes(MemoryCategory::kGradients) +
         plan.CategoryBytes(MemoryCategory::kOptimizerState);
}

TEST(ModelStatesTest, MixedPrecisionAdamWIsSixteenBytesPerParameter) {
  const zerotrain::JobSpec job = Gpt2Xl(OptimizerConfig::ADAMW, 1, 0);
  const int64_t params = BuildModelLayout(job.model()).total_numel;
  // GPT-2 XL with the 1024-position table: 1.558e9 parameters.
  EXPECT_NEAR(static_cast<double>(params), 1.558e9, 0.002e9);
  const double per_param = static_cast<double>(ModelStates(PlanMemory(job))) / params;
  // Exactly 16 but for the 64-byte alignment of each of the ~250 buffers.
  EXPECT_NEAR(per_param, 16.0, 1e-4);
  EXPECT_NEAR(static_cast<double>(ModelStates(PlanMemory(job))), 24.9e9, 0.1e9);
}

TEST(ModelStatesTest, EightBitAdamSavesSixBytesPerParameter) {
  const zerotrain::JobSpec fp32_states = Gpt2Xl(OptimizerConfig::ADAMW, 1, 0);
  const zerotrain::JobSpec eight_bit = Gpt2Xl(OptimizerConfig::ADAMW_8BIT, 1, 0);
  const int64_t params = BuildModelLayout(fp32_states.model()).total_numel;
  const double saved = static_cast<double>(ModelStates(PlanMemory(fp32_states)) -
                                           ModelStates(PlanMemory(eight_bit))) /
                       params;
  // 8 bytes of fp32 moments become 2 bytes of codes plus 2·4 bytes of absmax per 2048-value
  // block (0.004 bytes/param); the few tensors under 4096 elements keep fp32 moments.
  EXPECT_NEAR(saved, 6.0 - 0.004, 0.002);
}

TEST(ModelStatesTest, SplitMasterWeightsSaveTwoBytesPerParameter) {
  zerotrain::JobSpec f32_master = Gpt2Xl(OptimizerConfig::ADAMW_8BIT, 1, 0);
  f32_master.mutable_precision()->set_param_dtype(PrecisionConfig::BF16);
  f32_master.mutable_precision()->set_grad_dtype(PrecisionConfig::BF16);
  zerotrain::JobSpec split = f32_master;
  split.mutable_precision()->set_split_master_weights(true);
  const int64_t params = BuildModelLayout(split.model()).total_numel;
  const MemoryPlan split_plan = PlanMemory(split);
  const double saved =
      static_cast<double>(ModelStates(PlanMemory(f32_master)) - ModelStates(split_plan)) / params;
  EXPECT_NEAR(saved, 2.0, 1e-4);  // 64-byte alignment of each buffer aside
  // bf16 parameters and gradients, 2-byte low halves, 2 bytes of 8-bit moments and their
  // block scales: 8 bytes per parameter, where the literature's mixed precision needs 16.
  EXPECT_NEAR(static_cast<double>(ModelStates(split_plan)) / params, 8.0, 0.01);
  int low_buffers = 0;
  for (const BufferSpec& b : split_plan.buffers) {
    EXPECT_FALSE(b.name.ends_with(".master")) << b.name;
    if (b.name.ends_with(".master_low")) {
      ++low_buffers;
      EXPECT_EQ(b.dtype, DType::kI16);
      EXPECT_TRUE(IsCheckpointed(b, /*weights_only=*/true)) << b.name;
    }
  }
  EXPECT_EQ(low_buffers, static_cast<int>(BuildModelLayout(split.model()).units.size()));
}

TEST(ModelStatesTest, ZeroStagesDivideAsThePaperSays) {
  const int64_t params = BuildModelLayout(Gpt2Xl(OptimizerConfig::ADAMW, 1, 0).model()).total_numel;
  const double full =
      static_cast<double>(ModelStates(PlanMemory(Gpt2Xl(OptimizerConfig::ADAMW, 1, 0))));
  for (int n : {2, 4, 8, 64}) {
    auto per_param = [&](int stage) {
      return static_cast<double>(
                 ModelStates(PlanMemory(Gpt2Xl(OptimizerConfig::ADAMW, n, stage)))) /
             params;
    };
    // The full-size buffers a sharded rank adds, in fp16 (2 bytes): stage 2 the backward's
    // two alternating unit gradients plus the tied embedding's (the head's backward starts
    // it); stage 3 the two alternating gradients and two gathered units (the one computed and
    // the one prefetched), all four of a block's size: the tied embedding is split by
    // vocabulary rows over the shard group (VocabularyShardedEmbedding), so it is neither
    // gathered for the head nor given a whole gradient. At 8 ranks 2.16 bytes a parameter —
    // ZeRO's 2.0 plus the gathered and reduced units — where the embedding gathered whole
    // for the head's loss, holding the slots, cost 2.29 (2.37 with the slots apart).
    const ModelLayout layout = BuildModelLayout(Gpt2Xl(OptimizerConfig::ADAMW, 1, 0).model());
    const double embedding = static_cast<double>(layout.embedding().numel) / params;
    const double block = static_cast<double>(layout.block(0).numel) / params;
    const double full_grads = 2 * (embedding + 2 * block);
    const double gathered_and_slots = 2 * (4 * block);
    EXPECT_NEAR(per_param(0), full / params, 1e-3);
    EXPECT_NEAR(per_param(1), 4.0 + 12.0 / n, 0.01);               // Pos
    EXPECT_NEAR(per_param(2), 2.0 + 14.0 / n + full_grads, 0.01);  // Pos+g
    // Gathered whole (from 64 ranks on, the group's 64·B·T token rows outweigh the
    // embedding: VocabularyShardedEmbedding keeps it whole), the embedding's two copies and
    // the two slots in its gather buffer.
    const double gathered_whole = full_grads + 2 * (embedding + 2 * block) - 2 * (2 * block);
    const bool split = VocabularyShardedEmbedding(Gpt2Xl(OptimizerConfig::ADAMW, n, 3));
    EXPECT_EQ(split, n < 64) << n;
    EXPECT_NEAR(per_param(3), 16.0 / n + (split ? gathered_and_slots : gathered_whole),
                0.01);  // Pos+g+p
    if (n == 8) EXPECT_NEAR(per_param(3), 2.16, 0.005);
  }
}

const BufferSpec* Find(const MemoryPlan& plan, const std::string& name) {
  for (const BufferSpec& b : plan.buffers) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

TEST(ModelStatesTest, StageThreeGradientSlotsAreTheTiedEmbeddingsGatherBuffer) {
  // Stage 3, one micro-batch a step, tied embedding gathered whole (here: offload.params CPU,
  // where the embedding is not split by vocabulary): the embedding's gather buffer is free
  // after the head's loss, when the backward's two alternating gradients begin, so they take
  // its bytes instead of buffers of their own (GradientSlotsInEmbeddingGather).
  zerotrain::JobSpec job = Gpt2Xl(OptimizerConfig::ADAMW, 8, 3);
  job.mutable_offload()->set_optimizer(zerotrain::OffloadConfig::CPU);
  job.mutable_offload()->set_params(zerotrain::OffloadConfig::CPU);
  ASSERT_FALSE(VocabularyShardedEmbedding(job));
  const ModelLayout layout = BuildModelLayout(job.model());
  const MemoryPlan plan = PlanMemory(job);
  EXPECT_TRUE(GradientSlotsInEmbeddingGather(job, layout));
  EXPECT_EQ(Find(plan, "grad.full.0"), nullptr);
  EXPECT_EQ(Find(plan, "grad.full.1"), nullptr);
  ASSERT_NE(Find(plan, "grad.full.embedding"), nullptr);
  const BufferSpec* gathered = Find(plan, "gather.embedding");
  ASSERT_NE(gathered, nullptr);
  // GPT-2 1.5B: the embedding (82 M elements) outweighs two blocks' gradients (2 × 30.7 M),
  // so the buffer is the gathered embedding, exactly as before.
  const int64_t embedding = PaddedUnitNumel(layout.embedding().numel, 8);
  const int64_t slot_bytes = PaddedUnitNumel(layout.block(0).numel, 8) * 2;  // fp16
  EXPECT_EQ(gathered->numel(), embedding);
  EXPECT_GE(gathered->bytes(), GradientSlotOffset(1, slot_bytes) + slot_bytes);

  // A small vocabulary: the two slots outweigh the embedding, and the buffer grows to hold
  // them (second slot 64-byte aligned), which is still one embedding less than before.
  zerotrain::JobSpec small_vocab = job;
  small_vocab.mutable_model()->set_vocab_size(64);
  const ModelLayout small_layout = BuildModelLayout(small_vocab.model());
  const MemoryPlan small_plan = PlanMemory(small_vocab);
  const BufferSpec* grown = Find(small_plan, "gather.embedding");
  ASSERT_NE(grown, nullptr);
  EXPECT_GT(GradientSlotOffset(1, slot_bytes) + slot_bytes,
            PaddedUnitNumel(small_layout.embedding().numel, 8) * 2);
  EXPECT_EQ(grown->bytes(), GradientSlotOffset(1, slot_bytes) + slot_bytes);

  // Elsewhere the slots are buffers of their own: stage 2 (no gather buffer), stage 3 keeping
  // units gathered (the embedding's buffer lives through the backward), with accumulation
  // (no slots: every unit's gradient accumulates whole), and an untied head.
  zerotrain::JobSpec stage2 = Gpt2Xl(OptimizerConfig::ADAMW, 8, 2);
  zerotrain::JobSpec kept = job;
  kept.mutable_parallel()->set_reshard_after_forward(false);
  zerotrain::JobSpec untied = job;
  untied.mutable_model()->set_tie_embeddings(false);
  for (const zerotrain::JobSpec* other : {&stage2, &kept, &untied}) {
    EXPECT_FALSE(GradientSlotsInEmbeddingGather(*other, BuildModelLayout(other->model())));
    EXPECT_NE(Find(PlanMemory(*other), "grad.full.0"), nullptr);
  }
  zerotrain::JobSpec accumulated = job;
  accumulated.mutable_train()->set_grad_accum_steps(2);
  EXPECT_FALSE(GradientSlotsInEmbeddingGather(accumulated, layout));
  EXPECT_EQ(Find(PlanMemory(accumulated), "grad.full.0"), nullptr);
}

TEST(ModelStatesTest, StageThreeSplitsTheTiedEmbeddingByVocabularyRows) {
  // Stage 3 over 8 ranks: [wte; wpe] is split into whole rows of d_model, one range a rank
  // (VocabularyShardedEmbedding, RowAlignedShardOf), and nothing holds it whole: no gather
  // buffer, no full gradient; the group's token rows and their gradients take its place. On
  // CPU and CUDA ranks alike: the same rows, the same buffers in device memory (the
  // workspace category), the same model states a parameter.
  const zerotrain::JobSpec job = Gpt2Xl(OptimizerConfig::ADAMW, 8, 3);
  ASSERT_TRUE(VocabularyShardedEmbedding(job));
  const ModelLayout layout = BuildModelLayout(job.model());
  const int64_t C = job.model().d_model(), numel = layout.embedding().numel;
  zerotrain::JobSpec cuda = job;
  cuda.mutable_resources()->set_device(zerotrain::ResourceConfig::CUDA);
  ASSERT_TRUE(VocabularyShardedEmbedding(cuda));
  for (const zerotrain::JobSpec* device_job : {&job, &std::as_const(cuda)}) {
    const std::string device =
        zerotrain::ResourceConfig::DeviceKind_Name(device_job->resources().device());
    const MemoryPlan plan = PlanMemory(*device_job, 0);
    int64_t vocab_buffers = 0;
    for (const BufferSpec& b : plan.buffers) {
      if (!b.name.starts_with("vocab.")) continue;
      ++vocab_buffers;
      EXPECT_EQ(b.category, MemoryCategory::kWorkspace) << device << " " << b.name;
    }
    // Tokens, targets, rows, their f32 gradients' partials and (fp16 activations) the
    // partials' f32 sum, the cross-entropy's maxima, sums and losses (no positions: unpacked
    // rows are their own).
    EXPECT_EQ(vocab_buffers, 8) << device;
    // The split's saving (ZeroStagesDivideAsThePaperSays): 2.16 bytes a parameter of model
    // states at 8 ranks, against 2.29 with the embedding gathered whole for the head.
    const double params = static_cast<double>(layout.total_numel);
    EXPECT_NEAR(static_cast<double>(ModelStates(plan)) / params, 2.16, 0.005) << device;
    zerotrain::JobSpec gathered = *device_job;
    gathered.mutable_parallel()->set_vocab_sharded_embedding(false);
    EXPECT_NEAR(static_cast<double>(ModelStates(PlanMemory(gathered, 0))) / params, 2.29, 0.005)
        << device;
  }
  int64_t covered = 0;
  for (int r = 0; r < 8; ++r) {
    const ShardGeometry g = ParallelLayout::ForJob(job, r).shard();
    EXPECT_EQ(g.embedding_row_numel, C);
    const UnitShard shard = ShardOfUnit(layout.embedding(), g);
    // Whole rows, consecutive ranks consecutive rows, every row once.
    EXPECT_EQ(shard.owned.begin, covered) << "rank " << r;
    EXPECT_EQ(shard.owned.begin % C, 0) << "rank " << r;
    EXPECT_EQ(shard.owned.end % C, 0) << "rank " << r;
    EXPECT_EQ(shard.shard_numel % kShardAlignmentElements, 0) << "rank " << r;
    covered = shard.owned.end;
    const MemoryPlan plan = PlanMemory(job, r);
    const BufferSpec* params = Find(plan, "embedding.params");
    ASSERT_NE(params, nullptr);
    EXPECT_EQ(params->numel(), shard.shard_numel);
    EXPECT_EQ(Find(plan, "gather.embedding"), nullptr) << "rank " << r;
    EXPECT_EQ(Find(plan, "grad.full.embedding"), nullptr) << "rank " << r;
    // The two alternating gradients are a block's: the embedding no longer sets them.
    const BufferSpec* slot = Find(plan, "grad.full.0");
    ASSERT_NE(slot, nullptr);
    EXPECT_EQ(slot->numel(), PaddedUnitNumel(layout.block(0).numel, 8));
    const BufferSpec* rows = Find(plan, "vocab.rows");
    ASSERT_NE(rows, nullptr);
    EXPECT_EQ(rows->numel(), int64_t{8} * 1024 * C);
  }
  EXPECT_EQ(covered, numel);

  // Elsewhere the embedding shards flat and is gathered whole: below stage 3, untied, a shard
  // group of one (hybrid sharding with G = 1), tensor parallelism (its embedding is already a
  // vocabulary share), LoRA (a frozen embedding), offloaded parameters, and when the job
  // says false.
  zerotrain::JobSpec stage2 = Gpt2Xl(OptimizerConfig::ADAMW, 8, 2);
  zerotrain::JobSpec untied = job;
  untied.mutable_model()->set_tie_embeddings(false);
  zerotrain::JobSpec replicated = job;
  replicated.mutable_parallel()->set_shard_group_size(1);
  zerotrain::JobSpec tensor = job;
  tensor.mutable_parallel()->set_tensor_parallel(2);
  zerotrain::JobSpec lora = job;
  lora.mutable_model()->mutable_lora()->set_rank(8);
  zerotrain::JobSpec offloaded = job;
  offloaded.mutable_offload()->set_params(zerotrain::OffloadConfig::CPU);
  zerotrain::JobSpec refused = job;
  refused.mutable_parallel()->set_vocab_sharded_embedding(false);
  // Unset, it splits only when that holds less: at 16 sequences a micro-batch the group's
  // rows and their gradients (2 × 8 × 16 × 1024 elements a column) outweigh the embedding's
  // parameters and gradient (51 281 rows × 4 bytes a column).
  zerotrain::JobSpec big_batch = job;
  big_batch.mutable_train()->set_micro_batch_size(16);
  for (const zerotrain::JobSpec* other :
       {&stage2, &untied, &replicated, &tensor, &lora, &offloaded, &refused, &big_batch}) {
    EXPECT_FALSE(VocabularyShardedEmbedding(*other)) << other->DebugString();
    EXPECT_EQ(ParallelLayout::ForJob(*other, 0).shard().embedding_row_numel, 0);
  }
  zerotrain::JobSpec asked = big_batch;
  asked.mutable_parallel()->set_vocab_sharded_embedding(true);
  EXPECT_TRUE(VocabularyShardedEmbedding(asked));
}

TEST(ModelStatesTest, ShardsOfAllRanksCoverTheStateOnce) {
  // The optimizer state of the N shards adds up to the unsharded state (fp32 moments): no
  // element is lost or counted twice, whatever rank a tensor boundary falls in.
  const zerotrain::JobSpec one = Gpt2Xl(OptimizerConfig::ADAMW, 1, 0);
  for (int n : {3, 8}) {
    const zerotrain::JobSpec sharded = Gpt2Xl(OptimizerConfig::ADAMW, n, 1);
    int64_t sum = 0;
    for (int r = 0; r < n; ++r) {
      const MemoryPlan plan = PlanMemory(sharded, r);
      for (const BufferSpec& b : plan.buffers) {
        if (b.name.ends_with(".adam_m") || b.name.ends_with(".adam_v")) sum += b.bytes();
      }
    }
    int64_t whole_moments = 0;
    for (const BufferSpec& b : PlanMemory(one).buffers) {
      if (b.name.ends_with(".adam_m") || b.name.ends_with(".adam_v")) whole_moments += b.bytes();
    }
    EXPECT_GT(whole_moments, 0);
    EXPECT_EQ(sum, whole_moments) << n;
  }
}

}  // namespace
}  // namespace zt
