// A quantized (NF4 or INT8) base at ZeRO stage 3 (docs/lora.md, "The step loop"): each rank
// holds its shard of every block's quantized bytes ("<unit>.qbase", worker/plan/lora_plan.h) and
// gathers a block's bytes before each use. 2 ranks match one rank; the shards put together are
// the one-rank base bit for bit; each rank's arenas hold half the (padded) base and exactly what
// the plan says; checkpoints resume at stage 3 and across stage 3 and world sizes; a base
// streamed from model.init_from keeps only the shard; the merged export of a stage-3
// checkpoint is the dequantized base plus scale·B·A.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/nf4.h"
#include "tests/unit/worker/trainer/lora_training_fixture.h"
#include "worker/job/job_validation.h"
#include "worker/checkpoint/lora_export.h"
#include "worker/model/param_layout.h"
#include "worker/plan/lora_plan.h"
#include "worker/plan/memory_plan.h"

namespace zt {
namespace {

using testing::ExpectMatches;
using testing::ExportBase;
using testing::LoraRun;
using testing::MakeHfBase;
using testing::MergedSiteError;
using testing::ReadTensor;
using zerotrain::JobSpec;
using zerotrain::ModelConfig;

using BaseMap = std::map<std::string, std::vector<char>>;

class LoraShardedBaseTest : public testing::LoraTrainingTest {
 protected:
  JobSpec BaseJob(int world, int stage, ModelConfig::BaseDType base) {
    // The same global batch of 4 rows on every layout.
    return Job(world, stage, 4 / world, 1, ModelConfig::LLAMA, base);
  }
};

// Unit u's whole quantized bytes: every rank's "<unit>.qbase" shard, in rank order (what the
// all-gather assembles).
std::vector<char> Gathered(const LoraRun& run, const UnitLayout& u) {
  std::vector<char> out;
  for (const BaseMap& rank : run.rank_base_after) {
    const std::vector<char>& shard = rank.at(QuantizedShardName(u));
    out.insert(out.end(), shard.begin(), shard.end());
  }
  return out;
}

// Each block's gathered quantized bytes hold, piece by piece, the bytes of `whole`'s
// per-tensor buffers (a run below stage 3), and zeros between and after them.
void ExpectGatheredIsWhole(const LoraRun& sharded, const BaseMap& whole, const ModelLayout& layout,
                           const std::string& what) {
  int checked = 0;
  for (const UnitLayout& u : layout.units) {
    const QuantizedUnitBytes q = QuantizedBytesOf(layout, u);
    if (q.pieces.empty()) continue;
    const std::vector<char> gathered = Gathered(sharded, u);
    ASSERT_GE(static_cast<int64_t>(gathered.size()), q.bytes) << what << " " << u.name;
    std::vector<char> want(gathered.size(), 0);
    for (const QuantizedPiece& piece : q.pieces) {
      const std::vector<char>& buffer = whole.at(piece.name);
      ASSERT_EQ(static_cast<int64_t>(buffer.size()), piece.bytes) << what << " " << piece.name;
      std::memcpy(want.data() + piece.offset, buffer.data(), buffer.size());
      ++checked;
    }
    EXPECT_TRUE(gathered == want) << what << ": " << u.name << "'s gathered bytes differ";
  }
  EXPECT_GT(checked, 0) << what;
}

TEST_F(LoraShardedBaseTest, TwoRanksAtStageThreeMatchOneRankAndHoldHalfTheBase) {
  for (const auto base : {ModelConfig::NF4, ModelConfig::INT8}) {
    const std::string what(ModelConfig::BaseDType_Name(base));
    const LoraRun reference = Train(BaseJob(1, 0, base), 5);
    ASSERT_EQ(reference.losses.size(), 5u) << what;
    const LoraRun sharded = Train(BaseJob(2, 3, base), 5);
    // ExpectMatches' bounds: the quantized layers compute the same bits per token on any
    // layout, so the runs differ only by the adapters' fp32 reduction order.
    ExpectMatches(sharded, reference, what + " stage 3 on 2 ranks");
    const ModelLayout layout = BuildModelLayout(ValidatedJob(BaseJob(2, 3, base)).value().model());
    ExpectGatheredIsWhole(sharded, reference.base_after, layout, what);
    // The other gather layouts: a block kept gathered from its forward to its backward (its
    // own "<unit>.qbase.gathered"), and two blocks gathered ahead (three "qbase.gather.<k>").
    JobSpec keep = BaseJob(2, 3, base);
    keep.mutable_parallel()->set_reshard_after_forward(false);
    ExpectMatches(Train(keep, 5), reference, what + " without reshard_after_forward");
    JobSpec ahead = BaseJob(2, 3, base);
    ahead.mutable_parallel()->set_prefetch_units(2);
    ExpectMatches(Train(ahead, 5), reference, what + " prefetching 2 units");

    // Each rank's plan holds its half of every block's padded quantized bytes and no per-tensor
    // buffer; the arenas carve exactly what the plan says, per category.
    const MemoryPlan one = PlanMemory(ValidatedJob(BaseJob(1, 3, base)).value(), 0);
    for (int r = 0; r < 2; ++r) {
      const MemoryPlan plan = PlanMemory(ValidatedJob(BaseJob(2, 3, base)).value(), r);
      int64_t shards = 0, whole = 0, padded = 0;
      for (const BufferSpec& b : plan.buffers) {
        EXPECT_FALSE(IsQuantizedBaseBuffer(b.name)) << what << ": " << b.name;
        if (b.name.ends_with(".qbase")) shards += b.bytes();
      }
      for (const BufferSpec& b : one.buffers) {
        if (b.name.ends_with(".qbase")) whole += b.bytes();
      }
      for (const UnitLayout& u : layout.units) {
        const QuantizedUnitBytes q = QuantizedBytesOf(layout, u);
        if (!q.pieces.empty()) padded += 4 * PaddedUnitNumel(q.words(), 2);
      }
      EXPECT_EQ(2 * shards, padded) << what << " rank " << r;
      // One rank's padding quantum is half of two ranks': at most 64 words more per block.
      EXPECT_LE(2 * shards - whole, 2 * 64 * 4) << what << " rank " << r;
      EXPECT_GT(shards, 0) << what;
      for (int c = 0; c < kMemoryCategoryCount; ++c) {
        const auto& [arena, planned] = sharded.arena_and_plan_bytes[r][c];
        EXPECT_EQ(arena, planned) << what << " rank " << r << " category " << c;
        EXPECT_EQ(planned, plan.CategoryBytes(static_cast<MemoryCategory>(c))) << what;
      }
    }
    // What `zt estimate` shows as the base: each of 2 ranks at stage 3 holds about half of what
    // one rank holds at stage 0 (the unquantized rest is sharded too; padding aside).
    const int64_t divided =
        LoraBreakdown(PlanMemory(ValidatedJob(BaseJob(2, 3, base)).value(), 0)).base_bytes;
    const int64_t undivided =
        LoraBreakdown(PlanMemory(ValidatedJob(BaseJob(1, 0, base)).value(), 0)).base_bytes;
    EXPECT_LT(divided, undivided * 6 / 10) << what;
    EXPECT_GT(divided, undivided * 4 / 10) << what;
  }
}

TEST_F(LoraShardedBaseTest, ResumesAtStageThreeAndAcrossWorldSizesAndStages) {
  for (const auto base : {ModelConfig::NF4, ModelConfig::INT8}) {
    const std::string what(ModelConfig::BaseDType_Name(base));
    // Saved by 2 ranks at stage 3: the seeded base as each rank's shard.
    JobSpec job = BaseJob(2, 3, base);
    job.mutable_train()->set_max_steps(6);
    const LoraRun uninterrupted = Train(job, 6);
    const std::filesystem::path ckpt = dir_ / ("ckpt-stage3-" + what);
    job.mutable_checkpoint()->set_dir(ckpt.string());
    job.mutable_checkpoint()->set_interval_steps(3);
    ASSERT_EQ(Train(job, 3).losses.size(), 3u) << what;
    TrainOptions resume;
    resume.resume_dir = ckpt.string();
    // Resumed on 1 rank at stage 3 (the shards resharded by byte range) and at stage 0 (the
    // shards cut back into per-tensor buffers), before the bit-for-bit resume below writes a
    // later checkpoint there: the base bit for bit, the losses within the TwoRanks bounds
    // (the adapters' reduction order of the remaining steps).
    for (const int stage : {3, 0}) {
      JobSpec one = job;
      one.mutable_parallel()->set_world_size(1);
      one.mutable_parallel()->set_zero_stage(stage);
      one.mutable_train()->set_micro_batch_size(4);
      one.mutable_checkpoint()->set_dir((dir_ / absl::StrCat("unused-", what, stage)).string());
      const LoraRun resumed = Train(one, 6, resume);
      ASSERT_EQ(resumed.losses.size(), 3u) << what << " on 1 rank at " << stage;
      for (size_t s = 0; s < 3; ++s) {
        EXPECT_NEAR(resumed.losses[s], uninterrupted.losses[3 + s],
                    1e-5 * uninterrupted.losses[3 + s])
            << what << " on 1 rank at " << stage << " step " << s + 4;
      }
      const ModelLayout layout = BuildModelLayout(ValidatedJob(one).value().model());
      if (stage == 0) {
        ExpectGatheredIsWhole(uninterrupted, resumed.base_after, layout, what + " to stage 0");
      } else {
        for (const UnitLayout& u : layout.units) {
          if (QuantizedBytesOf(layout, u).pieces.empty()) continue;
          const std::vector<char> whole = Gathered(uninterrupted, u);
          const std::vector<char>& got = resumed.base_after.at(QuantizedShardName(u));
          ASSERT_LE(got.size(), whole.size()) << what << " " << u.name;
          EXPECT_TRUE(std::equal(got.begin(), got.end(), whole.begin())) << what << " " << u.name;
        }
      }
    }
    // Bit for bit on the saved layout.
    const LoraRun second = Train(job, 6, resume);
    ASSERT_EQ(second.losses.size(), 3u) << what;
    for (size_t s = 0; s < 3; ++s) {
      EXPECT_EQ(second.losses[s], uninterrupted.losses[3 + s]) << what << " step " << s + 4;
    }
    EXPECT_TRUE(second.rank_base_after == uninterrupted.rank_base_after) << what;
  }
  // The other way: a one-rank stage-0 checkpoint resumed by 2 ranks at stage 3.
  JobSpec one = BaseJob(1, 0, ModelConfig::NF4);
  one.mutable_train()->set_max_steps(6);
  const LoraRun stayed = Train(one, 6);
  one.mutable_checkpoint()->set_dir((dir_ / "ckpt-stage0").string());
  one.mutable_checkpoint()->set_interval_steps(3);
  ASSERT_EQ(Train(one, 3).losses.size(), 3u);
  JobSpec two = BaseJob(2, 3, ModelConfig::NF4);
  two.mutable_train()->set_max_steps(6);
  two.mutable_checkpoint()->set_dir((dir_ / "unused-two").string());
  TrainOptions resume;
  resume.resume_dir = (dir_ / "ckpt-stage0").string();
  const LoraRun resumed = Train(two, 6, resume);
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_NEAR(resumed.losses[s], stayed.losses[3 + s], 1e-5 * stayed.losses[3 + s]);
  }
  ExpectGatheredIsWhole(resumed, stayed.base_after,
                        BuildModelLayout(ValidatedJob(two).value().model()), "stage 0 to 3");
}

// model.init_from at stage 3 on 2 ranks: each rank streams the file and keeps only its shard of
// the quantized bytes; together they are the one-rank streamed base bit for bit, and the run
// matches one rank.
TEST_F(LoraShardedBaseTest, TwoRanksStreamAQuantizedBaseIntoTheirShards) {
  for (const auto base : {ModelConfig::NF4, ModelConfig::INT8}) {
    const std::string what(ModelConfig::BaseDType_Name(base));
    const std::string hf =
        ExportBase(MakeHfBase(BaseJob(1, 0, base)),
                   (dir_ / ("base-" + what + ".safetensors")).string(), DType::kBF16);
    JobSpec one = BaseJob(1, 0, base);
    one.mutable_model()->set_init_from(hf);
    JobSpec two = BaseJob(2, 3, base);
    two.mutable_model()->set_init_from(hf);
    const LoraRun reference = Train(one, 3);
    ASSERT_EQ(reference.losses.size(), 3u) << what;
    const LoraRun sharded = Train(two, 3);
    ExpectMatches(sharded, reference, what + " streamed at stage 3");
    ExpectGatheredIsWhole(sharded, reference.base_after,
                          BuildModelLayout(ValidatedJob(two).value().model()), what);
    // The shards are reloaded from the file, not saved.
    for (const BufferSpec& b : PlanMemory(ValidatedJob(two).value(), 1).buffers) {
      if (b.name.ends_with(".qbase")) EXPECT_FALSE(IsCheckpointed(b)) << what << " " << b.name;
    }
  }
}

TEST_F(LoraShardedBaseTest, MergedExportOfAStageThreeCheckpointIsTheDequantizedBasePlusAdapters) {
  JobSpec job = BaseJob(2, 3, ModelConfig::NF4);
  job.mutable_train()->set_max_steps(3);
  job.mutable_optimizer()->set_lr(1e-2f);
  const std::filesystem::path ckpt = dir_ / "ckpt-merge-stage3";
  job.mutable_checkpoint()->set_dir(ckpt.string());
  const LoraRun run = Train(job, 3);
  ASSERT_EQ(run.losses.size(), 3u);
  const JobSpec validated = ValidatedJob(job).value();
  const ModelLayout layout = BuildModelLayout(validated.model());
  const std::string merged = (dir_ / "merged-stage3").string();
  absl::StatusOr<LoraExportResult> exported =
      ExportLoraCheckpoint(ckpt.string(), merged, {.merge_adapters = true});
  ASSERT_TRUE(exported.ok()) << exported.status();
  const std::string file = (std::filesystem::path(merged) / "model.safetensors").string();

  // Block 1's q/k/v weight as the job computed with it: its NF4 pieces out of the ranks'
  // shards put together, dequantized.
  const UnitLayout& block = layout.block(1);
  const ParamSpec& w = *block.Find("attn.qkv.weight");
  std::vector<char> gathered = Gathered(run, block);
  auto piece = [&](const std::string& part, DType dtype) {
    for (const QuantizedPiece& p : QuantizedBytesOf(layout, block).pieces) {
      if (p.name != "block.1.nf4.attn.qkv.weight." + part) continue;
      return Tensor(gathered.data() + p.offset, dtype,
                    {p.bytes / static_cast<int64_t>(DTypeSize(dtype))});
    }
    ADD_FAILURE() << part;
    return Tensor();
  };
  const Nf4Tensor q{.numel = w.numel,
                    .codes = piece("codes", DType::kU8),
                    .absmax = piece("absmax", DType::kU8),
                    .absmax_scale = piece("absmax_scale", DType::kF32),
                    .absmax_offset = piece("absmax_offset", DType::kF32)};
  std::vector<float> dequantized(static_cast<size_t>(w.numel));
  ASSERT_TRUE(Nf4Dequantize(CpuContext(1),
                            {.src = q, .dst = Tensor(dequantized.data(), DType::kF32, {w.numel})})
                  .ok());
  const double scale = validated.model().lora().alpha() / validated.model().lora().rank();
  const float* adapters = run.adapters[0][2].data();
  const int64_t in = w.shape[1], r = validated.model().lora().rank();
  int sites = 0;
  for (const LoraSite& site : block.lora) {
    if (site.weight != "attn.qkv.weight") continue;
    ++sites;
    const std::vector<float> got = ReadTensor(file, "model.layers.1." + site.hf_path + ".weight");
    ASSERT_EQ(static_cast<int64_t>(got.size()), site.rows * in) << site.hf_path;
    const double worst =
        MergedSiteError(site, dequantized.data(), adapters, in, r, scale, got).worst;
    // One f32 rounding of a value below 1 (the merge sums in float64 and rounds once).
    EXPECT_LT(worst, 1e-6) << site.hf_path;
  }
  EXPECT_EQ(sites, 3);  // q, k, v
}

}  // namespace
}  // namespace zt
