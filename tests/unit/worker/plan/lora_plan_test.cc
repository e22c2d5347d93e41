// worker/plan/lora_plan: a LoRA job's plan holds the frozen base without gradients or
// optimizer state and the adapters with theirs, counted element by element.
#include "worker/plan/lora_plan.h"

#include <algorithm>

#include "gtest/gtest.h"
#include "kernels/int8_linear.h"
#include "kernels/nf4.h"
#include "worker/model/param_layout.h"
#include "worker/plan/memory_plan.h"
#include "worker/plan/parallel_plan.h"

namespace zt {
namespace {

zerotrain::JobSpec LlamaLoraJob(zerotrain::OptimizerConfig::Type optimizer) {
  zerotrain::JobSpec job;
  auto* m = job.mutable_model();
  m->set_family(zerotrain::ModelConfig::LLAMA);
  m->set_n_layer(3);
  m->set_n_head(4);
  m->set_n_kv_head(2);
  m->set_d_model(64);
  m->set_d_ff(128);
  m->set_vocab_size(100);
  m->set_max_seq_len(32);
  m->set_tie_embeddings(false);
  m->set_norm_eps(1e-5f);
  m->set_rope_theta(10000.0f);
  m->set_init_std(0.02f);
  m->set_base_dtype(zerotrain::ModelConfig::FP32);
  m->mutable_lora()->set_rank(4);
  m->mutable_lora()->set_alpha(8);
  m->mutable_lora()->add_target_modules("q_proj");
  m->mutable_lora()->add_target_modules("v_proj");
  m->mutable_lora()->add_target_modules("down_proj");
  job.mutable_data()->set_seq_len(16);
  job.mutable_train()->set_micro_batch_size(2);
  job.mutable_train()->set_grad_accum_steps(1);
  job.mutable_optimizer()->set_type(optimizer);
  job.mutable_optimizer()->set_quant_block_size(64);
  job.mutable_optimizer()->set_min_quantized_numel(0);
  job.mutable_resources()->set_cpu_threads(1);
  return job;
}

// On pipeline stages each stage plans the adapters, their gradients and states, and the frozen
// base of its own units only: over the stages every block's adapters once, and each block's
// kept adapter activations (h = x·Aᵀ) lead with its chunk's micro-batches in flight (1F1B:
// p − s on stage s).
TEST(LoraPlanTest, PipelineStagesPlanTheirOwnBlocksAdaptersAndBase) {
  zerotrain::JobSpec job = LlamaLoraJob(zerotrain::OptimizerConfig::ADAMW);
  job.mutable_model()->set_n_layer(4);
  job.mutable_parallel()->set_world_size(2);
  job.mutable_parallel()->set_pipeline_parallel(2);
  job.mutable_parallel()->set_pipeline_schedule(zerotrain::ParallelConfig::ONE_F_ONE_B);
  job.mutable_parallel()->set_micro_batches(4);
  job.mutable_train()->set_grad_accum_steps(4);
  const ModelLayout whole = BuildModelLayout(job.model());
  zerotrain::JobSpec one_rank = job;
  one_rank.mutable_parallel()->set_world_size(1);
  one_rank.mutable_parallel()->set_pipeline_parallel(1);
  const MemoryPlan one = PlanMemory(one_rank);
  const int64_t per_block = whole.block(0).lora_numel;
  int64_t adapters = 0, adapter_grads = 0, base = 0;
  std::vector<std::string> seen;
  for (int stage = 0; stage < 2; ++stage) {
    const MemoryPlan plan = PlanMemory(job, stage);
    for (const BufferSpec& b : plan.buffers) {
      if (b.name.ends_with(".lora")) {
        adapters += b.numel();
        seen.push_back(b.name);
        EXPECT_EQ(b.numel(), per_block) << b.name;
      }
      if (b.name.ends_with(".lora_grads")) adapter_grads += b.numel();
      if (b.name.ends_with(".params")) {
        base += b.numel();
        // The one-rank plan's buffer of the same name, element for element.
        const auto it = std::find_if(one.buffers.begin(), one.buffers.end(),
                                     [&](const BufferSpec& o) { return o.name == b.name; });
        ASSERT_NE(it, one.buffers.end()) << b.name;
        EXPECT_EQ(it->numel(), b.numel()) << b.name;
      }
      if (b.name.starts_with("block.") && b.name.find(".lora.self_attn") != std::string::npos) {
        // 1F1B: stage 0 keeps 2 micro-batches in flight, stage 1 one (no leading dimension).
        ASSERT_EQ(b.shape.size(), stage == 0 ? 3u : 2u) << b.name;
        if (stage == 0) EXPECT_EQ(b.shape[0], 2) << b.name;
      }
    }
    EXPECT_EQ(plan.CategoryBytes(MemoryCategory::kGradients),
              [&] {
                int64_t bytes = 0;
                for (const BufferSpec& b : plan.buffers) {
                  if (b.name.ends_with(".lora_grads")) bytes += AlignedBytes(b.bytes());
                }
                return bytes;
              }())
        << "stage " << stage << ": the adapters' gradients are its only gradients";
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<std::string>{"block.0.lora", "block.1.lora", "block.2.lora",
                                            "block.3.lora"}));
  EXPECT_EQ(adapters, whole.lora_numel);
  EXPECT_EQ(adapter_grads, whole.lora_numel);
  int64_t whole_base = 0;
  for (const BufferSpec& b : one.buffers) {
    if (b.name.ends_with(".params")) whole_base += b.numel();
  }
  EXPECT_EQ(base, whole_base);
}

// On tensor-parallel ranks each block's adapters are planned at their shares: a
// column-parallel site (q_proj, v_proj) keeps A (r, C) whole and B's rows / t, a row-parallel
// one (down_proj) splits A's input columns and keeps B (C, r) whole; gradients and AdamW
// moments alike.
TEST(LoraPlanTest, TensorParallelRanksPlanTheirAdapterShares) {
  zerotrain::JobSpec job = LlamaLoraJob(zerotrain::OptimizerConfig::ADAMW);
  job.mutable_parallel()->set_world_size(2);
  job.mutable_parallel()->set_tensor_parallel(2);
  const int64_t r = 4, C = 64, KV = 32, F = 128;
  // q: A (4, 64), B (64/2, 4); v: A (4, 64), B (32/2, 4); down_proj: A (4, 128/2), B (64, 4).
  const int64_t per_block = (r * C + C / 2 * r) + (r * C + KV / 2 * r) + (r * F / 2 + C * r);
  for (int rank = 0; rank < 2; ++rank) {
    const MemoryPlan plan = PlanMemory(job, rank);
    int64_t adapters = 0, grads = 0, moments = 0;
    for (const BufferSpec& b : plan.buffers) {
      if (b.name.ends_with(".lora")) adapters += b.numel();
      if (b.name.ends_with(".lora_grads")) grads += b.numel();
      if (b.name.ends_with(".lora.adam_m")) moments += b.numel();
    }
    EXPECT_EQ(adapters, 3 * per_block) << "rank " << rank;
    EXPECT_EQ(grads, 3 * per_block) << "rank " << rank;
    EXPECT_EQ(moments, 3 * per_block) << "rank " << rank;
  }
}

TEST(LoraPlanTest, AdaptersCarryTheGradientsAndStatesTheBaseDoesNot) {
  const zerotrain::JobSpec job = LlamaLoraJob(zerotrain::OptimizerConfig::ADAMW);
  const ModelLayout layout = BuildModelLayout(job.model());
  // Per block: q (4·64 + 64·4), v (4·64 + 32·4), down_proj (4·128 + 64·4).
  const int64_t per_block = (256 + 256) + (256 + 128) + (512 + 256);
  ASSERT_EQ(layout.block(0).lora_numel, per_block);
  EXPECT_EQ(layout.lora_numel, 3 * per_block);
  EXPECT_EQ(layout.block(0).lora[1].row_begin, 64 + 32);  // v after q (64) and k (2·16)

  const MemoryPlan plan = PlanMemory(job);
  const LoraMemoryBreakdown lora = LoraBreakdown(plan);
  EXPECT_EQ(lora.base_bytes, plan.CategoryBytes(MemoryCategory::kParameters) - lora.adapter_bytes);
  EXPECT_EQ(lora.adapter_bytes, 3 * AlignedBytes(per_block * 4));
  EXPECT_EQ(lora.adapter_gradient_bytes, plan.CategoryBytes(MemoryCategory::kGradients));
  EXPECT_EQ(lora.adapter_gradient_bytes, 3 * AlignedBytes(per_block * 4));
  // AdamW: m and v, fp32, for the adapters only.
  EXPECT_EQ(lora.adapter_optimizer_bytes, plan.CategoryBytes(MemoryCategory::kOptimizerState));
  EXPECT_EQ(lora.adapter_optimizer_bytes, 2 * 3 * AlignedBytes(per_block * 4));
  EXPECT_EQ(lora.activation_bytes, plan.CategoryBytes(MemoryCategory::kActivations));

  zerotrain::JobSpec full = job;
  full.mutable_model()->clear_lora();
  full.mutable_model()->clear_base_dtype();
  const MemoryPlan full_plan = PlanMemory(full);
  EXPECT_EQ(lora.base_bytes, full_plan.CategoryBytes(MemoryCategory::kParameters));
}

TEST(LoraPlanTest, EightBitAdamOnAdaptersStoresCodes) {
  const MemoryPlan plan = PlanMemory(LlamaLoraJob(zerotrain::OptimizerConfig::ADAMW_8BIT));
  const LoraMemoryBreakdown lora = LoraBreakdown(plan);
  const int64_t adapters =
      BuildModelLayout(LlamaLoraJob(zerotrain::OptimizerConfig::ADAMW).model()).lora_numel;
  // Two 1-byte codes per element plus an absmax per 64 values: well under AdamW's 8 bytes.
  EXPECT_GT(lora.adapter_optimizer_bytes, 2 * adapters);
  EXPECT_LT(lora.adapter_optimizer_bytes, 3 * adapters);
}

TEST(LoraPlanTest, AnNf4BaseTakesAboutHalfAByteAParameter) {
  zerotrain::JobSpec job = LlamaLoraJob(zerotrain::OptimizerConfig::ADAMW);
  job.mutable_model()->set_base_dtype(zerotrain::ModelConfig::NF4);
  const ModelLayout layout = BuildModelLayout(job.model());
  EXPECT_EQ(layout.block(0).role, ParamRole::kQuantized);
  EXPECT_EQ(layout.block(0).numel, 2 * 64);  // the two RMSNorm weights stay in the flat buffer
  int64_t quantized = 0;
  for (const ParamSpec& p : layout.block(0).params) quantized += p.quantized ? p.numel : 0;
  // qkv (64+2·32)·64, o 64·64, gate|up 256·64, down 64·128.
  EXPECT_EQ(quantized, 128 * 64 + 64 * 64 + 256 * 64 + 64 * 128);

  const MemoryPlan plan = PlanMemory(job);
  int64_t nf4_bytes = 0;
  for (const BufferSpec& b : plan.buffers) {
    if (b.name.starts_with("block.0.nf4.")) nf4_bytes += b.bytes();
  }
  // 4 bits per weight, an 8-bit absmax per 64, an f32 per 256 blocks, a mean per tensor.
  const double bits = 8.0 * static_cast<double>(nf4_bytes) / static_cast<double>(quantized);
  EXPECT_GT(bits, 4.12);
  EXPECT_LT(bits, 4.2);  // QLoRA's 4.127 plus a per-tensor group and mean on small tensors
  EXPECT_GT(LoraBreakdown(plan).base_bytes, nf4_bytes);  // embeddings, norms and head besides
}

// On tensor-parallel ranks an NF4 share keeps one rank's 4-bit codes and 8-bit absmax codes
// and indexes the one-rank group scales (kGroupIndexed): per quantized weight exactly ceil(n/2)
// code bytes, n/64 absmax codes, the whole weight's 256-block group scales, μ and an i32 a
// share row, where the f32 absmax of before took 4 bytes a block (4.5 bits/weight).
TEST(LoraPlanTest, AnNf4ShareOnTensorParallelRanksIndexesTheOneRankGroupScales) {
  zerotrain::JobSpec job = LlamaLoraJob(zerotrain::OptimizerConfig::ADAMW);
  job.mutable_model()->set_base_dtype(zerotrain::ModelConfig::NF4);
  job.mutable_model()->set_n_head(8);
  job.mutable_model()->set_n_kv_head(4);
  job.mutable_model()->set_d_model(1024);
  job.mutable_model()->set_d_ff(4096);
  job.mutable_parallel()->set_world_size(2);
  job.mutable_parallel()->set_tensor_parallel(2);
  const ModelLayout one = BuildModelLayout(job.model());
  const ModelLayout share = TensorParallelModelLayout(job.model(), 2);
  EXPECT_EQ(share.nf4_absmax, Nf4Absmax::kGroupIndexed);
  const MemoryPlan plan = PlanMemory(job, 0);
  int64_t want = 0, weights = 0, one_rank_bytes = 0, one_rank_weights = 0;
  for (const ParamSpec& p : share.block(0).params) {
    if (!p.quantized) continue;
    const ParamSpec* whole = one.block(0).Find(p.name);
    ASSERT_NE(whole, nullptr) << p.name;
    EXPECT_EQ(p.whole_numel, whole->numel) << p.name;
    const int64_t n = p.numel, rows = p.shape[0], groups = (whole->numel / 64 + 255) / 256;
    want += n / 2 + n / 64 + 4 * groups + 4 + 4 * rows;
    weights += n;
    one_rank_bytes += Nf4LayoutFor(whole->numel, Nf4Absmax::kDoubleQuantized).total_bytes;
    one_rank_weights += whole->numel;
  }
  int64_t planned = 0;
  bool indexed = false;
  for (const BufferSpec& b : plan.buffers) {
    if (!b.name.starts_with("block.0.nf4.")) continue;
    planned += b.bytes();
    indexed = indexed || (b.name.ends_with(".block_base") && b.dtype == DType::kI32);
  }
  EXPECT_TRUE(indexed);
  EXPECT_EQ(planned, want);
  const double bits = 8.0 * static_cast<double>(planned) / static_cast<double>(weights);
  const double one_rank_bits =
      8.0 * static_cast<double>(one_rank_bytes) / static_cast<double>(one_rank_weights);
  // One rank: 4.127. The share adds 32 bits a share row (rows of 512 to 2,048 weights here:
  // 0.016–0.063) and the whole weight's group scales over half its weights (0.004): 4.158, not
  // 4.5.
  EXPECT_NEAR(one_rank_bits, 4.127, 0.001);
  EXPECT_GT(bits, one_rank_bits);
  EXPECT_LT(bits, one_rank_bits + 32.0 / 512 + 2 * 32.0 / (64 * 256) + 1e-9);
  EXPECT_NEAR(bits, 4.158, 0.001);
}

// LLM.int8(): one byte per quantized weight plus an f32 absmax per output row, exactly, and
// the forward's scratch (int8 activations, their scales, the outlier columns) in the GEMM
// workspace.
TEST(LoraPlanTest, AnInt8BaseTakesAByteAParameterAndAScalePerRow) {
  zerotrain::JobSpec job = LlamaLoraJob(zerotrain::OptimizerConfig::ADAMW);
  job.mutable_model()->set_base_dtype(zerotrain::ModelConfig::INT8);
  job.mutable_model()->set_int8_threshold(6.0f);
  const ModelLayout layout = BuildModelLayout(job.model());
  EXPECT_EQ(layout.base_quantization, BaseQuantization::kInt8);
  EXPECT_EQ(layout.int8_threshold, 6.0f);
  EXPECT_EQ(layout.block(0).role, ParamRole::kQuantized);
  EXPECT_EQ(layout.block(0).numel, 2 * 64);  // the two RMSNorm weights stay in the flat buffer

  const MemoryPlan plan = PlanMemory(job);
  int64_t weights = 0, rows = 0;
  for (const ParamSpec& p : layout.block(0).params) {
    if (!p.quantized) continue;
    weights += p.numel;
    rows += p.shape[0];
    const std::string prefix = Int8BufferPrefix(layout.block(0), p);
    const BufferSpec* codes = nullptr;
    const BufferSpec* scales = nullptr;
    for (const BufferSpec& b : plan.buffers) {
      if (b.name == prefix + "codes") codes = &b;
      if (b.name == prefix + "scales") scales = &b;
    }
    ASSERT_NE(codes, nullptr) << prefix;
    ASSERT_NE(scales, nullptr) << prefix;
    EXPECT_EQ(codes->dtype, DType::kU8);
    EXPECT_EQ(codes->shape, p.shape) << prefix;  // (out, in), as the kernel reads it
    EXPECT_EQ(scales->dtype, DType::kF32);
    EXPECT_EQ(scales->shape, std::vector<int64_t>{p.shape[0]}) << prefix;
  }
  // qkv (64+2·32)·64, o 64·64, gate|up 256·64, down 64·128; rows 128 + 64 + 256 + 64.
  EXPECT_EQ(weights, 128 * 64 + 64 * 64 + 256 * 64 + 64 * 128);
  EXPECT_EQ(rows, 128 + 64 + 256 + 64);
  int64_t int8_bytes = 0, placed = 0;
  for (const BufferSpec& b : plan.buffers) {
    if (!b.name.starts_with("block.0.int8.")) continue;
    EXPECT_TRUE(IsQuantizedBaseBuffer(b.name)) << b.name;
    int8_bytes += b.bytes();
    placed += PlacedBytes(b);
  }
  EXPECT_EQ(int8_bytes, weights + 4 * rows);
  // The base: every block's int8 buffers plus the unquantized rest (embedding, norms, head).
  int64_t rest = 0;
  for (const BufferSpec& b : plan.buffers) {
    if (b.name.ends_with(".params")) rest += PlacedBytes(b);
  }
  EXPECT_EQ(LoraBreakdown(plan).base_bytes, rest + layout.n_blocks() * placed);
  // B·T = 32 tokens of the widest input (mlp.proj's 128): 32·128 int8 + 32 f32 + 128 i32.
  int64_t workspace = 0;
  for (const BufferSpec& b : plan.buffers) {
    if (b.name == "gemm_workspace") workspace = b.bytes();
  }
  EXPECT_GE(workspace, Int8LinearWorkspaceBytes(32, 128));
}

// ZeRO stage 3 shards a quantized base: a block's per-tensor NF4 buffers are laid end to end
// (QuantizedBytesOf: the same names, dtypes and sizes, each 64-byte aligned, in order) and each
// of 4 ranks plans a quarter of them padded ("<block>.qbase") and no per-tensor buffer, plus a
// gather buffer of the largest block's padded bytes per "gather.<k>".
TEST(LoraPlanTest, AtStageThreeAQuantizedBaseIsAByteShardPerBlock) {
  zerotrain::JobSpec job = LlamaLoraJob(zerotrain::OptimizerConfig::ADAMW);
  job.mutable_model()->set_base_dtype(zerotrain::ModelConfig::NF4);
  const ModelLayout layout = BuildModelLayout(job.model());
  const MemoryPlan whole = PlanMemory(job);
  job.mutable_parallel()->set_world_size(4);
  job.mutable_parallel()->set_zero_stage(3);
  job.mutable_parallel()->set_reshard_after_forward(true);
  job.mutable_parallel()->set_prefetch_units(1);
  int64_t largest = 0;
  for (const UnitLayout& u : layout.units) {
    const QuantizedUnitBytes q = QuantizedBytesOf(layout, u);
    if (u.kind != UnitKind::kBlock) {
      EXPECT_TRUE(q.pieces.empty()) << u.name;
      continue;
    }
    ASSERT_EQ(q.pieces.size(), 4u * 4u) << u.name;  // 4 weights, 4 NF4 buffers each
    int64_t end = 0;
    for (const QuantizedPiece& piece : q.pieces) {
      const BufferSpec* b = nullptr;
      for (const BufferSpec& w : whole.buffers) {
        if (w.name == piece.name) b = &w;
      }
      ASSERT_NE(b, nullptr) << piece.name;
      EXPECT_EQ(piece.dtype, b->dtype) << piece.name;
      EXPECT_EQ(piece.shape, b->shape) << piece.name;
      EXPECT_EQ(piece.bytes, b->bytes()) << piece.name;
      EXPECT_EQ(piece.offset % kBufferAlignment, 0) << piece.name;
      EXPECT_GE(piece.offset, end) << piece.name;
      end = piece.offset + piece.bytes;
    }
    EXPECT_EQ(q.bytes, AlignedBytes(end)) << u.name;
    largest = std::max(largest, PaddedUnitNumel(q.words(), 4));
  }
  for (int r = 0; r < 4; ++r) {
    const MemoryPlan plan = PlanMemory(job, r);
    int shards = 0, gathers = 0;
    for (const BufferSpec& b : plan.buffers) {
      EXPECT_FALSE(IsQuantizedBaseBuffer(b.name)) << b.name;
      if (b.name.ends_with(".qbase")) {
        ++shards;
        const UnitLayout* u = nullptr;
        for (const UnitLayout& c : layout.units) {
          if (QuantizedShardName(c) == b.name) u = &c;
        }
        ASSERT_NE(u, nullptr) << b.name;
        EXPECT_EQ(b.numel(), PaddedUnitNumel(QuantizedBytesOf(layout, *u).words(), 4) / 4);
        EXPECT_TRUE(IsCheckpointed(b)) << b.name;  // a seeded base is saved
      }
      if (b.name.starts_with("qbase.gather.")) {
        ++gathers;
        EXPECT_EQ(b.numel(), largest) << b.name;
      }
    }
    EXPECT_EQ(shards, 3) << "rank " << r;   // one per block
    EXPECT_EQ(gathers, 2) << "rank " << r;  // prefetch_units + 1
  }
}

}  // namespace
}  // namespace zt
