// Checkpoints and exact resume: a run stopped after step 10 and resumed from its checkpoint
// continues bit for bit as the run that never stopped (same world size), under ZeRO stages 0,
// 2 and 3, fp32 and fp16 with its loss scaler, AdamW and 8-bit AdamW; a corrupt checkpoint is
// refused by name or skipped with --fallback; another layout reshards on read (AdamW, 8-bit
// AdamW, Adafactor); another model, optimizer configuration or global batch is refused.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/quantization.h"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "tests/unit/worker/trainer/small_sharded_job.h"
#include "worker/checkpoint/checkpoint_owner.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/comm/store.h"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"
#include "worker/model/param_layout.h"
#include "worker/checkpoint/optimizer_state_reshard.h"
#include "worker/plan/arena.h"
#include "worker/plan/memory_plan.h"
#include "worker/checkpoint/rank_state.h"
#include "worker/train/trainer.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using zerotrain::JobSpec;

// One rank's checkpointed buffers: name → bytes.
using RankBuffers = std::map<std::string, std::vector<uint8_t>>;
// Each tensor's optimizer states over the whole tensor, as f32: "<unit>.<tensor>.<state>" →
// values. 8-bit moments are dequantized as the kernel does (map[code] · absmax) and come with
// "<...>.step": at each element, the larger gap from its code's map value to a neighbouring
// one, times the block's absmax — one quantization step of that block there.
using StateValues = std::map<std::string, std::vector<float>>;

std::vector<float> F32At(const std::vector<uint8_t>& bytes, int64_t offset, int64_t n) {
  std::vector<float> out(n);
  std::memcpy(out.data(), bytes.data() + offset * sizeof(float), n * sizeof(float));
  return out;
}

StateValues GatherStates(const JobSpec& job, const std::vector<RankBuffers>& ranks) {
  const zerotrain::OptimizerConfig& config = job.optimizer();
  const int64_t block = config.quant_block_size();
  StateValues out;
  for (const UnitLayout& unit : BuildModelLayout(job.model()).units) {
    for (size_t r = 0; r < ranks.size(); ++r) {
      const UnitOptimizerState state =
          OptimizerStateFor(config, unit, OptimizerRangeOf(job, static_cast<int>(r), unit));
      for (size_t i = 0; i < unit.params.size(); ++i) {
        const ParamSpec& p = unit.params[i];
        const TensorState& t = state.tensors[i];
        const std::string key = unit.name + "." + p.name + ".";
        auto bytes = [&](int k) -> const std::vector<uint8_t>& {
          return ranks[r].at(unit.name + "." + state.buffers[t.slices[k].buffer].name);
        };
        auto slice = [&](int k) { return F32At(bytes(k), t.slices[k].offset, t.slices[k].numel); };
        auto put = [&](const std::string& state_name, const std::vector<float>& part) {
          std::vector<float>& whole = out[key + state_name];
          whole.resize(p.numel);
          std::copy(part.begin(), part.end(), whole.begin() + t.begin);
        };
        switch (t.kind) {
          case TensorState::Kind::kFp32Moments:
            put("m", slice(0));
            put("v", slice(1));
            break;
          case TensorState::Kind::kMomentum:
            put("momentum", slice(0));
            break;
          case TensorState::Kind::kFull:
            put("full", slice(0));
            if (t.slices.size() > 1) put("m", slice(1));
            break;
          case TensorState::Kind::kFactored:
            out[key + "row"] = slice(0);
            out[key + "col"] = slice(1);
            if (t.slices.size() > 2) put("m", slice(2));
            break;
          case TensorState::Kind::kQuantizedMoments:
            for (const auto& [name, codes, absmax, map] :
                 {std::tuple{"m", 0, 2, &DynamicMapSigned()},
                  std::tuple{"v", 1, 3, &DynamicMapUnsigned()}}) {
              const std::vector<float> scales = slice(absmax);
              std::vector<float> values(t.end - t.begin), steps(t.end - t.begin);
              for (int64_t e = 0; e < t.end - t.begin; ++e) {
                const int c = bytes(codes)[t.slices[codes].offset + e];
                const float a = scales[e / block];
                values[e] = (*map)[c] * a;
                const float below = c > 0 ? (*map)[c] - (*map)[c - 1] : 0.0f;
                const float above = c < 255 ? (*map)[c + 1] - (*map)[c] : 0.0f;
                steps[e] = std::max(below, above) * a;
              }
              put(name, values);
              put(std::string(name) + ".step", steps);
            }
            break;
          case TensorState::Kind::kStateless:
          case TensorState::Kind::kNone:
            break;
        }
      }
    }
  }
  return out;
}

// What `what` says about the states: how many elements were compared and how many of those
// were requantized to another value.
struct StateComparison {
  int64_t elements = 0;
  int64_t quantized = 0;
  int64_t requantized_differently = 0;
};

StateComparison CompareStates(const StateValues& saved, const StateValues& got,
                              const std::string& what) {
  StateComparison c;
  EXPECT_EQ(saved.size(), got.size()) << what;
  for (const auto& [key, want] : saved) {
    if (key.ends_with(".step")) continue;
    const auto it = got.find(key);
    if (it == got.end()) {
      ADD_FAILURE() << what << ": no state " << key;
      continue;
    }
    const std::vector<float>& have = it->second;
    c.elements += static_cast<int64_t>(want.size());
    const auto step = got.find(key + ".step");
    if (step == got.end()) {
      // Element-wise copies and whole-tensor statistics move bit for bit.
      EXPECT_EQ(have, want) << what << ": " << key;
      continue;
    }
    c.quantized += static_cast<int64_t>(want.size());
    int64_t outside = 0;
    for (size_t e = 0; e < want.size(); ++e) {
      if (have[e] != want[e]) ++c.requantized_differently;
      // Requantizing picks the map value nearest to the saved value's ratio to the new
      // block's absmax, so it lies within one step of the map there, times that absmax.
      if (std::abs(double{have[e]} - want[e]) > step->second[e]) ++outside;
    }
    EXPECT_EQ(outside, 0) << what << ": " << key
                          << " has elements further than one quantization step from the saved";
  }
  return c;
}

struct Outcome {
  absl::Status status;
  std::vector<double> losses;  // rank 0's, of the steps this run took
  std::vector<double> loss_scales;
  std::vector<std::vector<float>> weights;
};

class ResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TestScratchDir("zt-resume-test");
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), testing::PatternTokens(), 32).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  JobSpec Job(int world, int stage, const std::string& checkpoints) {
    JobSpec job = testing::SmallShardedJob((dir_ / "train.bin").string(), world, stage, 2);
    job.mutable_data()->set_shuffle(true);
    job.mutable_checkpoint()->set_dir((dir_ / checkpoints).string());
    job.mutable_checkpoint()->set_interval_steps(5);
    job.mutable_checkpoint()->set_keep_last(2);
    return job;
  }

  // Runs every rank to `stop_after`, from the checkpoint in `resume` when set.
  // `owner`: TrainOptions::checkpoint_owner (empty: a `zt train` run's); `take_over`: an
  // explicit continuation of another job's checkpoints.
  static Outcome Run(const JobSpec& spec, int64_t stop_after, const std::string& resume = "",
                     bool fallback = false, const std::string& owner = "", bool take_over = false) {
    const JobSpec job = ValidatedJob(spec).value();
    const int n = job.parallel().world_size();
    InProcessStore store;
    Outcome out;
    std::vector<absl::Status> status(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        status[r] = [&]() -> absl::Status {
          TrainOptions options;
          options.rank = r;
          options.store = &store;
          options.stop_after_step = stop_after;
          options.resume_dir = resume;
          options.resume_fallback = fallback;
          options.checkpoint_owner = owner;
          options.take_over_checkpoints = take_over;
          absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(job, options);
          if (!t.ok()) return t.status();
          absl::Status s = (*t)->Run([&](const StepRecord& rec) {
            if (r != 0) return;
            out.losses.push_back(rec.loss);
            out.loss_scales.push_back(rec.loss_scale);
          });
          if (!s.ok()) return s;
          absl::StatusOr<std::vector<std::vector<float>>> w = (*t)->FullWeights();
          if (!w.ok()) return w.status();
          if (r == 0) out.weights = std::move(*w);
          return absl::OkStatus();
        }();
      });
    }
    for (std::thread& t : threads) t.join();
    for (const absl::Status& s : status) {
      if (!s.ok()) {
        out.status = s;
        break;
      }
    }
    return out;
  }

  // 20 steps straight against 10, a new process's worth of trainers, then 10 more.
  void ExpectExactResume(const JobSpec& job, const std::string& what) {
    JobSpec straight = job;
    straight.mutable_checkpoint()->set_dir((dir_ / ("straight-" + what)).string());
    const Outcome whole = Run(straight, 20);
    ASSERT_TRUE(whole.status.ok()) << what << ": " << whole.status;
    const Outcome first = Run(job, 10);
    ASSERT_TRUE(first.status.ok()) << what << ": " << first.status;
    const Outcome second = Run(job, 20, job.checkpoint().dir());
    ASSERT_TRUE(second.status.ok()) << what << ": " << second.status;
    ASSERT_EQ(second.losses.size(), 10u) << what;
    // Bitwise: the same computation in the same order on the same bytes.
    for (int s = 0; s < 10; ++s) {
      EXPECT_EQ(second.losses[s], whole.losses[10 + s]) << what << " step " << 11 + s;
      EXPECT_EQ(second.loss_scales[s], whole.loss_scales[10 + s]) << what << " step " << 11 + s;
    }
    EXPECT_EQ(second.weights, whole.weights) << what;
  }

  // The 4 ranks at stage 3 → 2 ranks at stage 1 → 1 rank at stage 0 chain of the reshard
  // tests, the global batch kept at 8 sequences.
  JobSpec Layout(int world, int stage, const std::function<void(JobSpec*)>& optimizer) {
    JobSpec job = Job(world, stage, "ckpt");
    job.mutable_train()->set_micro_batch_size(8 / world);
    optimizer(&job);
    return job;
  }

  // Reshards the checkpoint in `step_dir`, written by `saved`, into every rank of `job` the
  // way a resume does, and compares each tensor's optimizer states with the saved ones.
  StateComparison ExpectStatesResharded(const JobSpec& saved_spec,
                                        const std::filesystem::path& step_dir, const JobSpec& spec,
                                        const std::string& what) {
    const JobSpec saved = ValidatedJob(saved_spec).value();
    const JobSpec job = ValidatedJob(spec).value();
    auto rank_file = [&](int r) {
      char name[32];
      std::snprintf(name, sizeof(name), "rank-%05d.safetensors", r);
      return (step_dir / name).string();
    };
    std::vector<RankBuffers> before(saved.parallel().world_size());
    for (int r = 0; r < saved.parallel().world_size(); ++r) {
      absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(rank_file(r));
      EXPECT_TRUE(file.ok()) << what << ": " << file.status();
      if (!file.ok()) return {};
      for (const SafetensorsTensorInfo& info : (*file)->tensors()) {
        const absl::Span<const uint8_t> bytes = (*file)->Bytes(info);
        before[r][info.name].assign(bytes.begin(), bytes.end());
      }
    }
    std::vector<RankBuffers> after(job.parallel().world_size());
    for (int r = 0; r < job.parallel().world_size(); ++r) {
      const MemoryPlan plan = PlanMemory(job, r);
      std::unique_ptr<Arenas> arenas = Arenas::Create(plan).value();
      const absl::Status loaded = ReshardRankState(saved, rank_file, job, r, plan, *arenas);
      EXPECT_TRUE(loaded.ok()) << what << " rank " << r << ": " << loaded;
      for (const BufferSpec* b : CheckpointedBuffers(plan)) {
        const Tensor t = arenas->Get(b->name).value();
        const auto* data = static_cast<const uint8_t*>(t.raw());
        after[r][b->name].assign(data, data + t.size_bytes());
      }
    }
    return CompareStates(GatherStates(saved, before), GatherStates(job, after), what);
  }

  struct ReshardChain {
    Outcome whole, to15, to20;
  };
  // 20 steps at 4 ranks stage 3 straight; 10 steps at 4/3 whose checkpoint 2 ranks at stage 1
  // load (states compared) and train to 15, whose checkpoint 1 rank at stage 0 loads (states
  // compared) and trains to 20. The comparisons of the two reshards go to `reshards`.
  ReshardChain RunReshardChain(const std::function<void(JobSpec*)>& optimizer,
                               std::vector<StateComparison>* reshards) {
    ReshardChain chain;
    JobSpec straight = Layout(4, 3, optimizer);
    straight.mutable_checkpoint()->set_dir((dir_ / "straight").string());
    chain.whole = Run(straight, 20);
    EXPECT_TRUE(chain.whole.status.ok()) << chain.whole.status;
    const Outcome at10 = Run(Layout(4, 3, optimizer), 10);
    EXPECT_TRUE(at10.status.ok()) << at10.status;
    reshards->push_back(ExpectStatesResharded(Layout(4, 3, optimizer),
                                              dir_ / "ckpt" / "step-00000010",
                                              Layout(2, 1, optimizer), "4/3 → 2/1"));
    chain.to15 = Run(Layout(2, 1, optimizer), 15, (dir_ / "ckpt").string());
    EXPECT_TRUE(chain.to15.status.ok()) << chain.to15.status;
    reshards->push_back(ExpectStatesResharded(Layout(2, 1, optimizer),
                                              dir_ / "ckpt" / "step-00000015",
                                              Layout(1, 0, optimizer), "2/1 → 1/0"));
    chain.to20 = Run(Layout(1, 0, optimizer), 20, (dir_ / "ckpt").string());
    EXPECT_TRUE(chain.to20.status.ok()) << chain.to20.status;
    EXPECT_EQ(chain.to15.losses.size(), 5u);
    EXPECT_EQ(chain.to20.losses.size(), 5u);
    return chain;
  }

  std::filesystem::path dir_;
};

TEST_F(ResumeTest, ResumedRunsContinueBitForBit) {
  ExpectExactResume(Job(2, 0, "stage0"), "stage0");
  ExpectExactResume(Job(2, 3, "stage3"), "stage3");
  JobSpec fp16 = Job(2, 3, "fp16");
  fp16.mutable_precision()->set_param_dtype(zerotrain::PrecisionConfig::FP16);
  fp16.mutable_precision()->mutable_loss_scale()->set_initial_power(20);
  fp16.mutable_precision()->set_stochastic_rounding(false);
  ExpectExactResume(fp16, "fp16");
  JobSpec eight_bit = Job(2, 2, "adam8");
  eight_bit.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAMW_8BIT);
  eight_bit.mutable_optimizer()->set_min_quantized_numel(256);
  eight_bit.mutable_optimizer()->set_quant_block_size(256);
  ExpectExactResume(eight_bit, "adam8");
}

TEST_F(ResumeTest, SplitMasterWeightsResumeBitForBitAndReshardExactly) {
  auto split = [&](int world, int stage, const std::string& checkpoints) {
    JobSpec job = Job(world, stage, checkpoints);
    job.mutable_train()->set_micro_batch_size(8 / world);
    job.mutable_precision()->set_param_dtype(zerotrain::PrecisionConfig::BF16);
    job.mutable_precision()->set_grad_dtype(zerotrain::PrecisionConfig::BF16);
    job.mutable_precision()->set_split_master_weights(true);
    return job;
  };
  ExpectExactResume(split(2, 3, "split"), "split");
  // The low halves reshard like the master they replace; the high halves come with the
  // parameters: a 2-rank and a 1-rank job load the 4-rank master bit for bit.
  const Outcome at10 = Run(split(4, 3, "split-reshard"), 10);
  ASSERT_TRUE(at10.status.ok()) << at10.status;
  const std::string saved = (dir_ / "split-reshard").string();
  for (const auto& [world, stage] : {std::pair{2, 1}, std::pair{1, 0}}) {
    const Outcome loaded = Run(split(world, stage, "split-reshard"), 10, saved);
    ASSERT_TRUE(loaded.status.ok()) << loaded.status;
    EXPECT_EQ(loaded.weights, at10.weights) << world << " ranks, stage " << stage;
  }
  // A job that keeps its master whole cannot take the split one's state as it is.
  JobSpec whole_master = split(2, 1, "split-reshard");
  whole_master.mutable_precision()->set_split_master_weights(false);
  const Outcome refused = Run(whole_master, 10, saved);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status.message()),
              HasSubstr("was written for another precision configuration"));
}

TEST_F(ResumeTest, AsynchronousSavesResumeBitForBit) {
  // The state is copied into the plan's staging buffer at the save point and written while
  // the next steps run; what was copied is what the step had.
  JobSpec job = Job(2, 3, "async");
  job.mutable_checkpoint()->set_async(true);
  job.mutable_checkpoint()->set_interval_steps(2);
  ExpectExactResume(job, "async");
}

TEST_F(ResumeTest, WeightsOnlyCheckpointsRestartTheOptimizerFromTheSavedWeights) {
  JobSpec job = Job(2, 3, "weights");
  job.mutable_checkpoint()->set_save_optimizer(false);
  JobSpec full = Job(2, 3, "full");
  const Outcome whole = Run(full, 20);
  ASSERT_TRUE(whole.status.ok()) << whole.status;
  ASSERT_TRUE(Run(job, 10).status.ok());
  // No optimizer state in the files: a third of the full checkpoint's bytes (fp32
  // parameters; AdamW adds two moments per parameter).
  const auto weights_file = dir_ / "weights" / "step-00000010" / "rank-00000.safetensors";
  const auto full_file = dir_ / "full" / "step-00000020" / "rank-00000.safetensors";
  EXPECT_LT(std::filesystem::file_size(weights_file), std::filesystem::file_size(full_file) / 2);
  const Outcome resumed = Run(job, 20, job.checkpoint().dir());
  ASSERT_TRUE(resumed.status.ok()) << resumed.status;
  ASSERT_EQ(resumed.losses.size(), 10u);
  // Step 11's forward runs on the saved weights, exactly; the update then differs (fresh
  // moments), so later steps do too.
  EXPECT_EQ(resumed.losses[0], whole.losses[10]);
  EXPECT_NE(resumed.weights, whole.weights);
}

TEST_F(ResumeTest, AFailedSaveStopsTheJobOrIsReportedAndSkipped) {
  // checkpoint.dir under a regular file: no save can even begin.
  { std::ofstream(dir_ / "file") << "x"; }
  JobSpec job = Job(2, 0, "file/ckpt");
  const Outcome failed = Run(job, 10);
  EXPECT_FALSE(failed.status.ok());
  EXPECT_THAT(failed.status.message(), HasSubstr((dir_ / "file").string()));
  job.mutable_checkpoint()->set_on_save_error(zerotrain::CheckpointConfig::CONTINUE);
  const Outcome continued = Run(job, 10);
  EXPECT_TRUE(continued.status.ok()) << continued.status;
  EXPECT_EQ(continued.losses.size(), 10u);
}

TEST_F(ResumeTest, AFailedFinalSaveFailsTheRunWhateverOnSaveErrorSays) {
  // The periodic saves (steps 5..15) may be skipped with CONTINUE; the one at max_steps (20)
  // holds the run's result, so its failure is the run's, synchronous or asynchronous.
  { std::ofstream(dir_ / "file") << "x"; }
  for (const bool async : {false, true}) {
    JobSpec job = Job(2, 0, "file/ckpt");
    job.mutable_checkpoint()->set_on_save_error(zerotrain::CheckpointConfig::CONTINUE);
    job.mutable_checkpoint()->set_async(async);
    const Outcome outcome = Run(job, job.train().max_steps());
    EXPECT_FALSE(outcome.status.ok()) << "async " << async;
    EXPECT_THAT(outcome.status.message(), HasSubstr("the final checkpoint (step 20) failed"))
        << "async " << async;
    // Every step trained; a synchronous save fails before step 20 is reported, an
    // asynchronous one when the run waits for it at the end.
    EXPECT_EQ(outcome.losses.size(), async ? 20u : 19u) << "async " << async;
  }
}

TEST_F(ResumeTest, AnotherJobsCheckpointsAreRefusedUnlessTakenOverExplicitly) {
  const JobSpec job = Job(2, 0, "ckpt");
  ASSERT_TRUE(Run(job, 10, "", false, "owner-1").status.ok());
  absl::StatusOr<std::optional<CheckpointOwner>> owner =
      ReadCheckpointOwner(job.checkpoint().dir());
  ASSERT_TRUE(owner.ok() && owner->has_value()) << owner.status();
  EXPECT_EQ((*owner)->job_id, "owner-1");

  // Another job, even resuming, is refused before it takes a step, and deletes nothing.
  const Outcome intruder = Run(job, 20, job.checkpoint().dir(), false, "intruder-2");
  EXPECT_EQ(intruder.status.code(), absl::StatusCode::kFailedPrecondition) << intruder.status;
  EXPECT_THAT(intruder.status.message(), HasSubstr("job owner-1"));
  EXPECT_TRUE(intruder.losses.empty());
  EXPECT_TRUE(std::filesystem::exists(dir_ / "ckpt" / "step-00000005"));
  EXPECT_TRUE(std::filesystem::exists(dir_ / "ckpt" / "step-00000010"));

  // The owner's next attempt resumes; an explicit take-over continues and claims the directory.
  ASSERT_TRUE(Run(job, 15, job.checkpoint().dir(), false, "owner-1").status.ok());
  const Outcome taken = Run(job, 20, job.checkpoint().dir(), false, "intruder-2", true);
  ASSERT_TRUE(taken.status.ok()) << taken.status;
  EXPECT_EQ(taken.losses.size(), 5u);
  owner = ReadCheckpointOwner(job.checkpoint().dir());
  ASSERT_TRUE(owner.ok() && owner->has_value());
  EXPECT_EQ((*owner)->job_id, "intruder-2");
}

TEST_F(ResumeTest, InitFromACheckpointStartsFromItsWeightsAtAnyLayout) {
  // Job A (2 ranks, ZeRO-3) saves at step 10; job B (1 rank, stage 0, its own directory)
  // starts from those weights, exactly, without resuming A's optimizer or step.
  const JobSpec a = Job(2, 3, "a");
  const Outcome trained = Run(a, 10);
  ASSERT_TRUE(trained.status.ok()) << trained.status;
  JobSpec b = Job(1, 0, "b");
  b.mutable_train()->set_micro_batch_size(4);
  b.mutable_model()->set_init_from(a.checkpoint().dir());
  const Outcome started = Run(b, 0);
  ASSERT_TRUE(started.status.ok()) << started.status;
  EXPECT_EQ(started.weights, trained.weights);

  JobSpec other = b;
  other.mutable_model()->set_d_model(b.model().d_model() * 2);
  const Outcome refused = Run(other, 0);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kFailedPrecondition) << refused.status;
  EXPECT_THAT(refused.status.message(), HasSubstr("was saved for another model"));
}

TEST_F(ResumeTest, CorruptCheckpointIsRefusedByNameOrSkippedWithFallback) {
  const JobSpec job = Job(2, 3, "ckpt");
  ASSERT_TRUE(Run(job, 10).status.ok());
  // keep_last 2: steps 5 and 10 are kept. Flip one byte of rank 1's file of step 10.
  const auto file = dir_ / "ckpt" / "step-00000010" / "rank-00001.safetensors";
  ASSERT_TRUE(std::filesystem::exists(file));
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-3, std::ios::end);
    const char c = static_cast<char>(f.peek());
    f.seekp(-3, std::ios::end);
    f.put(static_cast<char>(c ^ 0x40));
  }
  const Outcome refused = Run(job, 20, job.checkpoint().dir());
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kDataLoss) << refused.status;
  EXPECT_THAT(refused.status.message(), HasSubstr("rank-00001.safetensors"));
  EXPECT_THAT(refused.status.message(), HasSubstr("checksum mismatch"));
  // With fallback the run goes back to step 5 and trains steps 6..20, replacing the corrupt
  // step 10 with its own.
  const Outcome fallen_back = Run(job, 20, job.checkpoint().dir(), /*fallback=*/true);
  ASSERT_TRUE(fallen_back.status.ok()) << fallen_back.status;
  EXPECT_EQ(fallen_back.losses.size(), 15u);
  EXPECT_TRUE(Run(job, 20, job.checkpoint().dir()).status.ok()) << "step 20 loads cleanly";
}

TEST_F(ResumeTest, AFreshRunRefusesADirectoryThatHoldsCheckpoints) {
  const JobSpec job = Job(1, 0, "ckpt");
  ASSERT_TRUE(Run(job, 5).status.ok());
  const Outcome again = Run(job, 5);
  EXPECT_EQ(again.status.code(), absl::StatusCode::kFailedPrecondition) << again.status;
  EXPECT_THAT(again.status.message(), HasSubstr("already holds checkpoints"));
  EXPECT_THAT(again.status.message(), HasSubstr("--resume"));
}

// Steps 11–15 (`to15`) and 16–20 (`to20`) resumed at other layouts against the straight run
// `whole`: other layouts sum the gradients in another order, so the bounds of
// sharded_training_test.cc (losses 1e-5 relative, weights 1e-4 absolute).
void ExpectReshardedRunFollowsStraight(const Outcome& to15, const Outcome& to20,
                                       const Outcome& whole) {
  ASSERT_EQ(to15.losses.size(), 5u);
  ASSERT_EQ(to20.losses.size(), 5u);
  for (int s = 0; s < 5; ++s) {
    EXPECT_NEAR(to15.losses[s], whole.losses[10 + s], 1e-5 * whole.losses[10 + s]);
    EXPECT_NEAR(to20.losses[s], whole.losses[15 + s], 1e-5 * whole.losses[15 + s]);
  }
  double worst = 0;
  for (size_t u = 0; u < whole.weights.size(); ++u) {
    for (size_t i = 0; i < whole.weights[u].size(); ++i) {
      worst = std::max(worst, std::abs(double{to20.weights[u][i]} - whole.weights[u][i]));
    }
  }
  EXPECT_LT(worst, 1e-4);
}

TEST_F(ResumeTest, ReshardsAcrossWorldSizesAndStages) {
  // 4 ranks at stage 3 → 2 ranks at stage 1 → 1 rank at stage 0, the global batch kept at 8
  // sequences, against 4 ranks at stage 3 straight through.
  auto layout = [&](int world, int stage) {
    JobSpec job = Job(world, stage, "ckpt");
    job.mutable_train()->set_micro_batch_size(8 / world);
    return job;
  };
  JobSpec straight = layout(4, 3);
  straight.mutable_checkpoint()->set_dir((dir_ / "straight").string());
  const Outcome whole = Run(straight, 20);
  ASSERT_TRUE(whole.status.ok()) << whole.status;
  const Outcome at10 = Run(layout(4, 3), 10);
  ASSERT_TRUE(at10.status.ok()) << at10.status;
  // Loading copies the saved ranges: the weights are the saved ones, bit for bit.
  const Outcome loaded = Run(layout(2, 1), 10, (dir_ / "ckpt").string());
  ASSERT_TRUE(loaded.status.ok()) << loaded.status;
  EXPECT_TRUE(loaded.losses.empty());
  EXPECT_EQ(loaded.weights, at10.weights);
  const Outcome to15 = Run(layout(2, 1), 15, (dir_ / "ckpt").string());
  ASSERT_TRUE(to15.status.ok()) << to15.status;
  const Outcome to20 = Run(layout(1, 0), 20, (dir_ / "ckpt").string());
  ASSERT_TRUE(to20.status.ok()) << to20.status;
  ExpectReshardedRunFollowsStraight(to15, to20, whole);
}

TEST_F(ResumeTest, VocabularyShardedEmbeddingReshardsAcrossShardGroups) {
  // Stage 3 splits the tied embedding into whole rows over the shard group, so its shards
  // (and their Adam moments) have another padding at each group size: 2 ranks → 4 ranks (other
  // row ranges; rank 3's holds no vocabulary row) → 4 ranks with the embedding gathered whole
  // (the flat shards), the global batch kept at 8 sequences, against 2 ranks straight through.
  auto layout = [&](int world, bool vocab) {
    JobSpec job = Job(world, 3, "ckpt");
    job.mutable_train()->set_micro_batch_size(8 / world);
    job.mutable_parallel()->set_vocab_sharded_embedding(vocab);
    return job;
  };
  JobSpec straight = layout(2, true);
  straight.mutable_checkpoint()->set_dir((dir_ / "straight").string());
  const Outcome whole = Run(straight, 20);
  ASSERT_TRUE(whole.status.ok()) << whole.status;
  const Outcome at10 = Run(layout(2, true), 10);
  ASSERT_TRUE(at10.status.ok()) << at10.status;
  // Loading copies the saved rows into the new ranges: the weights are the saved ones.
  const Outcome loaded = Run(layout(4, true), 10, (dir_ / "ckpt").string());
  ASSERT_TRUE(loaded.status.ok()) << loaded.status;
  EXPECT_EQ(loaded.weights, at10.weights);
  const Outcome to15 = Run(layout(4, true), 15, (dir_ / "ckpt").string());
  ASSERT_TRUE(to15.status.ok()) << to15.status;
  const Outcome to20 = Run(layout(4, false), 20, (dir_ / "ckpt").string());
  ASSERT_TRUE(to20.status.ok()) << to20.status;
  ExpectReshardedRunFollowsStraight(to15, to20, whole);
}

TEST_F(ResumeTest, ReshardsEightBitAdamWStatesWithinOneQuantizationStep) {
  // Most of the small model in 8-bit blocks of 256 elements: shard boundaries fall on
  // multiples of 64 elements, so new blocks straddle saved ones (blocks of 64 would all line
  // up and be copied). Tensors under 256 elements keep fp32 moments, which move too.
  auto eight_bit = [](JobSpec* job) {
    job->mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAMW_8BIT);
    job->mutable_optimizer()->set_min_quantized_numel(256);
    job->mutable_optimizer()->set_quant_block_size(256);
  };
  std::vector<StateComparison> reshards;
  const ReshardChain chain = RunReshardChain(eight_bit, &reshards);
  ASSERT_EQ(reshards.size(), 2u);
  for (const StateComparison& c : reshards) {
    EXPECT_GT(c.quantized, 0) << "8-bit moments were compared";
    EXPECT_LT(c.quantized, c.elements) << "fp32 moments of small tensors were compared";
  }
  // Blocks that start at another element are requantized: the bound above was exercised.
  EXPECT_GT(reshards[0].requantized_differently, 0);
  ASSERT_EQ(chain.to15.losses.size(), 5u);
  ASSERT_EQ(chain.to20.losses.size(), 5u);
  // Each layout quantizes its own blocks (they start at its shards' boundaries), so the runs
  // differ by quantization noise — up to ~1% per element of the moments — on top of the one
  // requantization at each load. Over 5 steps that moves the loss by ~1e-4 relative (the
  // update divides m by √v, so moment noise enters the weights scaled by the learning rate);
  // 1e-3 keeps a 10× margin while a state moved wrongly (a wrong map, a shifted block)
  // changes the update by the moments' own size.
  for (int s = 0; s < 5; ++s) {
    EXPECT_NEAR(chain.to15.losses[s], chain.whole.losses[10 + s], 1e-3 * chain.whole.losses[10 + s])
        << "step " << 11 + s;
    EXPECT_NEAR(chain.to20.losses[s], chain.whole.losses[15 + s], 1e-3 * chain.whole.losses[15 + s])
        << "step " << 16 + s;
  }
}

TEST_F(ResumeTest, ReshardsAdafactorStatesBitForBit) {
  // Factored row and column statistics of the matrices, full second moments of the vectors
  // and first moments of every element (beta1 > 0).
  auto adafactor = [](JobSpec* job) {
    job->mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAFACTOR);
    job->mutable_optimizer()->mutable_adafactor()->set_beta1(0.9f);
  };
  std::vector<StateComparison> reshards;
  const ReshardChain chain = RunReshardChain(adafactor, &reshards);
  ASSERT_EQ(reshards.size(), 2u);
  for (const StateComparison& c : reshards) {
    EXPECT_GT(c.elements, 0);
    EXPECT_EQ(c.quantized, 0);
  }
  ASSERT_EQ(chain.to15.losses.size(), 5u);
  ASSERT_EQ(chain.to20.losses.size(), 5u);
  // The states move bit for bit; the layouts then sum gradients and the sharded statistics in
  // another order: the bounds of sharded_training_test.cc's Adafactor comparison.
  for (int s = 0; s < 5; ++s) {
    EXPECT_NEAR(chain.to15.losses[s], chain.whole.losses[10 + s], 1e-5 * chain.whole.losses[10 + s])
        << "step " << 11 + s;
    EXPECT_NEAR(chain.to20.losses[s], chain.whole.losses[15 + s], 1e-5 * chain.whole.losses[15 + s])
        << "step " << 16 + s;
  }
  double worst = 0;
  for (size_t u = 0; u < chain.whole.weights.size(); ++u) {
    for (size_t i = 0; i < chain.whole.weights[u].size(); ++i) {
      worst =
          std::max(worst, std::abs(double{chain.to20.weights[u][i]} - chain.whole.weights[u][i]));
    }
  }
  EXPECT_LT(worst, 1e-4);
}

TEST_F(ResumeTest, WhatCannotBeResumedIsRefusedNamingIt) {
  // 8-bit states reshard onto another layout, but not onto another block size: the codes'
  // meaning is the optimizer configuration's, which must not change.
  JobSpec eight_bit = Job(2, 2, "adam8");
  eight_bit.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAMW_8BIT);
  eight_bit.mutable_optimizer()->set_min_quantized_numel(256);
  ASSERT_TRUE(Run(eight_bit, 5).status.ok());
  JobSpec one = eight_bit;
  one.mutable_parallel()->set_world_size(1);
  one.mutable_parallel()->set_zero_stage(0);
  one.mutable_train()->set_micro_batch_size(4);
  one.mutable_optimizer()->set_quant_block_size(1024);
  const Outcome quantized = Run(one, 10, eight_bit.checkpoint().dir());
  EXPECT_EQ(quantized.status.code(), absl::StatusCode::kFailedPrecondition) << quantized.status;
  EXPECT_THAT(quantized.status.message(), HasSubstr("another optimizer configuration"));
  EXPECT_THAT(quantized.status.message(), HasSubstr("1024"));

  const JobSpec job = Job(2, 3, "ckpt");
  ASSERT_TRUE(Run(job, 5).status.ok());
  JobSpec smaller_batch = Job(1, 0, "ckpt");  // 1 × 2 sequences instead of 2 × 2
  const Outcome batch = Run(smaller_batch, 10, job.checkpoint().dir());
  EXPECT_EQ(batch.status.code(), absl::StatusCode::kFailedPrecondition) << batch.status;
  EXPECT_THAT(batch.status.message(), HasSubstr("global batch of 4 sequences"));
  JobSpec wider = Job(2, 3, "ckpt");
  wider.mutable_model()->set_d_model(64);
  const Outcome model = Run(wider, 10, job.checkpoint().dir());
  EXPECT_EQ(model.status.code(), absl::StatusCode::kFailedPrecondition) << model.status;
  EXPECT_THAT(model.status.message(), HasSubstr("another model configuration"));
}

// ReadUnitRange (what `zt export` streams with) over a unit of two-plus conversion chunks,
// sharded over 3 saved ranks: ranges that cross chunk and rank boundaries read back the
// weights the files were written with, exactly — for fp32 parameters, bf16 parameters with an
// fp32 master, and a split master. The files are written from known values (no training), so
// the reference is exact and any misplaced chunk, piece or released page shows.
TEST_F(ResumeTest, ReadUnitRangeStreamsAcrossChunksAndSavedRanks) {
  using P = zerotrain::PrecisionConfig;
  struct Case {
    const char* label;
    P::DType param_dtype;
    bool split;
  };
  for (const Case& c : {Case{"fp32", P::FP32, false}, Case{"bf16 + master", P::BF16, false},
                        Case{"bf16 + split master", P::BF16, true}}) {
    SCOPED_TRACE(c.label);
    JobSpec spec = testing::SmallShardedJob((dir_ / "train.bin").string(), 3, 3, 2);
    spec.mutable_model()->set_n_layer(1);
    spec.mutable_model()->set_d_model(128);
    spec.mutable_model()->set_vocab_size(4096);  // the embedding unit: 526,336 elements
    spec.mutable_precision()->set_param_dtype(c.param_dtype);
    spec.mutable_precision()->set_split_master_weights(c.split);
    const JobSpec job = ValidatedJob(spec).value();
    const ModelLayout layout = BuildModelLayout(job.model());
    // The fp32 weight of element i of unit u: low bits set, so a lost low half shows.
    auto weight = [](size_t u, int64_t i) {
      return std::sin(0.001f * static_cast<float>(i) + static_cast<float>(u)) / 3.0f;
    };
    const std::filesystem::path step_dir = dir_ / c.label;
    std::filesystem::create_directories(step_dir);
    auto rank_file = [&](int r) { return (step_dir / absl::StrCat("rank-", r)).string(); };
    for (int r = 0; r < 3; ++r) {
      const MemoryPlan plan = PlanMemory(job, r);
      std::vector<std::vector<uint8_t>> storage;
      const absl::Status written = WriteRankState(
          rank_file(r), plan, [&](const BufferSpec& b) -> absl::StatusOr<const void*> {
            std::vector<uint8_t>& bytes = storage.emplace_back(b.bytes(), 0);
            for (size_t u = 0; u < layout.units.size(); ++u) {
              const std::string prefix = layout.units[u].name + ".";
              if (!b.name.starts_with(prefix)) continue;
              const std::string role = b.name.substr(prefix.size());
              const FlatRange owned = ShardOf(layout.units[u].numel, ParallelLayout::ForJob(job, r).shard()).owned;
              for (int64_t k = 0; k < owned.end - owned.begin; ++k) {
                const float m = weight(u, owned.begin + k);
                const SplitMasterBits split = SplitMaster(m);
                if (b.dtype == DType::kF32 && (role == "params" || role == "master")) {
                  std::memcpy(bytes.data() + 4 * k, &m, 4);
                } else if (role == "params") {  // bf16: the master rounded, as training keeps it
                  const uint16_t h = c.split ? split.high : FloatToBf16(m);
                  std::memcpy(bytes.data() + 2 * k, &h, 2);
                } else if (role == "master_low") {
                  std::memcpy(bytes.data() + 2 * k, &split.low, 2);
                }
              }
            }
            return static_cast<const void*>(bytes.data());
          });
      ASSERT_TRUE(written.ok()) << written;
    }
    const size_t unit = 0;
    const int64_t n = layout.units[unit].numel;
    ASSERT_GT(n, 2 * (int64_t{1} << 18)) << "the unit must span several conversion chunks";
    const std::string role = c.param_dtype == P::FP32 ? "params" : "master";
    for (auto [begin, end] : std::vector<std::pair<int64_t, int64_t>>{
             {0, n}, {1000, 400000}, {262143, 262146}, {n / 3 - 7, n / 3 + 7}, {n - 5, n}}) {
      std::vector<float> got(end - begin);
      ASSERT_TRUE(ReadUnitRange(job, rank_file, unit, role, begin, end, got.data()).ok());
      int64_t wrong = 0;
      for (int64_t i = begin; i < end; ++i) wrong += got[i - begin] != weight(unit, i);
      EXPECT_EQ(wrong, 0) << role << " [" << begin << ", " << end << ")";
    }
    if (c.param_dtype == P::BF16) {  // the bf16 parameters themselves, widened
      std::vector<float> got(n);
      ASSERT_TRUE(ReadUnitRange(job, rank_file, unit, "params", 0, n, got.data()).ok());
      int64_t wrong = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float m = weight(unit, i);
        wrong += got[i] != Bf16ToFloat(c.split ? SplitMaster(m).high : FloatToBf16(m));
      }
      EXPECT_EQ(wrong, 0);
    }
  }
}

}  // namespace
}  // namespace zt
