// Tensor parallelism (Megatron-LM) in the step loop: t = 2 and 4 ranks (threads of this
// process, Gloo over loopback) training GPT-2 (tied embedding) and Llama (GQA, untied head;
// KV heads split at t = 2, replicated at t = 4; a vocabulary that does not divide by 4)
// against one rank from the same seed: the same losses and gradient norms over 10 steps, the
// same gradients of the first step (each rank's share against the one-rank gradient sliced);
// TP2 × DP2 under ZeRO-1 against one rank reading the whole global batch, and the whole
// weights joined from the shares (FullWeights, what export writes) against the one-rank
// model's; a tensor-parallel checkpoint resuming bit-identically, resharding onto other
// layouts, and exported (and read by model.init_from) as the whole model.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/dtype.h"
#include "kernels/status_macros.h"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "tests/unit/worker/trainer/rank_threads.h"
#include "tests/unit/worker/trainer/separate_memory_device.h"
#include "tests/unit/worker/trainer/small_sharded_job.h"
#include "tests/unit/worker/trainer/test_swap_store.h"
#include "worker/checkpoint/hf_interop.h"
#include "worker/checkpoint/checkpoint_export.h"
#include "worker/comm/store.h"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"
#include "worker/model/tensor_parallel_slice.h"
#include "worker/offload/node_swap_store.h"
#include "worker/plan/parallel_plan.h"
#include "worker/plan/sharding_planner.h"
#include "worker/train/trainer.h"

namespace zt {
namespace {

using zerotrain::JobSpec;

struct RankRun {
  std::vector<double> losses, grad_norms, val_losses;
  std::vector<std::string> unclaimed;           // plan buffers the rank never used
  std::vector<std::vector<float>> first_grads;  // per unit, the rank's share after step 1
  std::vector<std::vector<float>> params;       // per unit, the rank's share at the end
  std::vector<std::vector<float>> whole;        // FullWeights at the end: the whole model
  int tp_rank = 0;
  int64_t skipped = 0;          // steps the loss scaler skipped, by the end
  int64_t offloaded_bytes = 0;  // to the host and out to swap, over the run
  std::vector<int64_t> comm_bytes;  // sent by this rank, per step
};

// A parameter or gradient buffer's values as f32, whatever its storage dtype (16-bit under
// mixed precision).
std::vector<float> Floats(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    switch (t.dtype()) {
      case DType::kBF16:
        out[i] = Bf16ToFloat(t.data<uint16_t>()[i]);
        break;
      case DType::kF16:
        out[i] = HalfToFloat(t.data<uint16_t>()[i]);
        break;
      default:
        out[i] = t.data<float>()[i];
    }
  }
  return out;
}

struct Outcome {
  absl::Status status;
  std::vector<RankRun> ranks;
};

class TensorParallelTrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TestScratchDir("zt-tp-test");
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), testing::PatternTokens(), 32).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  JobSpec Gpt2(int tp, int dp, int stage, int micro_batch) {
    JobSpec job =
        testing::SmallShardedJob((dir_ / "train.bin").string(), tp * dp, stage, micro_batch);
    job.mutable_parallel()->set_tensor_parallel(tp);
    job.mutable_train()->set_max_steps(10);
    return job;
  }
  JobSpec Llama(int tp, int dp, int stage, int micro_batch) {
    JobSpec job = Gpt2(tp, dp, stage, micro_batch);
    testing::MakeSmallGqaLlama(job);
    return job;
  }

  // Every rank to `stop_after` steps (from `resume` when set), or Step() `steps` times.
  // With `separate_memory`, on devices whose memory is their own (separate_memory_device.h).
  static Outcome Run(const JobSpec& spec, int steps, const std::string& resume = "",
                     bool use_run = false, bool separate_memory = false) {
    Outcome out;
    absl::StatusOr<JobSpec> validated = ValidatedJob(spec);
    if (!validated.ok()) {
      out.status = validated.status();
      return out;
    }
    const JobSpec job = *validated;
    const int n = job.parallel().world_size();
    InProcessStore store;
    const absl::StatusOr<std::shared_ptr<offload::SwapStore>> swap =
        testing::OpenTestSwapStore(job);
    if (!swap.ok()) {
      out.status = swap.status();
      return out;
    }
    out.ranks.resize(n);
    out.status = testing::RunRankThreads(n, [&](int r) -> absl::Status {
      TrainOptions options;
      options.rank = r;
      options.store = &store;
      options.swap_store = swap->get();
      options.resume_dir = resume;
      if (use_run) options.stop_after_step = steps;
      if (separate_memory) options.make_device = testing::SeparateMemoryDevice;
      absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(job, options);
      if (!t.ok()) return t.status();
      RankRun& mine = out.ranks[r];
      mine.tp_rank = (*t)->model().tensor_parallel().rank;
      auto record = [&](const StepRecord& rec) {
        mine.losses.push_back(rec.loss);
        mine.skipped = rec.skipped;
        mine.grad_norms.push_back(rec.grad_norm);
        mine.offloaded_bytes += rec.offload_bytes_to_host + rec.swap_bytes_out;
        mine.comm_bytes.push_back(rec.comm_bytes);
        if (rec.val_loss) mine.val_losses.push_back(*rec.val_loss);
        if (mine.first_grads.empty()) {
          for (const Tensor& g : (*t)->model().unit_grads()) mine.first_grads.push_back(Floats(g));
        }
      };
      if (use_run) {
        ZT_RETURN_IF_ERROR((*t)->Run(record));
      } else {
        for (int s = 0; s < steps; ++s) {
          absl::StatusOr<StepRecord> rec = (*t)->Step();
          if (!rec.ok()) return rec.status();
          record(*rec);
        }
      }
      for (const Tensor& p : (*t)->model().unit_params()) mine.params.push_back(Floats(p));
      mine.unclaimed = (*t)->arenas().UnclaimedBuffers();
      absl::StatusOr<std::vector<std::vector<float>>> whole = (*t)->FullWeights();
      if (!whole.ok()) return whole.status();
      mine.whole = std::move(*whole);
      return absl::OkStatus();
    });
    return out;
  }

  // Two micro-batches a step, FULL activation checkpointing, data.val evaluated every 5 steps.
  JobSpec AccumulatedCheckpointedEvaluated(JobSpec job) {
    job.mutable_train()->set_grad_accum_steps(2);
    job.mutable_memory()->set_activation_checkpointing(zerotrain::MemoryConfig::FULL);
    job.mutable_data()->add_val((dir_ / "train.bin").string());
    job.mutable_train()->set_eval_interval(5);
    job.mutable_train()->set_eval_steps(2);
    return job;
  }

  std::filesystem::path dir_;
};

// Losses and gradient norms: the TP ranks sum partial products of each row-parallel GEMM over
// the group (and the parallel cross-entropy sums per-shard Σexp) in another order than one
// rank's GEMM, so activations differ in the last fp32 bits. Over 10 Adam steps the runs here
// differ by < 2e-8 relative in the loss and < 1.4e-6 in the gradient norm (2026-11-27, every
// case below); 1e-6 and 2e-5 are ~50× and ~15× that, and far below what a missing
// all-reduce, a double-counted bias, a wrong slice or a replicated tensor counted twice in the
// norm gives (≥ 1e-3: the norm's case was seen failing at step 1 when broken on purpose).
struct Tolerance {
  double loss = 1e-6;         // relative, each step
  double norm = 2e-5;         // relative, each step's gradient norm
  double weights = 1e-4;      // absolute, the final whole weights: the largest difference
  double weights_rms = 1e-4;  // and the root mean square of the differences
  bool learns = true;         // the reference's loss falls by 0.1 over the run
};

void ExpectSameTraining(const Outcome& got, const Outcome& want, const std::string& what,
                        const Tolerance& tol = {}) {
  ASSERT_TRUE(got.status.ok()) << what << ": " << got.status;
  ASSERT_TRUE(want.status.ok()) << what << ": " << want.status;
  const RankRun& ref = want.ranks[0];
  ASSERT_EQ(ref.losses.size(), got.ranks[0].losses.size());
  if (tol.learns) {
    EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.1) << what << ": the model learns";
  }
  for (const RankRun& r : got.ranks) {
    // The plan and the engine agree: every planned buffer is used (the model binds the TP
    // shares, the cross-entropy's statistics, the step scalars of every TP rank).
    EXPECT_TRUE(r.unclaimed.empty()) << what << ": unused plan buffer " << r.unclaimed.front();
    ASSERT_EQ(r.val_losses.size(), ref.val_losses.size()) << what;
    for (size_t k = 0; k < ref.val_losses.size(); ++k) {
      EXPECT_NEAR(r.val_losses[k], ref.val_losses[k], tol.loss * ref.val_losses[k])
          << what << " val";
    }
    // The whole model joined from the shares: every rank the same, the one-rank model's to
    // within the noise above carried through 10 Adam steps, which moves a weight whose
    // gradient is near zero by up to lr in either direction (seen < 1.3e-5 per weight). 1e-4,
    // the ZeRO tests' bound, is far below a wrong slice or update (~lr = 3e-3 in one step).
    ASSERT_EQ(r.whole.size(), ref.whole.size()) << what;
    EXPECT_EQ(r.whole, got.ranks[0].whole) << what;
    double worst = 0, sum_sq = 0;
    int64_t count = 0;
    for (size_t u = 0; u < ref.whole.size(); ++u) {
      ASSERT_EQ(r.whole[u].size(), ref.whole[u].size()) << what << " unit " << u;
      for (size_t i = 0; i < ref.whole[u].size(); ++i) {
        const double d = std::abs(double{r.whole[u][i]} - ref.whole[u][i]);
        worst = std::max(worst, d);
        sum_sq += d * d;
        ++count;
      }
    }
    EXPECT_LT(worst, tol.weights) << what << ": whole weights";
    const double rms = std::sqrt(sum_sq / std::max<int64_t>(count, 1));
    EXPECT_LT(rms, tol.weights_rms) << what << ": whole weights' RMS difference";
    for (size_t s = 0; s < ref.losses.size(); ++s) {
      EXPECT_NEAR(r.losses[s], ref.losses[s], tol.loss * ref.losses[s])
          << what << " step " << s + 1;
      // The norm counts each element once over the group (replicated tensors on TP rank 0).
      // A step whose fp16 gradients overflowed has no finite norm on either side.
      if (!std::isfinite(ref.grad_norms[s])) {
        EXPECT_FALSE(std::isfinite(r.grad_norms[s])) << what << " overflow, step " << s + 1;
        continue;
      }
      EXPECT_NEAR(r.grad_norms[s], ref.grad_norms[s], tol.norm * ref.grad_norms[s])
          << what << " gradient norm, step " << s + 1;
    }
  }
}

// Each rank's share of the first step's gradient against the one-rank gradient sliced. The
// gradients are ~1e-2 at most and the shares differ from one rank's by < 7e-8 (the
// reduction-order noise above); 1e-6 is ~15× that, far below a missing reduction (the whole
// gradient of a share) or a replicated KV head's unsummed partial gradient (half of it; seen
// failing when the sum was left out on purpose).
void ExpectSlicedGradients(const JobSpec& spec, const Outcome& got, const Outcome& want,
                           const std::string& what) {
  const JobSpec job = ValidatedJob(spec).value();  // defaults applied (n_kv_head, d_ff)
  const int tp = job.parallel().tensor_parallel();
  const ModelLayout whole = BuildModelLayout(job.model());
  const ModelLayout local = TensorParallelModelLayout(job.model(), tp);
  for (const RankRun& r : got.ranks) {
    ASSERT_EQ(r.first_grads.size(), whole.units.size());
    for (size_t u = 0; u < whole.units.size(); ++u) {
      for (const ParamSpec& p : local.units[u].params) {
        const ParamSpec& w = *whole.units[u].Find(p.name);
        std::vector<float> expected(p.numel);
        ExtractSlice(SliceOf(job.model(), p.name, w.shape, tp, r.tp_rank),
                     want.ranks[0].first_grads[u].data() + w.offset, expected.data());
        double worst = 0;
        for (int64_t i = 0; i < p.numel; ++i) {
          worst = std::max(worst, std::abs(double{r.first_grads[u][p.offset + i]} - expected[i]));
        }
        EXPECT_LT(worst, 1e-6) << what << " " << whole.units[u].name << "." << p.name << " tp rank "
                               << r.tp_rank;
      }
    }
  }
}

TEST_F(TensorParallelTrainingTest, Gpt2TiedOnTwoAndFourRanksMatchesOneRank) {
  const JobSpec one = Gpt2(1, 1, 0, 2);
  const Outcome reference = Run(one, 10);
  for (int tp : {2, 4}) {
    const JobSpec job = Gpt2(tp, 1, 0, 2);
    const Outcome got = Run(job, 10);
    ExpectSameTraining(got, reference, "gpt2 tp " + std::to_string(tp));
    ExpectSlicedGradients(job, got, reference, "gpt2 tp " + std::to_string(tp));
  }
}

TEST_F(TensorParallelTrainingTest, LlamaGqaSplitAndReplicatedKvMatchesOneRank) {
  const Outcome reference = Run(Llama(1, 1, 0, 2), 10);
  // t = 2: each rank one of the 2 KV heads; t = 4: each KV head on 2 ranks, its gradient
  // summed between them.
  for (int tp : {2, 4}) {
    const JobSpec job = Llama(tp, 1, 0, 2);
    const Outcome got = Run(job, 10);
    ExpectSameTraining(got, reference, "llama tp " + std::to_string(tp));
    ExpectSlicedGradients(job, got, reference, "llama tp " + std::to_string(tp));
  }
}

// Mixed precision: bf16 parameters, activations and gradients with f32 master weights, at
// t = 2 and 4 against one rank in bf16 from the same seed. The row-parallel outputs are
// all-reduced in bf16 (each rank's partial product rounded to bf16, summed in f32, rounded
// again) where one rank rounds its GEMM's f32 sum once, so activations differ by bf16 rounding
// (2^-9 relative) from the first block on, and the split summation order carries that through
// 10 steps. Seen (2026-11-27, every case below, fp16 too): losses < 2.8e-4 relative, gradient
// norms < 1.3e-2, whole weights' RMS difference < 7.2e-4, largest < 0.041 (a weight whose
// gradient is near zero moves by up to ~lr = 3e-3 a step in either direction under Adam, so
// 10 steps can part two runs by ~0.06). The bounds are ~3.5× those; a row-parallel bias added
// twice in 16-bit (zero at the start, so its harm grows as it trains) was seen failing them
// within the 10 steps: losses 6e-3 relative off, gradient norms 7%.
Tolerance Bf16Tolerance() {
  return {.loss = 1e-3, .norm = 4e-2, .weights = 0.1, .weights_rms = 2.5e-3};
}

JobSpec Bf16(JobSpec job) {
  auto* p = job.mutable_precision();
  p->set_param_dtype(zerotrain::PrecisionConfig::BF16);
  p->set_compute_dtype(zerotrain::PrecisionConfig::BF16);
  p->set_grad_dtype(zerotrain::PrecisionConfig::BF16);
  return job;
}

TEST_F(TensorParallelTrainingTest, Bf16OnTwoAndFourRanksMatchesOneRankInBf16) {
  for (const bool llama : {false, true}) {
    const Outcome reference = Run(Bf16(llama ? Llama(1, 1, 0, 2) : Gpt2(1, 1, 0, 2)), 10);
    for (int tp : {2, 4}) {
      const JobSpec job = Bf16(llama ? Llama(tp, 1, 0, 2) : Gpt2(tp, 1, 0, 2));
      const std::string what =
          (llama ? "llama" : "gpt2") + std::string(" bf16 tp ") + std::to_string(tp);
      const Outcome got = Run(job, 10);
      ExpectSameTraining(got, reference, what, Bf16Tolerance());
    }
  }
  // TP2 × DP2 under ZeRO-1 in bf16: the gradients' data-parallel reduce-scatter in bf16 too.
  ExpectSameTraining(Run(Bf16(Llama(2, 2, 1, 2)), 10), Run(Bf16(Llama(1, 1, 0, 4)), 10),
                     "llama bf16 tp2 x dp2 zero-1", Bf16Tolerance());
}

// fp16 with the dynamic loss scaler at t = 2: a first scale of 2^40 overflows the fp16
// gradients, every TP rank sees the overflow (the flags are gathered over the group), skips
// the same steps and backs off alike; the run then trains as one rank in fp16 does.
TEST_F(TensorParallelTrainingTest, Fp16WithLossScalingOnTwoRanksMatchesOneRank) {
  auto fp16 = [](JobSpec job) {
    auto* p = job.mutable_precision();
    p->set_param_dtype(zerotrain::PrecisionConfig::FP16);
    p->set_compute_dtype(zerotrain::PrecisionConfig::FP16);
    p->set_grad_dtype(zerotrain::PrecisionConfig::FP16);
    p->mutable_loss_scale()->set_initial_power(24);
    p->mutable_loss_scale()->set_hysteresis(1);
    job.mutable_train()->set_max_steps(20);
    return job;
  };
  const Outcome reference = Run(fp16(Gpt2(1, 1, 0, 2)), 20);
  const Outcome got = Run(fp16(Gpt2(2, 1, 0, 2)), 20);
  ASSERT_TRUE(got.status.ok()) << got.status;
  ASSERT_TRUE(reference.status.ok()) << reference.status;
  EXPECT_GT(reference.ranks[0].skipped, 5) << "2^40 must overflow fp16 gradients";
  for (const RankRun& r : got.ranks) {
    EXPECT_EQ(r.skipped, reference.ranks[0].skipped) << "tp rank " << r.tp_rank;
  }
  // fp16 keeps 11 significant bits, finer than bf16's 8: the bf16 bounds hold.
  ExpectSameTraining(got, reference, "gpt2 fp16 tp 2", Bf16Tolerance());
}

// Adafactor's factored second moments of a split matrix are the logical matrix's: a
// column-parallel weight (its output rows split) sums its column statistics, Σ param², Σ U² and
// Σ R over the group; a row-parallel weight its row statistics, Σ param² and Σ U²; a split bias
// Σ param² and Σ U². Without those sums a rank's C (or R) covers its part only. Summing float
// partials instead of one double sum
// adds ~1e-7 relative noise to the statistics, the order of the gradients' reduction noise:
// ExpectSameTraining's f32 bounds. GPT-2 (tied, so wte's rows also feed the head) at t = 2
// and 4, Llama (KV heads split) at t = 2; TP2 × DP2 under ZeRO-2, where the ZeRO shard group's
// sums come first, then the tensor-parallel group's; and that job with the optimizer offloaded.
TEST_F(TensorParallelTrainingTest, AdafactorOnTwoRanksMatchesOneRank) {
  auto adafactor = [](JobSpec job) {
    job.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAFACTOR);
    job.mutable_optimizer()->mutable_adafactor()->set_beta1(0.9f);
    return job;
  };
  // Hugging Face's defaults: the relative step scaled by RMS(param) moves these weights by
  // ~2e-4 a step, too little to learn much in 10 steps, so the runs are compared without the
  // learning check. (With the job's absolute lr 3e-3 instead, ZeRO-1 over 2 ranks without any
  // tensor parallelism already parts from one rank by ~1e-2 in some weights after 10 steps:
  // Adafactor's normalized steps carry the reduction noise of near-zero gradients at full size.)
  const Tolerance f32_noise{.learns = false};
  const Outcome gpt2 = Run(adafactor(Gpt2(1, 1, 0, 2)), 10);
  for (int tp : {2, 4}) {
    ExpectSameTraining(Run(adafactor(Gpt2(tp, 1, 0, 2)), 10), gpt2,
                       "gpt2 adafactor tp " + std::to_string(tp), f32_noise);
  }
  ExpectSameTraining(Run(adafactor(Llama(2, 1, 0, 2)), 10), Run(adafactor(Llama(1, 1, 0, 2)), 10),
                     "llama adafactor tp 2", f32_noise);
  const JobSpec zero2 = adafactor(Gpt2(2, 2, 2, 2));
  const Outcome device = Run(zero2, 10);
  ExpectSameTraining(device, Run(adafactor(Gpt2(1, 1, 0, 4)), 10),
                     "gpt2 adafactor tp2 x dp2 zero-2", f32_noise);
  // The optimizer offloaded to the host steps the same shares with the same sums: bit for bit
  // the device path (as OptimizerOffloadIsTheDevicePathBitForBit for AdamW).
  JobSpec offloaded = zero2;
  offloaded.mutable_offload()->set_optimizer(zerotrain::OffloadConfig::CPU);
  offloaded.mutable_offload()->set_buffer_count(4);
  offloaded.mutable_offload()->set_buffer_size(1 << 20);
  const Outcome host = Run(offloaded, 10);
  ASSERT_TRUE(host.status.ok()) << host.status;
  for (size_t r = 0; r < host.ranks.size(); ++r) {
    EXPECT_EQ(host.ranks[r].losses, device.ranks[r].losses) << "offloaded, rank " << r;
    EXPECT_TRUE(host.ranks[r].params == device.ranks[r].params) << "offloaded, rank " << r;
    EXPECT_GT(host.ranks[r].offloaded_bytes, 0) << "offloaded, rank " << r;
  }
}

// Replicated KV heads (n_kv_head < t): each head's K and V rows sit in the qkv weight of
// t / n_kv_head ranks, identical there (their gradients summed over those ranks), and only the
// first of them counts the rows in the group's column sums, Σ param², Σ R_i and Σ U² — so the
// factored statistics are the one-rank matrix's. Llama with n_kv_head 2 and 1 at t = 4, and
// under ZeRO-2 at TP4 × DP2, against one rank, to AdafactorOnTwoRanksMatchesOneRank's bounds
// (a row counted twice or four times moves C and mean(R) by a factor of the copies: far
// outside them).
TEST_F(TensorParallelTrainingTest, AdafactorWithReplicatedKvHeadsMatchesOneRank) {
  auto adafactor = [](JobSpec job, int kv_heads) {
    job.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAFACTOR);
    job.mutable_optimizer()->mutable_adafactor()->set_beta1(0.9f);
    job.mutable_model()->set_n_kv_head(kv_heads);
    return job;
  };
  const Tolerance f32_noise{.learns = false};
  for (int kv_heads : {2, 1}) {
    const std::string what = "llama adafactor tp 4, n_kv_head " + std::to_string(kv_heads);
    const Outcome one = Run(adafactor(Llama(1, 1, 0, 2), kv_heads), 10);
    ExpectSameTraining(Run(adafactor(Llama(4, 1, 0, 2), kv_heads), 10), one, what, f32_noise);
  }
  ExpectSameTraining(Run(adafactor(Llama(4, 2, 2, 2), 2), 10),
                     Run(adafactor(Llama(1, 1, 0, 4), 2), 10),
                     "llama adafactor tp4 x dp2 zero-2, n_kv_head 2", f32_noise);
}

// model.init_from reads the whole model and each rank keeps its share: a Hugging Face file
// (trained weights, not an initialisation's) and a tensor-parallel checkpoint of another
// degree both start TP 2 and 4 (a vocabulary of 34 pads at 4) exactly where one rank starts.
TEST_F(TensorParallelTrainingTest, InitFromAWholeModelOrACheckpointMatchesOneRank) {
  JobSpec first = Llama(2, 1, 0, 2);
  first.mutable_train()->set_max_steps(3);
  first.mutable_checkpoint()->set_dir((dir_ / "tp2-ckpt").string());
  first.mutable_checkpoint()->set_interval_steps(3);
  const Outcome trained = Run(first, 3, "", /*use_run=*/true);
  ASSERT_TRUE(trained.status.ok()) << trained.status;
  const ModelLayout layout = BuildModelLayout(first.model());
  std::vector<const float*> whole;
  for (const std::vector<float>& u : trained.ranks[0].whole) whole.push_back(u.data());
  const std::string hf = (dir_ / "trained.safetensors").string();
  ASSERT_TRUE(ExportHuggingFace(hf, first.model(), layout, whole).ok());

  for (const std::string& source : {hf, first.checkpoint().dir()}) {
    JobSpec one = Llama(1, 1, 0, 2);
    one.mutable_model()->set_init_from(source);
    const Outcome reference = Run(one, 10);
    ASSERT_TRUE(reference.status.ok()) << reference.status;
    // The start is the trained model, not a fresh one: the first loss is below a fresh
    // model's (ln 34 ≈ 3.5 for uniform predictions).
    EXPECT_LT(reference.ranks[0].losses[0], Run(Llama(1, 1, 0, 2), 1).ranks[0].losses[0]);
    for (int tp : {2, 4}) {
      JobSpec job = Llama(tp, 1, 0, 2);
      job.mutable_model()->set_init_from(source);
      ExpectSameTraining(Run(job, 10), reference,
                         "llama tp " + std::to_string(tp) + " from " + source);
    }
  }
}

TEST_F(TensorParallelTrainingTest, TwoByTwoWithZeroOneMatchesOneRank) {
  // TP2 × DP2, ZeRO-1 inside each data-parallel group; one rank reads the global batch (4).
  for (const bool llama : {false, true}) {
    const JobSpec job = llama ? Llama(2, 2, 1, 2) : Gpt2(2, 2, 1, 2);
    const Outcome reference = Run(llama ? Llama(1, 1, 0, 4) : Gpt2(1, 1, 0, 4), 10);
    const std::string what = llama ? "llama tp2 x dp2 zero-1" : "gpt2 tp2 x dp2 zero-1";
    const Outcome got = Run(job, 10);
    ExpectSameTraining(got, reference, what);
    // The two data-parallel replicas of each TP rank end with the same shares.
    ASSERT_EQ(got.ranks.size(), 4u);
    EXPECT_EQ(got.ranks[0].params, got.ranks[2].params) << what;
    EXPECT_EQ(got.ranks[1].params, got.ranks[3].params) << what;
  }
}

TEST_F(TensorParallelTrainingTest, ZeroTwoAndThreeInsideTheDataParallelGroupsMatchOneRank) {
  // Gradients (2) and parameters (3, the tied embedding kept gathered) sharded over each TP
  // rank's data-parallel group; Llama at TP4 × DP2 with its replicated KV heads, whose
  // gradients are summed before the reduce-scatter.
  const Outcome gpt2 = Run(Gpt2(1, 1, 0, 4), 10);
  for (int stage : {2, 3}) {
    ExpectSameTraining(Run(Gpt2(2, 2, stage, 2), 10), gpt2,
                       "gpt2 tp2 x dp2 zero-" + std::to_string(stage));
  }
  ExpectSameTraining(Run(Llama(4, 2, 3, 2), 10), Run(Llama(1, 1, 0, 4), 10),
                     "llama tp4 x dp2 zero-3");
}

// Optimizer offload steps each rank's shares like any flat shard: TP2 × DP2 with the
// optimizer in host memory (ZeRO-Offload) or on NVMe (ZeRO-Infinity) is the same job without
// offload, bit for bit (the same kernels over the same shards, on the CPU).
TEST_F(TensorParallelTrainingTest, OptimizerOffloadIsTheDevicePathBitForBit) {
  for (int stage : {1, 2}) {
    const JobSpec plain = Llama(2, 2, stage, 2);
    const Outcome reference = Run(plain, 6);
    ASSERT_TRUE(reference.status.ok()) << reference.status;
    for (const auto where : {zerotrain::OffloadConfig::CPU, zerotrain::OffloadConfig::NVME}) {
      JobSpec job = plain;
      job.mutable_offload()->set_optimizer(where);
      job.mutable_offload()->set_buffer_count(4);
      job.mutable_offload()->set_buffer_size(1 << 20);
      if (where == zerotrain::OffloadConfig::NVME) {
        std::filesystem::create_directories(dir_ / "swap");
        job.mutable_offload()->set_nvme_path((dir_ / "swap").string());
      }
      const std::string what =
          zerotrain::OffloadConfig::Device_Name(where) + " at ZeRO-" + std::to_string(stage);
      const Outcome got = Run(job, 6);
      ASSERT_TRUE(got.status.ok()) << what << ": " << got.status;
      for (size_t r = 0; r < got.ranks.size(); ++r) {
        EXPECT_EQ(got.ranks[r].losses, reference.ranks[r].losses) << what << ", rank " << r;
        EXPECT_TRUE(got.ranks[r].params == reference.ranks[r].params) << what << ", rank " << r;
        EXPECT_GT(got.ranks[r].offloaded_bytes, 0) << what << ", rank " << r;
      }
    }
  }
}

TEST_F(TensorParallelTrainingTest, AccumulationCheckpointingAndEvaluationMatchOneRank) {
  // Two micro-batches a step (the replicated KV heads' gradients summed once, on the last),
  // FULL activation checkpointing (the backward's recompute runs the attention all-reduce
  // again on every rank), and evaluation through the same parallel cross-entropy.
  auto with = [&](JobSpec job) { return AccumulatedCheckpointedEvaluated(std::move(job)); };
  const Outcome reference = Run(with(Llama(1, 1, 0, 2)), 10, "", /*use_run=*/true);
  ASSERT_TRUE(reference.status.ok()) << reference.status;
  ASSERT_EQ(reference.ranks[0].val_losses.size(), 2u);
  ExpectSameTraining(Run(with(Llama(4, 1, 0, 2)), 10, "", /*use_run=*/true), reference,
                     "llama tp 4, accumulation 2, full checkpointing");
  ExpectSameTraining(Run(with(Gpt2(2, 1, 0, 2)), 10, "", /*use_run=*/true),
                     Run(with(Gpt2(1, 1, 0, 2)), 10, "", /*use_run=*/true),
                     "gpt2 tp 2, accumulation 2, full checkpointing");
}

TEST_F(TensorParallelTrainingTest, CheckpointResumesBitIdenticallyAndExportsTheWholeModel) {
  JobSpec job = Llama(2, 1, 0, 2);
  job.mutable_train()->set_max_steps(6);
  job.mutable_checkpoint()->set_interval_steps(3);
  JobSpec straight = job;
  straight.mutable_checkpoint()->set_dir((dir_ / "straight").string());
  const Outcome whole = Run(straight, 6, "", /*use_run=*/true);
  ASSERT_TRUE(whole.status.ok()) << whole.status;

  job.mutable_checkpoint()->set_dir((dir_ / "interrupted").string());
  const Outcome first = Run(job, 3, "", /*use_run=*/true);
  ASSERT_TRUE(first.status.ok()) << first.status;
  const Outcome second = Run(job, 6, job.checkpoint().dir(), /*use_run=*/true);
  ASSERT_TRUE(second.status.ok()) << second.status;
  ASSERT_EQ(second.ranks[0].losses.size(), 3u);
  for (int r = 0; r < 2; ++r) {
    for (int s = 0; s < 3; ++s) {
      EXPECT_EQ(second.ranks[r].losses[s], whole.ranks[r].losses[3 + s]) << "step " << 4 + s;
    }
    EXPECT_EQ(second.ranks[r].params, whole.ranks[r].params) << "rank " << r;
  }
  // The checkpoint's whole weights, joined from the rank files' shares: model.init_from's
  // (ReadCheckpointWeights) are FullWeights' at the end of the run, bit for bit (elements are
  // placed, not computed); `zt export`'s (ExportCheckpoint) file is ExportHuggingFace's of them
  // byte for byte, as `zt train --export` writes it.
  const ModelLayout layout = BuildModelLayout(job.model());
  std::vector<std::vector<float>> read(layout.units.size());
  std::vector<float*> units;
  std::vector<const float*> whole_units;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    read[u].assign(layout.units[u].numel, std::nanf(""));
    units.push_back(read[u].data());
    whole_units.push_back(second.ranks[0].whole[u].data());
  }
  ASSERT_TRUE(ReadCheckpointWeights(job.checkpoint().dir(), job.model(), units).ok());
  EXPECT_TRUE(read == second.ranks[0].whole);
  absl::StatusOr<CheckpointExportResult> exported =
      ExportCheckpoint(job.checkpoint().dir(), (dir_ / "export").string(), {});
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->step, 6);
  const std::string direct = (dir_ / "direct.safetensors").string();
  ASSERT_TRUE(ExportHuggingFace(direct, job.model(), layout, whole_units).ok());
  const auto bytes = [](const std::filesystem::path& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const std::string from_checkpoint = bytes(dir_ / "export" / kHfWeightsName);
  ASSERT_FALSE(from_checkpoint.empty());
  EXPECT_TRUE(from_checkpoint == bytes(direct));
}

// Whole weights within the bound of ExpectSameTraining (reduction-order noise through a few
// Adam steps; a misplaced share is off by ~lr).
void ExpectSameWholeWeights(const Outcome& got, const Outcome& want, const std::string& what) {
  ASSERT_TRUE(got.status.ok()) << what << ": " << got.status;
  for (const RankRun& r : got.ranks) {
    ASSERT_EQ(r.whole.size(), want.ranks[0].whole.size()) << what;
    double worst = 0;
    for (size_t u = 0; u < r.whole.size(); ++u) {
      ASSERT_EQ(r.whole[u].size(), want.ranks[0].whole[u].size()) << what;
      for (size_t i = 0; i < r.whole[u].size(); ++i) {
        worst = std::max(worst, std::abs(double{r.whole[u][i]} - want.ranks[0].whole[u][i]));
      }
    }
    EXPECT_LT(worst, 1e-4) << what;
  }
}

TEST_F(TensorParallelTrainingTest, CheckpointsReshardAcrossTensorParallelLayouts) {
  // Written at one layout after 3 steps, resumed at another for 3 more: the losses and the
  // final weights of the uninterrupted run at the first layout, to reduction-order noise
  // (parameters and AdamW moments are placed element by element, exactly).
  struct Case {
    JobSpec from, to;
    std::string what;
  };
  const Case cases[] = {
      {Llama(2, 1, 0, 2), Llama(4, 1, 0, 2), "llama tp2 -> tp4 (KV heads split -> replicated)"},
      {Llama(2, 1, 0, 2), Llama(1, 1, 0, 2), "llama tp2 -> one rank"},
      {Gpt2(2, 2, 1, 2), Gpt2(1, 1, 0, 4), "gpt2 tp2 x dp2 zero-1 -> one rank"},
      {Gpt2(1, 1, 0, 4), Gpt2(2, 2, 3, 2), "gpt2 one rank -> tp2 x dp2 zero-3"},
  };
  int n = 0;
  for (Case c : cases) {
    const std::string dir = (dir_ / ("reshard-" + std::to_string(n++))).string();
    c.from.mutable_train()->set_max_steps(6);
    c.from.mutable_checkpoint()->set_interval_steps(3);
    c.from.mutable_checkpoint()->set_dir(dir);
    const Outcome first = Run(c.from, 3, "", /*use_run=*/true);
    ASSERT_TRUE(first.status.ok()) << c.what << ": " << first.status;
    JobSpec straight = c.from;
    straight.mutable_checkpoint()->set_dir(dir + "-straight");
    const Outcome whole = Run(straight, 6, "", /*use_run=*/true);
    ASSERT_TRUE(whole.status.ok()) << c.what << ": " << whole.status;
    c.to.mutable_train()->set_max_steps(6);
    const Outcome resumed = Run(c.to, 6, dir, /*use_run=*/true);
    ASSERT_TRUE(resumed.status.ok()) << c.what << ": " << resumed.status;
    for (const RankRun& r : resumed.ranks) {
      ASSERT_EQ(r.losses.size(), 3u) << c.what;
      for (int s = 0; s < 3; ++s) {
        // The bound of ExpectSameTraining.
        EXPECT_NEAR(r.losses[s], whole.ranks[0].losses[3 + s], 1e-6 * whole.ranks[0].losses[3 + s])
            << c.what << " step " << 4 + s;
      }
    }
    ExpectSameWholeWeights(resumed, whole, c.what);
  }
  // 8-bit Adam's block-quantized moments reshard through their logical values (the numerics:
  // TensorPipelineTrainingTest.EightBitAdamWAndAdafactorStatesReshardAcrossLayouts), where
  // they were refused by name; another optimizer's states are refused before any is read.
  JobSpec adam8 = Llama(2, 1, 0, 2);
  adam8.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAMW_8BIT);
  adam8.mutable_optimizer()->set_min_quantized_numel(64);
  adam8.mutable_train()->set_max_steps(6);
  adam8.mutable_checkpoint()->set_interval_steps(3);
  adam8.mutable_checkpoint()->set_dir((dir_ / "adam8").string());
  ASSERT_TRUE(Run(adam8, 3, "", /*use_run=*/true).status.ok());
  JobSpec adam8_one = adam8;
  adam8_one.mutable_parallel()->set_world_size(1);
  adam8_one.mutable_parallel()->set_tensor_parallel(1);
  adam8_one.mutable_checkpoint()->clear_dir();
  EXPECT_TRUE(Run(adam8_one, 6, adam8.checkpoint().dir(), /*use_run=*/true).status.ok());
  JobSpec adafactor_one = adam8_one;
  adafactor_one.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAFACTOR);
  const Outcome refused = Run(adafactor_one, 6, adam8.checkpoint().dir(), /*use_run=*/true);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kFailedPrecondition) << refused.status;
  EXPECT_NE(refused.status.message().find("another optimizer configuration"), std::string::npos)
      << refused.status;
}

// Sequence parallelism (Korthikanti et al. 2022, section 4.2.2): the norms, residual adds and
// residual stream on each rank's 1/t of the token rows, the all-reduces become reduce-scatter
// and all-gather pairs, and the norms' partial gradients are summed over the TP group before
// the data-parallel reduction. The same model as TP alone, so the same bounds against one rank
// (the norms' weight gradients are summed in another order, well inside them), and every plan
// buffer used: the activations are the plan's token-row shards (ExpectSameTraining).
JobSpec SequenceParallel(JobSpec job) {
  job.mutable_parallel()->set_sequence_parallel(true);
  return job;
}

// The CUDA rank's path on the CPU: devices whose memory is their own (arenas on cpu:1, host
// buffers on cpu:0, communicators staged through a copy engine), where every kernel and every
// staged collective refuses memory of the other side. TP and SP, GQA, TP × DP at ZeRO 1 and 3
// in bf16, accumulation with checkpointing and evaluation, and the export's join of the
// shares train through them bit for bit as on the plain CPU device.
TEST_F(TensorParallelTrainingTest, RanksWhoseMemoryIsTheirOwnTrainBitForBit) {
  std::vector<std::pair<std::string, JobSpec>> cases = {
      {"gpt2 tp2", Gpt2(2, 1, 0, 4)},
      {"llama tp2", Llama(2, 1, 0, 4)},
      {"tp2 x dp2 zero-1", Gpt2(2, 2, 1, 2)},
      {"accumulated, checkpointed, evaluated", AccumulatedCheckpointedEvaluated(Gpt2(2, 1, 0, 4))}};
  JobSpec sp = Gpt2(2, 1, 0, 4);
  sp.mutable_parallel()->set_sequence_parallel(true);
  cases.emplace_back("gpt2 tp2 sp", sp);
  JobSpec bf16 = Gpt2(2, 2, 3, 2);
  bf16.mutable_precision()->set_param_dtype(zerotrain::PrecisionConfig::BF16);
  bf16.mutable_precision()->set_compute_dtype(zerotrain::PrecisionConfig::BF16);
  bf16.mutable_precision()->set_grad_dtype(zerotrain::PrecisionConfig::BF16);
  cases.emplace_back("tp2 x dp2 zero-3 bf16", bf16);
  for (const auto& [what, job] : cases) {
    const Outcome separate = Run(job, 4, "", /*use_run=*/true, /*separate_memory=*/true);
    const Outcome plain = Run(job, 4, "", /*use_run=*/true);
    ASSERT_TRUE(separate.status.ok()) << what << ": " << separate.status;
    ASSERT_TRUE(plain.status.ok()) << what << ": " << plain.status;
    for (size_t r = 0; r < plain.ranks.size(); ++r) {
      EXPECT_EQ(separate.ranks[r].losses, plain.ranks[r].losses) << what << " rank " << r;
      EXPECT_EQ(separate.ranks[r].grad_norms, plain.ranks[r].grad_norms) << what << " rank " << r;
      EXPECT_EQ(separate.ranks[r].val_losses, plain.ranks[r].val_losses) << what << " rank " << r;
      EXPECT_EQ(separate.ranks[r].whole, plain.ranks[r].whole) << what << " rank " << r;
    }
  }
}

TEST_F(TensorParallelTrainingTest, SequenceParallelOnTwoAndFourRanksMatchesOneRank) {
  // GPT-2 tied; Llama GQA untied with its KV heads split (t = 2) and replicated (t = 4).
  for (const bool llama : {false, true}) {
    const Outcome reference = Run(llama ? Llama(1, 1, 0, 2) : Gpt2(1, 1, 0, 2), 10);
    for (int tp : {2, 4}) {
      const JobSpec job = SequenceParallel(llama ? Llama(tp, 1, 0, 2) : Gpt2(tp, 1, 0, 2));
      const std::string what =
          (llama ? "llama" : "gpt2") + std::string(" sp tp ") + std::to_string(tp);
      const Outcome got = Run(job, 10);
      ExpectSameTraining(got, reference, what);
      // The norms' gradients too: summed over the group, each rank holds the whole one.
      ExpectSlicedGradients(job, got, reference, what);
    }
  }
}

TEST_F(TensorParallelTrainingTest, SequenceParallelAccumulationCheckpointingAndEvaluation) {
  // Two micro-batches a step (the norms' partial gradients accumulate over both and are summed
  // over the group once, on the last), FULL activation checkpointing (the recompute gathers and
  // reduce-scatters again on every rank, into the shared set's token-row shards) and
  // evaluation's forward through the shards.
  auto with = [&](JobSpec job) { return AccumulatedCheckpointedEvaluated(std::move(job)); };
  for (const bool llama : {false, true}) {
    const Outcome reference = Run(with(llama ? Llama(1, 1, 0, 2) : Gpt2(1, 1, 0, 2)), 10, "",
                                  /*use_run=*/true);
    ASSERT_TRUE(reference.status.ok()) << reference.status;
    ASSERT_EQ(reference.ranks[0].val_losses.size(), 2u);
    const int tp = llama ? 4 : 2;
    ExpectSameTraining(
        Run(SequenceParallel(with(llama ? Llama(tp, 1, 0, 2) : Gpt2(tp, 1, 0, 2))), 10, "",
            /*use_run=*/true),
        reference,
        (llama ? "llama" : "gpt2") + std::string(" sp tp ") + std::to_string(tp) +
            ", accumulation 2, full checkpointing");
  }
}

TEST_F(TensorParallelTrainingTest, SequenceParallelInsideEveryZeroStageMatchesOneRank) {
  // TP2 × DP2: the norms' gradients summed over the TP group, then reduce-scattered over the
  // data-parallel group (ZeRO-1), or reduced into the shards from the full buffers (ZeRO-2, 3).
  for (const bool llama : {false, true}) {
    const Outcome reference = Run(llama ? Llama(1, 1, 0, 4) : Gpt2(1, 1, 0, 4), 10);
    for (int stage : {1, 2, 3}) {
      const JobSpec job = SequenceParallel(llama ? Llama(2, 2, stage, 2) : Gpt2(2, 2, stage, 2));
      ExpectSameTraining(
          Run(job, 10), reference,
          (llama ? "llama" : "gpt2") + std::string(" sp tp2 x dp2 zero-") + std::to_string(stage));
    }
  }
}

TEST_F(TensorParallelTrainingTest, SequenceParallelInBf16MatchesOneRankInBf16) {
  // The reduce-scatters add in f32 and round once, as the all-reduces they replace; the norms'
  // bf16 gradients are summed over the group the same way: Bf16Tolerance's bounds hold.
  for (const bool llama : {false, true}) {
    const Outcome reference = Run(Bf16(llama ? Llama(1, 1, 0, 2) : Gpt2(1, 1, 0, 2)), 10);
    for (int tp : {2, 4}) {
      const JobSpec job = SequenceParallel(Bf16(llama ? Llama(tp, 1, 0, 2) : Gpt2(tp, 1, 0, 2)));
      ExpectSameTraining(
          Run(job, 10), reference,
          (llama ? "llama" : "gpt2") + std::string(" bf16 sp tp ") + std::to_string(tp),
          Bf16Tolerance());
    }
  }
}

// Per step, each rank sends what TP alone sends: an all-gather plus a reduce-scatter of B·T·C
// moves (t − 1)/t · B·T·C elements each way, a ring all-reduce 2 (t − 1)/t · B·T·C. On top,
// exactly two things: the backward gathers ln1's and ln2's token-row shards again for qkv's
// and mlp.fc's weight gradients (the plan keeps the norms' outputs as shards), and the norms'
// partial weight (and bias) gradients are all-reduced once a step. Exact, in f32 (the
// communicators count 4 bytes an element).
TEST_F(TensorParallelTrainingTest, SequenceParallelSendsTensorParallelBytesPlusItsRegathers) {
  for (const bool llama : {false, true}) {
    for (int tp : {2, 4}) {
      const JobSpec plain = llama ? Llama(tp, 1, 0, 2) : Gpt2(tp, 1, 0, 2);
      const std::string what =
          (llama ? "llama" : "gpt2") + std::string(" tp ") + std::to_string(tp);
      const Outcome without = Run(plain, 3);
      const Outcome with = Run(SequenceParallel(plain), 3);
      ASSERT_TRUE(without.status.ok()) << what << ": " << without.status;
      ASSERT_TRUE(with.status.ok()) << what << ": " << with.status;
      const JobSpec job = ValidatedJob(plain).value();
      const int64_t rows = int64_t{job.train().micro_batch_size()} * job.data().seq_len();
      const int64_t C = job.model().d_model(), L = job.model().n_layer();
      const int64_t regathers = 2 * L * (tp - 1) * (rows / tp) * C * 4;
      int64_t norm_sums = 0;
      for (const UnitLayout& u : BuildModelLayout(job.model()).units) {
        for (const ParamSpec& p : u.params) {
          if (p.name.starts_with("ln")) norm_sums += 2 * (tp - 1) * p.numel * 4 / tp;
        }
      }
      EXPECT_GT(norm_sums, 0) << what;
      for (size_t r = 0; r < with.ranks.size(); ++r) {
        ASSERT_EQ(with.ranks[r].comm_bytes.size(), 3u) << what;
        for (size_t s = 0; s < 3; ++s) {
          EXPECT_EQ(with.ranks[r].comm_bytes[s] - without.ranks[r].comm_bytes[s],
                    regathers + norm_sums)
              << what << ", rank " << r << ", step " << s + 1;
        }
      }
    }
  }
}

// The planner's tensor-parallel bytes (zt estimate --plan's comm_bytes_per_step) are what the
// engine sends, in bf16 too: Gloo reduces 16-bit data in f32, so a bf16 job's all-reduces and
// reduce-scatters send what an f32 job's do and only its all-gathers (sequence parallelism's)
// send half. The engine's per-step bytes minus the planner's are the same for an f32 and a bf16
// job of the same shape (what the planner leaves out, the step's f32 statistics, is the same in
// both), so the planner's bf16 figure is the engine's exactly. Counting reductions at the
// compute width (two bytes) made the bf16 plan short by half its all-reduces' bytes, and
// leaving out the vocabulary-parallel embedding's and head's collectives made it short by their
// all-gathers' under sequence parallelism (both seen failing here).
TEST_F(TensorParallelTrainingTest, PlannedTensorParallelBytesAreTheEnginesInBf16) {
  auto planned = [](const JobSpec& spec) -> int64_t {
    const absl::StatusOr<JobSpec> job = JobForPlanning(spec, {});
    EXPECT_TRUE(job.ok()) << job.status();
    const absl::StatusOr<zerotrain::ShardingPlan> plan =
        PlanSharding(*job, {.device_memory_bytes = int64_t{1} << 40, .layouts = LayoutSearch::kJob});
    EXPECT_TRUE(plan.ok()) << plan.status();
    for (const zerotrain::PlanCandidate& c : plan->candidates()) {
      if (c.tensor_parallel() == job->parallel().tensor_parallel() &&
          c.pipeline_parallel() == 1 && c.zero_stage() == job->parallel().zero_stage() &&
          // The job checkpoints nothing (unset: NONE); the bytes do not depend on it anyway.
          c.activation_checkpointing() == zerotrain::MemoryConfig::NONE) {
        return c.comm_bytes_per_step();
      }
    }
    std::string seen;
    for (const zerotrain::PlanCandidate& c : plan->candidates()) {
      seen += absl::StrCat(" tp", c.tensor_parallel(), " pp", c.pipeline_parallel(), " zero",
                           c.zero_stage(), " ", c.activation_checkpointing(), ";");
    }
    ADD_FAILURE() << "no candidate of the job's own layout (tp "
                  << job->parallel().tensor_parallel() << " zero " << job->parallel().zero_stage()
                  << " " << job->memory().activation_checkpointing() << "):" << seen;
    return -1;
  };
  for (const bool sequence : {false, true}) {
    const JobSpec f32 = sequence ? SequenceParallel(Gpt2(2, 1, 0, 2)) : Gpt2(2, 1, 0, 2);
    const JobSpec bf16 = Bf16(f32);
    const std::string what = sequence ? "sp tp 2" : "tp 2";
    const Outcome f32_run = Run(f32, 2), bf16_run = Run(bf16, 2);
    ASSERT_TRUE(f32_run.status.ok()) << what << ": " << f32_run.status;
    ASSERT_TRUE(bf16_run.status.ok()) << what << ": " << bf16_run.status;
    const int64_t f32_plan = planned(f32), bf16_plan = planned(bf16);
    EXPECT_GT(f32_plan, 0) << what;
    for (size_t r = 0; r < bf16_run.ranks.size(); ++r) {
      ASSERT_EQ(bf16_run.ranks[r].comm_bytes.size(), 2u) << what;
      for (size_t s = 0; s < 2; ++s) {
        EXPECT_EQ(bf16_run.ranks[r].comm_bytes[s] - bf16_plan,
                  f32_run.ranks[r].comm_bytes[s] - f32_plan)
            << what << ", rank " << r << ", step " << s + 1 << ": engine "
            << bf16_run.ranks[r].comm_bytes[s] << " bf16, " << f32_run.ranks[r].comm_bytes[s]
            << " f32; plan " << bf16_plan << " bf16, " << f32_plan << " f32";
      }
    }
  }
}

}  // namespace
}  // namespace zt
