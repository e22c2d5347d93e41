// QLoRA from model.init_from on pipeline stages: each stage streams only its own units' tensors
// from the Hugging Face file (and the embedding's wte when its head holds the tied copy), and
// quantizes its blocks' weights into its own units as one rank quantizes them
// (Trainer::StreamQuantizedBase). NF4 (double-quantized: codes, 8-bit absmax codes, group scales
// and offset) and INT8 (codes, row scales), GPT-2 (tied) and Llama (GQA, untied), on PP2,
// PP2 × DP2 (ZeRO-1, and ZeRO-3 where the stage's quantized bytes are sharded) and TP2 × PP2,
// against one rank streaming the same file; and resumed from step 5 (the base is not saved: each
// start streams it again).
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/trainer/lora_parallel_runs.h"

namespace zt {
namespace {

// The runs, checks and fixture, with JobSpec, ModelConfig and ParallelConfig.
using namespace lora_parallel_testing;  // NOLINT: lora_parallel_runs.h's names

// Every quantized base buffer (NF4 codes, absmax codes, absmax_scale, absmax_offset; INT8 codes
// and scales) of every rank of `got` against one rank's buffer of the same name, bit for bit:
// each stage's units' quantized base is exactly one rank's. ExpectSame compares every base
// buffer too; this makes sure the quantized ones were there to compare, on every rank that holds
// a block.
void ExpectOneRanksQuantizedBuffers(const Outcome& got, const Outcome& one,
                                    const std::string& what) {
  ASSERT_TRUE(got.status.ok()) << what << ": " << got.status;
  ASSERT_TRUE(one.status.ok()) << what << ": " << one.status;
  int one_rank_buffers = 0;
  for (const auto& [name, bytes] : one.ranks[0].base_before) {
    one_rank_buffers += IsQuantizedBaseBuffer(name) ? 1 : 0;
  }
  ASSERT_GT(one_rank_buffers, 0) << what;
  // The stages of one data-parallel / tensor-parallel replica hold every block between them.
  std::vector<std::string> seen;
  for (size_t r = 0; r < got.ranks.size(); ++r) {
    int compared = 0;
    for (const auto& [name, bytes] : got.ranks[r].base_before) {
      if (!IsQuantizedBaseBuffer(name)) continue;
      const auto it = one.ranks[0].base_before.find(name);
      ASSERT_NE(it, one.ranks[0].base_before.end()) << what << " rank " << r << " " << name;
      EXPECT_TRUE(bytes == it->second) << what << " rank " << r << " " << name;
      seen.push_back(name);
      ++compared;
    }
    EXPECT_GT(compared, 0) << what << " rank " << r << ": no quantized buffer";
  }
  std::sort(seen.begin(), seen.end());
  seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
  EXPECT_EQ(static_cast<int>(seen.size()), one_rank_buffers) << what << ": every block's base";
}

// NF4 and INT8 bases streamed from an f32 Hugging Face file of another seed's weights
// (ExportOtherSeedBase) onto PP2 and PP2 × DP2 at ZeRO-1: every rank's quantized buffers are one
// rank's of the same name bit for bit (each stage quantizes whole weights of its own blocks as
// one rank does: no block, scale or absmax group spans units), the unquantized base too
// (ExpectSame, with the head stage's tied wte copy the embedding's); the runs are one rank's
// within the bounds the seeded base is held to on stages: the f32 bounds for NF4 and for INT8
// on PP2 (QloraNf4BaseOnTwoStagesMatchesOneRank, Int8BaseStagesQuantizeAsOneRankBitForBit), and
// INT8 on PP2 × DP2 at Int8BaseStagesQuantizeAsOneRankBitForBit's bounds (step 1 at 1e-8, every
// step 1e-5 in the loss and 1e-4 in the norm: LLM.int8()'s per-token activation rounding turns
// DP's reduction-order noise into a quantization step; the reasoning there). A stage handed
// another stage's tensor by the stream is an error (Trainer::StreamQuantizedBase).
TEST_F(LoraParallelTrainingTest, QloraStagesStreamTheirOwnUnitsAsOneRankBitForBit) {
  for (const bool llama : {false, true}) {
    const std::string family = llama ? "llama" : "gpt2";
    const std::string hf = (dir_ / absl::StrCat("stage-base-", llama, ".safetensors")).string();
    ASSERT_TRUE(ExportOtherSeedBase(Job(llama, 1, 1, 0, 1, ParallelConfig::ONE_F_ONE_B), hf).ok())
        << family;
    for (const auto dtype : {ModelConfig::NF4, ModelConfig::INT8}) {
      const bool nf4 = dtype == ModelConfig::NF4;
      const auto job = [&](int pp, int dp, int zero, int micro_batch) {
        JobSpec j = Job(llama, pp, dp, zero, micro_batch, ParallelConfig::ONE_F_ONE_B, dtype);
        j.mutable_model()->set_init_from(hf);
        return j;
      };
      const std::string base = absl::StrCat(family, nf4 ? " nf4" : " int8", " init_from");
      {
        const Outcome one = RunAll(job(1, 1, 0, 1), 10);
        const Outcome pp2 = RunAll(job(2, 1, 0, 1), 10);
        ExpectOneRanksQuantizedBuffers(pp2, one, base + " pp2");
        ExpectSame(pp2, one, base + " pp2");
      }
      const std::string what = base + " pp2 x dp2 zero-1";
      const Outcome one = RunAll(job(1, 1, 0, 2), 10);
      const Outcome staged = RunAll(job(2, 2, 1, 1), 10);
      ExpectOneRanksQuantizedBuffers(staged, one, what);
      if (nf4) {
        ExpectSame(staged, one, what);
        continue;
      }
      ASSERT_TRUE(staged.status.ok()) << what;
      for (size_t k = 0; k < staged.ranks.size(); ++k) {
        const RankRun& r = staged.ranks[k];
        ASSERT_EQ(r.losses.size(), 10u) << what;
        EXPECT_TRUE(r.off_plan.empty()) << what << " rank " << k << ": " << r.off_plan.front();
        for (size_t s = 0; s < 10; ++s) {
          const double want = one.ranks[0].losses[s], norm = one.ranks[0].grad_norms[s];
          EXPECT_NEAR(r.losses[s], want, (s == 0 ? 1e-8 : 1e-5) * want)
              << what << " rank " << k << " step " << s + 1;
          EXPECT_NEAR(r.grad_norms[s], norm, 1e-4 * norm)
              << what << " rank " << k << " gradient norm, step " << s + 1;
        }
      }
    }
  }
}

// The stream into ZeRO-3 stages (PP2 × DP2: each rank keeps its range of its stage's blocks'
// quantized bytes, "<unit>.qbase") and into TP2 × PP2 (each stage's TP ranks quantize each of the
// stage's weights whole and keep their shares; the model widened so NF4 shares hold whole
// 64-element blocks, CheckEngineSupport's rule). NF4, GPT-2 and Llama, against one rank
// streaming the same file: TP2 × PP2's every dequantized share is one rank's slice bit for bit
// (ExpectOneRankSlices), both runs within the f32 bounds (ExpectSame; a ZeRO-3 byte shard has no
// one-rank buffer of its name, so the losses are what check it: a wrong byte range moves step 1
// far beyond 1e-6). INT8 on TP2 × PP2 at the INT8 TP bounds (activation rounding over a
// row-parallel share's columns, kInt8TpLossBound's note).
TEST_F(LoraParallelTrainingTest, QloraStreamedIntoZeroThreeAndTensorParallelStagesIsOneRanks) {
  for (const bool llama : {false, true}) {
    const std::string family = llama ? "llama" : "gpt2";
    const std::string hf = WideHfBase(llama, absl::StrCat("wide-base-", llama, ".safetensors"));
    const auto job = [&](int pp, int dp, int zero, int micro_batch, ModelConfig::BaseDType dtype) {
      JobSpec j = Wide(Job(llama, pp, dp, zero, micro_batch, ParallelConfig::ONE_F_ONE_B, dtype));
      j.mutable_model()->set_init_from(hf);
      return j;
    };
    ExpectSame(RunAll(job(2, 2, 3, 1, ModelConfig::NF4), 10),
               RunAll(job(1, 1, 0, 2, ModelConfig::NF4), 10),
               family + " nf4 init_from pp2 x dp2 zero-3");
    for (const auto dtype : {ModelConfig::NF4, ModelConfig::INT8}) {
      const std::string what = absl::StrCat(family, dtype == ModelConfig::NF4 ? " nf4" : " int8",
                                            " init_from tp2 x pp2");
      JobSpec both = job(2, 1, 0, 1, dtype);
      both.mutable_parallel()->set_world_size(4);
      both.mutable_parallel()->set_tensor_parallel(2);
      const Outcome one = RunAll(job(1, 1, 0, 1, dtype), 10);
      const Outcome got = RunAll(both, 10);
      ExpectOneRankSlices(got, one, what);
      if (dtype == ModelConfig::NF4) {
        ExpectSame(got, one, what);
      } else {
        ExpectWithinInt8ActivationRounding(got, one, what);
      }
    }
  }
}

// Resumes on the saved layout with a quantized base: PP2 streamed from model.init_from (NF4 and
// INT8; the base is not in the checkpoint, the resuming start streams it again) and seeded NF4
// and INT8 bases on TP2 × PP2 and TP2 × DP2 (ZeRO-1; the base saved per rank: its shares). Steps
// 6–10 are the uninterrupted run's bit for bit (the same layout runs the same ops in the same
// order), the adapters equal, and every rank's base after the resume the uninterrupted run's.
TEST_F(LoraParallelTrainingTest, QuantizedBasesOnStagesAndTensorParallelRanksResumeBitForBit) {
  struct Case {
    bool llama;
    ModelConfig::BaseDType dtype;
    int tp, pp, dp;
    bool streamed;
  };
  const std::string hf = WideHfBase(true, "resume-base.safetensors");
  for (const Case& c :
       {Case{true, ModelConfig::NF4, 1, 2, 1, true}, Case{true, ModelConfig::INT8, 1, 2, 1, true},
        Case{false, ModelConfig::NF4, 2, 2, 1, false},
        Case{true, ModelConfig::INT8, 2, 2, 1, false},
        Case{true, ModelConfig::NF4, 2, 1, 2, false}}) {
    JobSpec job =
        Wide(Job(c.llama, c.pp, c.dp, c.dp > 1 ? 1 : 0, 1, ParallelConfig::ONE_F_ONE_B, c.dtype));
    job.mutable_parallel()->set_world_size(c.tp * c.pp * c.dp);
    job.mutable_parallel()->set_tensor_parallel(c.tp);
    if (c.streamed) job.mutable_model()->set_init_from(hf);
    const std::string what =
        absl::StrCat(c.llama ? "llama" : "gpt2", c.dtype == ModelConfig::NF4 ? " nf4" : " int8",
                     c.streamed ? " init_from" : " seeded", " tp", c.tp, " pp", c.pp, " dp", c.dp);
    const std::string dir =
        (dir_ / absl::StrCat("qresume-", c.llama, static_cast<int>(c.dtype), c.tp, c.pp, c.dp))
            .string();
    const auto [whole, resumed] = RunStraightAndResumed(job, job, dir, what);
    ASSERT_TRUE(whole.status.ok() && resumed.status.ok()) << what;
    ASSERT_EQ(resumed.ranks.size(), whole.ranks.size()) << what;
    for (size_t k = 0; k < resumed.ranks.size(); ++k) {
      const RankRun& r = resumed.ranks[k];
      ASSERT_EQ(r.losses.size(), 5u) << what;
      for (int s = 0; s < 5; ++s) {
        EXPECT_EQ(r.losses[s], whole.ranks[k].losses[5 + s])
            << what << " rank " << k << ", step " << 6 + s;
        EXPECT_EQ(r.grad_norms[s], whole.ranks[k].grad_norms[5 + s])
            << what << " rank " << k << ", step " << 6 + s;
      }
      EXPECT_TRUE(r.adapters == whole.ranks[k].adapters) << what << " rank " << k;
      EXPECT_TRUE(r.base_after == whole.ranks[k].base_after) << what << " rank " << k;
    }
  }
}

}  // namespace
}  // namespace zt
