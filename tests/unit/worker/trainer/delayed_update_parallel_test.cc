// The delayed parameter update (offload.delayed_update, worker/optim/delayed_host_step.h) beside
// tensor and pipeline parallelism, a summed Adafactor (ZeRO shard group, tensor-parallel group)
// and LoRA, on CPU ranks: each against the serial stale-parameter reference of its recurrence
// bit for bit (delayed_update_runs.h), resumed from a checkpoint bit for bit, and with the
// arenas the plan, whose only additions to the serial offload plan are the delayed update's
// host buffers.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/trainer/delayed_update_runs.h"
#include "tests/unit/worker/trainer/small_sharded_job.h"

namespace zt {
namespace {

using delayed_update_testing::DelayedUpdateRunTest;
using delayed_update_testing::Hold;
using delayed_update_testing::kAfterSteps;
using delayed_update_testing::kSteps;
using delayed_update_testing::SteppedRun;
using delayed_update_testing::TrainByHand;
using offload_testing::RunResult;
using zerotrain::JobSpec;
using zerotrain::OffloadConfig;
using zerotrain::OptimizerConfig;
using zerotrain::ParallelConfig;
using zerotrain::PrecisionConfig;

// A rank layout and what it trains.
struct Case {
  int tp = 1, pp = 1, dp = 2, stage = 1;
  OptimizerConfig::Type type = OptimizerConfig::ADAMW;
  PrecisionConfig::DType dtype = PrecisionConfig::FP32;
  bool llama = false;  // MakeSmallGqaLlama's model (untied, GQA) in place of the tied GPT-2
  bool lora = false;   // adapters on every adaptable module, over a base generated from the seed
  // ZeRO-3's tied embedding split by vocabulary rows (parallel.vocab_sharded_embedding), which
  // the harness's job otherwise gathers whole.
  bool vocab_sharded = false;
  bool nvme = false;  // offload.optimizer NVME (the states through the swap store) for CPU
  std::string Name() const {
    return absl::StrCat("tp", tp, " x pp", pp, " x dp", dp, " ZeRO ", stage, " ",
                        OptimizerConfig::Type_Name(type), " ", PrecisionConfig::DType_Name(dtype),
                        llama ? " llama" : " gpt2", lora ? " lora" : "",
                        vocab_sharded ? " vocab-sharded" : "", nvme ? " nvme" : "");
  }
};

class DelayedUpdateParallelTest : public DelayedUpdateRunTest {
 protected:
  // `c`'s job, 4 sequences a step (a pipeline's as 4 / dp micro-batches of one sequence under
  // 1F1B), kSteps steps; with `delayed`, offload.optimizer CPU and the delayed update after
  // kAfterSteps, else the reference's device optimizer.
  JobSpec Make(const Case& c, bool delayed) {
    const int world = c.tp * c.pp * c.dp;
    const OffloadConfig::Device offload = c.nvme ? OffloadConfig::NVME : OffloadConfig::CPU;
    JobSpec job = Job(world, c.stage, c.type, c.dtype, delayed ? offload : OffloadConfig::NONE);
    job.mutable_train()->set_max_steps(kSteps);
    const int accum = c.pp > 1 ? 4 / c.dp : 1;
    job.mutable_train()->set_micro_batch_size(4 / c.dp / accum);
    job.mutable_train()->set_grad_accum_steps(accum);
    job.mutable_parallel()->set_tensor_parallel(c.tp);
    job.mutable_parallel()->set_pipeline_parallel(c.pp);
    if (c.pp > 1) job.mutable_parallel()->set_pipeline_schedule(ParallelConfig::ONE_F_ONE_B);
    if (c.llama) testing::MakeSmallGqaLlama(job);
    if (c.lora) {
      auto* lora = job.mutable_model()->mutable_lora();
      lora->set_rank(4);
      lora->set_alpha(8.0f);
      for (const char* module : {"c_attn", "c_proj", "c_fc"}) lora->add_target_modules(module);
    }
    if (c.vocab_sharded) job.mutable_parallel()->set_vocab_sharded_embedding(true);
    job.mutable_offload()->mutable_delayed_update()->set_enabled(delayed);
    job.mutable_offload()->mutable_delayed_update()->set_after_steps(kAfterSteps);
    return job;
  }

  // The delayed run equals the stale reference bit for bit (ExpectTheReferenceRun).
  void ExpectTheStaleRecurrence(const Case& c) {
    const std::string what = c.Name();
    const SteppedRun delayed = TrainByHand(Make(c, true), false, Hold::kNothing);
    const SteppedRun reference = TrainByHand(Make(c, false), true, Hold::kNothing);
    delayed_update_testing::ExpectTheReferenceRun(delayed, reference, what);
  }

  // The delayed plan is the serial offload plan plus, for each trainable unit the rank steps,
  // exactly "<unit>.grads.host.1" (the gradient copies' second bank: the first bank's dtype
  // and size), "<unit>.params.host" (the updated shard: the parameters' dtype, the same element
  // count) and with NVME the first bank "<unit>.grads.host" too; the arenas hold the plan,
  // category by category, and nothing unclaimed.
  void ExpectThePlansHostBuffers(const Case& c) {
    SCOPED_TRACE(c.Name());
    JobSpec serial = Make(c, true);
    serial.mutable_offload()->mutable_delayed_update()->set_enabled(false);
    const RunResult run = Train(Make(c, true), kSteps);
    const RunResult base = Train(serial, kSteps);
    ASSERT_TRUE(run.status.ok()) << run.status;
    ASSERT_TRUE(base.status.ok()) << base.status;
    EXPECT_TRUE(run.unclaimed.empty()) << run.unclaimed[0];
    const int world = c.tp * c.pp * c.dp;
    ASSERT_EQ(run.plans.size(), static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) {
      std::map<std::string, BufferSpec> serial_buffers;
      for (const BufferSpec& b : base.plans[r].buffers) serial_buffers.emplace(b.name, b);
      std::set<std::string> added, expected;
      for (const BufferSpec& b : run.plans[r].buffers) {
        auto it = serial_buffers.find(b.name);
        if (it != serial_buffers.end()) {
          EXPECT_EQ(b.bytes(), it->second.bytes()) << "rank " << r << " " << b.name;
          continue;
        }
        added.insert(b.name);
        EXPECT_EQ(b.category, MemoryCategory::kPinnedHost) << "rank " << r << " " << b.name;
      }
      std::map<std::string, BufferSpec> delayed_buffers;
      for (const BufferSpec& b : run.plans[r].buffers) delayed_buffers.emplace(b.name, b);
      for (const auto& [name, b] : delayed_buffers) {
        if (!name.ends_with(".grads.host")) continue;
        const std::string unit = name.substr(0, name.size() - std::string(".grads.host").size());
        // NVME's serial step stages the gradients through its ring: the first bank is the
        // delayed update's too.
        if (c.nvme) expected.insert(name);
        expected.insert(name + ".1");
        expected.insert(unit + ".params.host");
        if (auto spare = delayed_buffers.find(name + ".1"); spare != delayed_buffers.end()) {
          EXPECT_EQ(spare->second.dtype, b.dtype) << spare->first;
          EXPECT_EQ(spare->second.numel(), b.numel()) << spare->first;
        }
        if (auto host = delayed_buffers.find(unit + ".params.host");
            host != delayed_buffers.end()) {
          // The parameters' dtype: the unit's ".params" (a LoRA unit's adapters are f32).
          auto params = delayed_buffers.find(c.lora ? unit : unit + ".params");
          ASSERT_NE(params, delayed_buffers.end()) << unit;
          EXPECT_EQ(host->second.dtype, params->second.dtype) << host->first;
          EXPECT_EQ(host->second.numel(), b.numel()) << host->first;
        }
      }
      EXPECT_FALSE(expected.empty()) << "rank " << r << ": no host step";
      EXPECT_EQ(added, expected) << "rank " << r;
      for (int k = 0; k < kMemoryCategoryCount; ++k) {
        const auto category = static_cast<MemoryCategory>(k);
        // The nvme category is the swap store's, never an arena's.
        EXPECT_EQ(run.arena_bytes[r][k],
                  category == MemoryCategory::kNvme ? 0 : run.plans[r].CategoryBytes(category))
            << "rank " << r << " " << MemoryCategoryName(category);
      }
    }
  }
};

// Tensor parallelism: each rank's shares are its units, stepped on the host beside the next
// step; the gradient norm's sum over the group stays on the compute thread.
TEST_F(DelayedUpdateParallelTest, TensorParallelEqualsTheStaleReference) {
  ExpectTheStaleRecurrence({.tp = 2, .dp = 1, .stage = 1, .llama = true});
  ExpectTheStaleRecurrence({.tp = 2, .dp = 2, .stage = 1});
  ExpectTheStaleRecurrence(
      {.tp = 2, .dp = 2, .stage = 3, .dtype = PrecisionConfig::BF16, .llama = true});
}

// Pipeline parallelism under 1F1B: each stage steps its own units; GPT-2's tied embedding has
// a copy on the first and the last stage whose gradients are summed on the compute thread
// before the hand-over, so both copies take the same delayed update.
TEST_F(DelayedUpdateParallelTest, PipelineStagesEqualTheStaleReference) {
  ExpectTheStaleRecurrence({.pp = 2, .dp = 1, .stage = 1});
  ExpectTheStaleRecurrence({.pp = 2, .dp = 2, .stage = 2, .dtype = PrecisionConfig::BF16});
  ExpectTheStaleRecurrence({.tp = 2, .pp = 2, .dp = 1, .stage = 1, .llama = true});
}

// Adafactor's factored statistics summed across the ZeRO shard group and the tensor-parallel
// group inside the host step, over contexts of their own (worker/shard/host_step_sums.h).
TEST_F(DelayedUpdateParallelTest, SummedAdafactorEqualsTheStaleReference) {
  ExpectTheStaleRecurrence({.stage = 1, .type = OptimizerConfig::ADAFACTOR});
  ExpectTheStaleRecurrence(
      {.stage = 2, .type = OptimizerConfig::ADAFACTOR, .dtype = PrecisionConfig::BF16});
  ExpectTheStaleRecurrence(
      {.tp = 2, .dp = 2, .stage = 1, .type = OptimizerConfig::ADAFACTOR, .llama = true});
}

// LoRA: the trained units are the adapters, whose gradients' host copies have two banks
// ("<block>.lora.grads.host" and ".1") as a full unit's do, so the next backward's copies never
// overwrite what the delayed step reads; the updated adapters land in "<block>.lora.params.host".
TEST_F(DelayedUpdateParallelTest, LoraAdaptersEqualTheStaleReference) {
  ExpectTheStaleRecurrence({.stage = 1, .lora = true});
  ExpectTheStaleRecurrence({.stage = 3, .dtype = PrecisionConfig::BF16, .lora = true});
  ExpectTheStaleRecurrence({.stage = 2, .type = OptimizerConfig::ADAFACTOR, .lora = true});
  // offload.optimizer NVME: the adapters' banks are planned as CPU offload's.
  ExpectTheStaleRecurrence({.stage = 2, .lora = true, .nvme = true});
}

// ZeRO-3's tied embedding split by vocabulary rows: the lookup and the head read the rank's
// rows where they are, never gathered, and their collectives run in the forward and backward
// on the compute thread; the host step updates the rows in "<embedding>.params.host" as any
// shard, uploaded once the next backward has ended.
TEST_F(DelayedUpdateParallelTest, VocabularyShardedEmbeddingEqualsTheStaleReference) {
  const Case fp32{.stage = 3, .vocab_sharded = true};
  const Case bf16{.stage = 3, .dtype = PrecisionConfig::BF16, .vocab_sharded = true};
  for (const Case& c : {fp32, bf16}) {
    ASSERT_TRUE(VocabularyShardedEmbedding(ValidatedJob(Make(c, true)).value())) << c.Name();
    ExpectTheStaleRecurrence(c);
  }
  ExpectResumesBitForBit(Make(fp32, true), fp32.Name());
}

TEST_F(DelayedUpdateParallelTest, ResumesFromACheckpointBitForBit) {
  for (const Case& c :
       {Case{.tp = 2, .dp = 1, .stage = 1, .llama = true}, Case{.pp = 2, .dp = 1, .stage = 1},
        Case{.stage = 2, .type = OptimizerConfig::ADAFACTOR}, Case{.stage = 3, .lora = true}}) {
    ExpectResumesBitForBit(Make(c, true), c.Name());
  }
}

TEST_F(DelayedUpdateParallelTest, ArenasAreThePlanWithTheDelayedUpdatesHostBuffers) {
  ExpectThePlansHostBuffers({.tp = 2, .pp = 2, .dp = 1, .stage = 1, .llama = true});
  ExpectThePlansHostBuffers({.pp = 2, .dp = 2, .stage = 3, .dtype = PrecisionConfig::BF16});
  ExpectThePlansHostBuffers({.stage = 1, .lora = true});
  ExpectThePlansHostBuffers({.stage = 3, .dtype = PrecisionConfig::BF16, .lora = true});
  ExpectThePlansHostBuffers({.stage = 2, .lora = true, .nvme = true});
}

}  // namespace
}  // namespace zt
