// The harness of the pipeline training tests (pipeline_training_test.cc,
// tensor_pipeline_training_test.cc): a pipeline-parallel job (tensor-parallel stages or not)
// trained on every rank as threads, each rank's losses, gradient norms and final stage weights
// collected, and the comparison of such a run with one rank's from the same seed.
#pragma once

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/status_macros.h"
#include "tests/unit/worker/trainer/rank_threads.h"
#include "tests/unit/worker/trainer/separate_memory_device.h"
#include "tests/unit/worker/trainer/test_swap_store.h"
#include "worker/comm/store.h"
#include "worker/job/job_loading.h"
#include "worker/model/tensor_parallel_slice.h"
#include "worker/offload/node_swap_store.h"
#include "worker/offload/nvme_optimizer.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/memory_plan.h"
#include "worker/train/trainer.h"

namespace zt::testing {

struct PipelineRankRun {
  std::vector<double> losses, grad_norms;
  std::vector<double> val_losses;              // StepRecord::val_loss where it was evaluated
  std::vector<int64_t> comm_bytes;             // per step
  std::vector<std::optional<double>> bubbles;  // StepRecord::pipeline_bubble
  std::vector<std::string> unclaimed;          // plan buffers the rank never used
  // Categories whose arena high-water mark after the run differs from the rank's plan
  // (PlanMemory(job, its layout): what zt estimate plans), "<category> arena A plan P".
  std::vector<std::string> off_plan;
  // Per unit of the rank's stage, at the end: its parameters, when they are f32 and in memory
  // (a 16-bit run's f32 weights are its master weights, a swapped run's in the store: `whole`).
  std::vector<std::vector<float>> params;
  // FullWeights at the end: the whole model (BuildModelLayout's units) joined from the stages
  // (and their tensor-parallel shares), what `zt train --export` writes.
  std::vector<std::vector<float>> whole;
  // The rank's communicators' counters after the last step (before FullWeights' gathers).
  CommStats comm;
  int64_t skipped = 0;  // steps the fp16 loss scaler skipped (StepRecord::skipped), at the end
  int64_t offloaded_bytes = 0;  // offload.optimizer: to the host and out to swap, over the run
  // offload.params: the steps' parameter-shard uploads (StepRecord::param_upload_bytes, ...),
  // summed over the run.
  int64_t param_upload_bytes = 0, param_uploads_ahead = 0, param_uploads_at_gather = 0;
  // offload.params NVME (beside optimizer NVME): the NVMe optimizer's counts at the end, the
  // gathers' shard reads ahead and at the gather among them.
  NvmeOptimizer::Stats nvme;
  ModelLayout layout;           // the stage's units (tensor-parallel shares)
  std::vector<int> held_units;  // the whole model's index of each
  int tp_rank = 0;
};

struct PipelineOutcome {
  absl::Status status;
  zerotrain::JobSpec job;  // validated: defaults applied
  std::vector<PipelineRankRun> ranks;
};

// Every rank of `spec` to `steps` (Run(), from `resume` when set); with `separate_memory`,
// on devices whose memory is their own (separate_memory_device.h).
inline PipelineOutcome RunPipelineRanks(const zerotrain::JobSpec& spec, int steps,
                                        const std::string& resume = "",
                                        bool separate_memory = false) {
  PipelineOutcome out;
  absl::StatusOr<zerotrain::JobSpec> validated = ValidatedJob(spec);
  if (!validated.ok()) {
    out.status = validated.status();
    return out;
  }
  out.job = *validated;
  const zerotrain::JobSpec& job = out.job;
  const int n = job.parallel().world_size();
  InProcessStore store;
  const absl::StatusOr<std::shared_ptr<offload::SwapStore>> swap = OpenTestSwapStore(job);
  if (!swap.ok()) {
    out.status = swap.status();
    return out;
  }
  out.ranks.resize(n);
  out.status = RunRankThreads(n, [&](int r) -> absl::Status {
    TrainOptions options;
    options.rank = r;
    options.store = &store;
    options.swap_store = swap->get();
    options.resume_dir = resume;
    options.stop_after_step = steps;
    if (separate_memory) options.make_device = SeparateMemoryDevice;
    ZT_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(job, options));
    PipelineRankRun& mine = out.ranks[r];
    ZT_RETURN_IF_ERROR(t->Run([&](const StepRecord& rec) {
      mine.losses.push_back(rec.loss);
      mine.grad_norms.push_back(rec.grad_norm);
      mine.comm_bytes.push_back(rec.comm_bytes);
      mine.bubbles.push_back(rec.pipeline_bubble);
      mine.offloaded_bytes += rec.offload_bytes_to_host + rec.swap_bytes_out;
      mine.param_upload_bytes += rec.param_upload_bytes;
      mine.param_uploads_ahead += rec.param_uploads_ahead;
      mine.param_uploads_at_gather += rec.param_uploads_at_gather;
      if (rec.val_loss) mine.val_losses.push_back(*rec.val_loss);
      mine.skipped = rec.skipped;
    }));
    mine.comm = t->comm_stats();
    if (t->nvme_optimizer() != nullptr) mine.nvme = t->nvme_optimizer()->stats();
    for (const Tensor& p : t->model().unit_params()) {
      // 16-bit parameters, or shards in the swap store (offload.params NVME): `whole` only.
      if (p.dtype() != DType::kF32 || p.raw() == nullptr) break;
      mine.params.emplace_back(p.data<float>(), p.data<float>() + p.numel());
    }
    ZT_ASSIGN_OR_RETURN(mine.whole, t->FullWeights());
    mine.layout = t->model().layout();
    mine.held_units = t->model().held_units();
    mine.tp_rank = t->model().tensor_parallel().rank;
    mine.unclaimed = t->arenas().UnclaimedBuffers();
    const MemoryPlan plan = PlanMemory(job, ParallelLayout::ForJob(job, r));
    for (int c = 0; c < kMemoryCategoryCount; ++c) {
      const auto category = static_cast<MemoryCategory>(c);
      // The swap store, not an arena, holds the NVMe category (the trainer checks at its start
      // that what it swaps is the plan's, buffer by buffer).
      const int64_t planned = category == MemoryCategory::kNvme ? 0 : plan.CategoryBytes(category);
      if (t->arenas().BytesInUse(category) != planned) {
        mine.off_plan.push_back(absl::StrCat(MemoryCategoryName(category), " arena ",
                                             t->arenas().BytesInUse(category), " plan ", planned));
      }
    }
    return absl::OkStatus();
  });
  return out;
}

// PP2 × DP2 ranks 0, 1 (stage 0) and 2, 3 (stage 1) hold halves of their stage's units: joined
// into whole units on both, as one rank's are (ExpectSameStageWeights reads them).
inline void JoinDataParallelShards(PipelineOutcome& run) {
  for (int first : {0, 2}) {
    for (size_t u = 0; u < run.ranks[first].params.size(); ++u) {
      const std::vector<float>& second = run.ranks[first + 1].params[u];
      run.ranks[first].params[u].insert(run.ranks[first].params[u].end(), second.begin(),
                                        second.end());
    }
    run.ranks[first + 1].params = run.ranks[first].params;
  }
}

// Every stage's final weights of `got` against the whole model of `want`'s rank 0 (one rank,
// or any run whose ranks hold whole units), to `weight_bound` (ExpectSamePipelineTraining's
// 1e-4 by default): each tensor
// of a stage's unit against the whole tensor's slice for the rank's tensor coordinate, and a
// head stage's copy of the tied wte against wte's slice. Every unit is held by some rank.
inline void ExpectSameStageWeights(const PipelineOutcome& got, const PipelineOutcome& want,
                                   const std::string& what, double weight_bound = 1e-4) {
  const zerotrain::ModelConfig& model = want.job.model();
  const int tp = std::max(1, got.job.parallel().tensor_parallel());
  const PipelineRankRun& ref = want.ranks[0];
  std::vector<int> units_seen(ref.params.size(), 0);
  for (const PipelineRankRun& r : got.ranks) {
    for (size_t local = 0; local < r.params.size(); ++local) {
      if (r.params.empty()) break;  // 16-bit parameters: compared whole (ExpectSameWholeWeights)
      const int u = r.held_units[local];
      ++units_seen[u];
      const UnitLayout& mine = r.layout.units[local];
      ASSERT_GE(r.params[local].size(), static_cast<size_t>(mine.numel)) << what << " unit " << u;
      double worst = 0;
      for (const ParamSpec& p : mine.params) {
        // A tensor of the one-rank unit, or (the last stage's head, when it holds a copy of the
        // tied wte) the embedding's wte, which the copy stays equal to.
        const ParamSpec* whole = ref.layout.units[u].Find(p.name);
        const int ref_unit = whole != nullptr ? u : 0;
        if (whole == nullptr) whole = ref.layout.units[0].Find("wte");
        ASSERT_NE(whole, nullptr) << what << " unit " << u << " " << p.name;
        std::vector<float> expected(p.numel);
        ExtractSlice(SliceOf(model, whole->name, whole->shape, tp, r.tp_rank),
                     ref.params[ref_unit].data() + whole->offset, expected.data());
        for (int64_t i = 0; i < p.numel; ++i) {
          worst = std::max(worst, std::abs(double{r.params[local][p.offset + i]} - expected[i]));
        }
      }
      EXPECT_LT(worst, weight_bound) << what << " unit " << u << " weights, tp rank " << r.tp_rank;
    }
  }
  for (size_t u = 0; u < units_seen.size(); ++u) {
    EXPECT_GE(units_seen[u], 1) << what << " unit " << u;
  }
}

// Every rank's FullWeights of `got` (the whole model joined from the stages and their shares)
// against `want`'s rank 0 (one rank): the same on every rank, bit for bit, and within
// `bound` of the reference element by element, within `rms_bound` in root mean square.
inline void ExpectSameWholeWeights(const PipelineOutcome& got, const PipelineOutcome& want,
                                   const std::string& what, double bound, double rms_bound) {
  const std::vector<std::vector<float>>& ref = want.ranks[0].whole;
  ASSERT_FALSE(ref.empty()) << what;
  for (const PipelineRankRun& r : got.ranks) {
    EXPECT_TRUE(r.whole == got.ranks[0].whole) << what << ": every rank exports the same model";
    ASSERT_EQ(r.whole.size(), ref.size()) << what;
    double worst = 0, sum_sq = 0;
    int64_t n = 0;
    for (size_t u = 0; u < ref.size(); ++u) {
      ASSERT_EQ(r.whole[u].size(), ref[u].size()) << what << " unit " << u;
      for (size_t i = 0; i < ref[u].size(); ++i) {
        const double d = std::abs(double{r.whole[u][i]} - ref[u][i]);
        worst = std::max(worst, d);
        sum_sq += d * d;
        ++n;
      }
    }
    EXPECT_LT(worst, bound) << what << ": whole weights";
    EXPECT_LT(std::sqrt(sum_sq / static_cast<double>(std::max<int64_t>(n, 1))), rms_bound)
        << what << ": whole weights' RMS difference";
  }
}

// `got` (pipeline stages, tensor-parallel or not, each rank's parameters whole at its ZeRO
// stage: a ZeRO-3 run's shards joined by the caller) against `want` (one rank, 10 steps):
// losses, gradient norms, validation losses and every stage's weights — each tensor of a stage's
// unit against the one-rank tensor's slice for the rank's tensor coordinate (the whole tensor
// without tensor parallelism), and a head stage's copy of the tied wte against wte's slice.
//
// Tolerances: a stage runs the one-rank model's ops on the same values; what differs is the
// order of sums — the tied wte's two copies' gradients added after the backward instead of
// accumulated in it, ZeRO's reductions, the gradient norm summed per stage then over stages,
// and under tensor parallelism the row-parallel GEMMs' partial products and the parallel
// cross-entropy's per-shard sums added over the group. Those are fp32 reduction noise (a few
// ulps) carried through 10 Adam steps; 1e-6 in the loss, 2e-5 in the norm and 1e-4 per weight
// are the tensor-parallel tests' bounds for the same noise (seen < 2e-8, < 1.4e-6 and
// < 1.3e-5 there) and far below a lost micro-batch, an unsummed tied copy (half of wte's
// gradient), a stage or a replicated tensor counted twice in the norm (≥ 1e-3) or a wrong
// slice (~lr = 3e-3 in one step). A caller whose model is deeper may pass a larger
// `weight_bound`, saying why; one whose optimizer moves the weights too little for the loss to
// fall by 0.1 in 10 steps (Adafactor's relative step) passes `expect_learning` false.
inline void ExpectSamePipelineTraining(const PipelineOutcome& got, const PipelineOutcome& want,
                                       const std::string& what, double weight_bound = 1e-4,
                                       bool expect_learning = true) {
  ASSERT_TRUE(got.status.ok()) << what << ": " << got.status;
  ASSERT_TRUE(want.status.ok()) << what << ": " << want.status;
  const PipelineRankRun& ref = want.ranks[0];
  ASSERT_EQ(ref.losses.size(), 10u) << what;
  if (expect_learning) {
    EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.1) << what << ": the model learns";
  }
  for (const PipelineRankRun& r : got.ranks) {
    EXPECT_TRUE(r.unclaimed.empty()) << what << ": unused plan buffer " << r.unclaimed.front();
    EXPECT_TRUE(r.off_plan.empty()) << what << ": " << r.off_plan.front();
    ASSERT_EQ(r.losses.size(), ref.losses.size()) << what;
    for (size_t s = 0; s < ref.losses.size(); ++s) {
      EXPECT_NEAR(r.losses[s], ref.losses[s], 1e-6 * ref.losses[s]) << what << " step " << s + 1;
      EXPECT_NEAR(r.grad_norms[s], ref.grad_norms[s], 2e-5 * ref.grad_norms[s])
          << what << " gradient norm, step " << s + 1;
    }
    // Validation losses (data.val): a forward of the same weights, to the losses' bound.
    ASSERT_EQ(r.val_losses.size(), ref.val_losses.size()) << what;
    for (size_t k = 0; k < ref.val_losses.size(); ++k) {
      EXPECT_NEAR(r.val_losses[k], ref.val_losses[k], 1e-6 * ref.val_losses[k])
          << what << " validation " << k + 1;
    }
  }
  ExpectSameStageWeights(got, want, what, weight_bound);
  // The export (FullWeights) of the stages: the one-rank model's, to the same bound.
  ExpectSameWholeWeights(got, want, what, weight_bound, weight_bound);
}

}  // namespace zt::testing
