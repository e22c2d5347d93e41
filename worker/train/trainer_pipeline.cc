// Trainer: the pipeline schedule's step and evaluation, and its measured bubble.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/util/json_util.h"
#include "kernels/elementwise.h"
#include "kernels/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/checkpoint_directory.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/checkpoint/hf_interop.h"
#include "worker/checkpoint/rank_state.h"
#include "worker/checkpoint/tensor_parallel_reshard.h"
#include "worker/plan/pipeline_schedule.h"
#include "worker/train/trainer.h"
#include "worker/train/trainer_support.h"

namespace zt {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

absl::Status Trainer::RunPipelineSchedule(double loss_scale, int64_t step_counted,
                                          double* data_wait_s, PipelineTiming* timing) {
  Transformer& m = *model_;
  const auto schedule_start = Clock::now();
  double busy_s = 0;  // this stage's forwards and backwards
  const int64_t accum = job_.train().grad_accum_steps();
  const int64_t ranks = data_size_;
  const int v = m.chunks();
  // Sends in flight, per chunk and micro-batch slot: a slot's activations (and its gradient's
  // host copy) stay untouched until the send of the slot's previous micro-batch is done.
  std::vector<std::vector<std::optional<CommHandle>>> activation_sends(v), gradient_sends(v);
  for (int c = 0; c < v; ++c) {
    activation_sends[c].resize(m.in_flight(c));
    gradient_sends[c].resize(m.in_flight(c));
  }
  auto wait = [&](std::optional<CommHandle>& h) -> absl::Status {
    if (!h) return absl::OkStatus();
    absl::Status s = h->Wait();
    h.reset();
    return s;
  };
  // One scale for every counted target of the step (Step), known before the first backward.
  const float grad_scale = StepGradScale(loss_scale, step_counted);
  const int virtual_stages =
      job_.parallel().pipeline_schedule() == zerotrain::ParallelConfig::INTERLEAVED ? v : 1;
  const std::vector<PipelineOp> ops =
      PipelineStageOps(job_.parallel().pipeline_schedule(), pipeline_size_, pipeline_stage_,
                       static_cast<int>(accum), virtual_stages);
  // A ZeRO-3 stage that reshards after each forward gathers its units per use, prefetched in
  // this order across the ops.
  ZT_RETURN_IF_ERROR(engine_->BeginStagePass(ops, /*training=*/true));
  absl::Cleanup end_pass = [&] { engine_->EndStagePass().IgnoreError(); };
  for (const PipelineOp& op : ops) {
    const int k = op.micro_batch, c = op.chunk, slot = k % m.in_flight(c);
    const std::string label =
        absl::StrCat("chunk ", c, " micro-batch ", k, op.forward ? " forward" : " backward");
    ZT_RETURN_IF_ERROR(m.SelectMicroBatch(c, slot));
    const bool first = m.chunk_is_first(), last = m.chunk_is_last();
    if (m.layout().lora) {
      // The adapters' dropout masks of micro-batch k: the seed one rank draws for the same
      // global micro-batch (TrainStep), set again before its backward re-applies them.
      m.SetLoraDropoutSeed(job_.train().seed() * 0x9E3779B97F4A7C15ull +
                           static_cast<uint64_t>((step_ * accum + k) * ranks + data_rank_));
    }
    int64_t counted = 0;  // the last chunk's loss weighs by it (Step)
    if (first || last || train_batches_->packed()) {
      const auto fill_start = Clock::now();
      // The model's first chunk's embedding reads the tokens in its forward and backward, the
      // last chunk's loss the targets; a packed micro-batch's document starts and positions
      // are read by every chunk's attention (and RoPE), so every stage fills micro-batch k
      // again before each of its ops — the schedule interleaves micro-batches (1F1B), and the
      // batch is a pure function of k (DocumentSampler), so the stages agree without sending it.
      ZT_ASSIGN_OR_RETURN(counted,
                          UploadBatch(*train_batches_, (step_ * accum + k) * ranks + data_rank_));
      *data_wait_s += std::chrono::duration<double>(Clock::now() - fill_start).count();
    }
    const Transformer::LossOptions options{
        .write_grad = true,
        .grad_scale = grad_scale,
        .loss_sum = engine_->loss_accumulator(),
        .loss_divisor = MicroBatchLossDivisor(step_counted, counted, ranks)};
    if (op.forward) {
      // The slot's output of an older micro-batch may still be on its way.
      ZT_RETURN_IF_ERROR(wait(activation_sends[c][slot]));
      if (!first) {
        ZT_ASSIGN_OR_RETURN(CommHandle h, comms_.activations_in->Recv(m.stage_input(), 0, label));
        ZT_RETURN_IF_ERROR(h.Wait());
      }
      const auto compute_start = Clock::now();
      ZT_RETURN_IF_ERROR(m.StageForward(ctx_, options));
      busy_s += std::chrono::duration<double>(Clock::now() - compute_start).count();
      if (!last) {
        ZT_ASSIGN_OR_RETURN(CommHandle h, comms_.activations_out->Send(m.stage_output(), 1, label));
        activation_sends[c][slot] = h;
      }
    } else {
      if (!last) {
        ZT_ASSIGN_OR_RETURN(CommHandle h, comms_.gradients_in->Recv(m.residual_grad(), 1, label));
        ZT_RETURN_IF_ERROR(h.Wait());
      }
      const auto compute_start = Clock::now();
      ZT_RETURN_IF_ERROR(m.StageBackward(ctx_));
      busy_s += std::chrono::duration<double>(Clock::now() - compute_start).count();
      if (!first) {
        ZT_RETURN_IF_ERROR(wait(gradient_sends[c][slot]));
        // The slot's planned copy (in the compute dtype, as the activations are): the next
        // backward overwrites the residual gradient while this send goes.
        const Tensor buffer =
            pipeline_grad_sends_[c].Slice(slot, slot + 1).Reshape({m.residual_grad().numel()});
        ZT_RETURN_IF_ERROR(Cast(ctx_, m.residual_grad(), buffer));
        ZT_ASSIGN_OR_RETURN(CommHandle h, comms_.gradients_out->Send(buffer, 0, label));
        gradient_sends[c][slot] = h;
      }
    }
  }
  std::move(end_pass).Cancel();
  ZT_RETURN_IF_ERROR(engine_->EndStagePass());
  for (int c = 0; c < v; ++c) {
    for (int s = 0; s < m.in_flight(c); ++s) {
      ZT_RETURN_IF_ERROR(wait(activation_sends[c][s]));
      ZT_RETURN_IF_ERROR(wait(gradient_sends[c][s]));
    }
  }
  timing->busy_s = busy_s;
  timing->span_s = std::chrono::duration<double>(Clock::now() - schedule_start).count();
  // The tied embedding's two copies (wte on the first stage, the head's copy on the last) get
  // the sum of their gradients in the reduction. (A LoRA job's embedding and head are frozen:
  // the copies have no gradient and stay equal.)
  return engine_->ReduceStageGradients(
      ctx_, comms_.tied && !m.layout().lora ? comms_.tied.get() : nullptr);
}

absl::Status Trainer::RunPipelineEvaluation(int64_t n, int64_t total_counted) {
  Transformer& m = *model_;
  // A ZeRO-3 stage reads its units gathered again (the optimizer stepped the shards since):
  // whole for the pass, or per use in the order below with reshard_after_forward.
  ZT_RETURN_IF_ERROR(engine_->GatherStageUnits());
  const int v = m.chunks();
  std::vector<PipelineOp> ops;
  for (int64_t k = 0; k < n; ++k) {
    for (int c = 0; c < v; ++c) {
      ops.push_back({.forward = true, .micro_batch = static_cast<int>(k), .chunk = c});
    }
  }
  ZT_RETURN_IF_ERROR(engine_->BeginStagePass(ops, /*training=*/false));
  absl::Cleanup end_pass = [&] { engine_->EndStagePass().IgnoreError(); };
  // As in the training schedule: a slot's output stays untouched until its send is done.
  std::vector<std::vector<std::optional<CommHandle>>> sends(v);
  for (int c = 0; c < v; ++c) sends[c].resize(m.in_flight(c));
  auto wait = [](std::optional<CommHandle>& h) -> absl::Status {
    if (!h) return absl::OkStatus();
    absl::Status s = h->Wait();
    h.reset();
    return s;
  };
  // Micro-batch by micro-batch through the stage's chunks in model order: every link carries
  // its activations in the order its receiver asks for them (under INTERLEAVED too: the first
  // stage's chunk c + 1 waits for the last stage's chunk c of the same micro-batch), and the
  // sends leave while the stage goes on, so the stages overlap as GPipe's forwards do.
  for (int64_t k = 0; k < n; ++k) {
    for (int c = 0; c < v; ++c) {
      const int slot = static_cast<int>(k % m.in_flight(c));
      const std::string label = absl::StrCat("evaluation chunk ", c, " micro-batch ", k);
      ZT_RETURN_IF_ERROR(m.SelectMicroBatch(c, slot));
      int64_t counted = 0;  // the last chunk's loss weighs by it (Evaluate)
      // Every chunk of a packed micro-batch reads its document starts and positions.
      if (m.chunk_is_first() || m.chunk_is_last() || val_batches_->packed()) {
        ZT_ASSIGN_OR_RETURN(counted, UploadBatch(*val_batches_, k * data_size_ + data_rank_));
      }
      ZT_RETURN_IF_ERROR(wait(sends[c][slot]));
      if (!m.chunk_is_first()) {
        ZT_ASSIGN_OR_RETURN(CommHandle h, comms_.activations_in->Recv(m.stage_input(), 0, label));
        ZT_RETURN_IF_ERROR(h.Wait());
      }
      ZT_RETURN_IF_ERROR(m.StageForward(
          ctx_, {.loss_sum = engine_->loss_accumulator(),
                 .loss_divisor = MicroBatchLossDivisor(total_counted, counted, data_size_)}));
      if (!m.chunk_is_last()) {
        ZT_ASSIGN_OR_RETURN(sends[c][slot],
                            comms_.activations_out->Send(m.stage_output(), 1, label));
      }
    }
  }
  std::move(end_pass).Cancel();
  ZT_RETURN_IF_ERROR(engine_->EndStagePass());
  for (auto& chunk : sends) {
    for (std::optional<CommHandle>& h : chunk) ZT_RETURN_IF_ERROR(wait(h));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> Trainer::PipelineBubble(const PipelineTiming& timing) {
  // Every stage's (busy, span), gathered over the pipeline group: the schedule's wall time is
  // the slowest stage's span (they start together: the previous step ended in collectives),
  // and the bubble is the share of p × that time no stage computed in.
  // The rank's pair goes up into the plan's buffer, the stages' come back down after it.
  const float mine[2] = {static_cast<float>(timing.busy_s), static_cast<float>(timing.span_s)};
  const int64_t n = 2 * int64_t{pipeline_size_};
  const Tensor own = pipeline_bubble_.Slice(0, 2), gathered = pipeline_bubble_.Slice(2, 2 + n);
  ZT_RETURN_IF_ERROR(device_->Upload(own, mine));
  ZT_ASSIGN_OR_RETURN(CommHandle h, comms_.pipeline->AllGather(own, gathered, "pipeline bubble"));
  ZT_RETURN_IF_ERROR(h.Wait());
  std::vector<float> all(static_cast<size_t>(n));
  ZT_RETURN_IF_ERROR(device_->Download(all.data(), gathered));
  double busy = 0, span = 0;
  for (int s = 0; s < pipeline_size_; ++s) {
    busy += all[2 * s];
    span = std::max(span, double{all[2 * s + 1]});
  }
  if (span <= 0) return 0.0;
  return std::clamp(1.0 - busy / (pipeline_size_ * span), 0.0, 1.0);
}

}  // namespace zt
