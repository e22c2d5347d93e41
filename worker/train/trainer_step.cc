// Trainer: one optimizer step (micro-batches, the delayed host update), evaluation, the
// statistics a step reads back and the metrics it appends.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/util/json_util.h"
#include "kernels/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/checkpoint_directory.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/checkpoint/hf_interop.h"
#include "worker/checkpoint/rank_state.h"
#include "worker/checkpoint/tensor_parallel_reshard.h"
#include "worker/optim/lr_schedule.h"
#include "worker/train/trainer.h"
#include "worker/train/trainer_support.h"

namespace zt {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

Trainer::OffloadCounters Trainer::OffloadCountersNow() const {
  return {.swap = nvme_optimizer_ ? nvme_optimizer_->stats() : NvmeOptimizer::Stats{},
          .base = swapped_base_ ? swapped_base_->stats() : SwappedBase::Stats{},
          .upload_bytes = engine_->param_upload_bytes(),
          .upload_s = engine_->param_upload_seconds(),
          .uploads_ahead = engine_->param_uploads_ahead(),
          .uploads_at_gather = engine_->param_uploads_at_gather()};
}

void Trainer::AddOffloadTraffic(const OffloadCounters& before, StepRecord& r) const {
  if (nvme_optimizer_) {
    const NvmeOptimizer::Stats after = nvme_optimizer_->stats();
    r.swap_bytes_in += after.swap_bytes_in - before.swap.swap_bytes_in;
    r.swap_bytes_out += after.swap_bytes_out - before.swap.swap_bytes_out;
    r.swap_in_s += after.swap_seconds_in - before.swap.swap_seconds_in;
    r.swap_out_s += after.swap_seconds_out - before.swap.swap_seconds_out;
  }
  if (swapped_base_) {
    // The gathers' reads of the frozen base (written once: nothing goes out after the start).
    const SwappedBase::Stats after = swapped_base_->stats();
    r.swap_bytes_in += after.swap_bytes_in - before.base.swap_bytes_in;
    r.swap_in_s += after.swap_seconds_in - before.base.swap_seconds_in;
  }
  // Every pass since `before` has ended, so every upload it started has been waited for and
  // counted.
  r.param_upload_bytes += engine_->param_upload_bytes() - before.upload_bytes;
  r.param_upload_s += engine_->param_upload_seconds() - before.upload_s;
  r.param_uploads_ahead += engine_->param_uploads_ahead() - before.uploads_ahead;
  r.param_uploads_at_gather += engine_->param_uploads_at_gather() - before.uploads_at_gather;
}

void Trainer::ReportEvaluationTraffic(StepRecord& r) {
  const StepRecord& e = evaluation_traffic_;
  r.swap_bytes_in += e.swap_bytes_in;
  r.swap_bytes_out += e.swap_bytes_out;
  r.swap_in_s += e.swap_in_s;
  r.swap_out_s += e.swap_out_s;
  r.param_upload_bytes += e.param_upload_bytes;
  r.param_upload_s += e.param_upload_s;
  r.param_uploads_ahead += e.param_uploads_ahead;
  r.param_uploads_at_gather += e.param_uploads_at_gather;
  evaluation_traffic_ = StepRecord();
}

bool Trainer::StateReadAfterStep(int64_t step, StopKind stop) const {
  const auto& train = job_.train();
  const auto& ckpt = job_.checkpoint();
  return step >= train.max_steps() ||
         (options_.stop_after_step && step >= *options_.stop_after_step) ||
         stop != StopKind::kNone ||
         (!ckpt.dir().empty() && ckpt.interval_steps() > 0 && step % ckpt.interval_steps() == 0) ||
         (val_batches_ && train.eval_interval() > 0 && step % train.eval_interval() == 0);
}

absl::Status Trainer::LandDelayedUpdate(StepRecord* r) {
  ZT_ASSIGN_OR_RETURN(const DelayedHostStep::Finished f, delayed_->Finish(engine_->param_views()));
  if (f.step == 0) return absl::OkStatus();
  if (r != nullptr) {
    r->host_optimizer_s += f.update_seconds;
    r->offload_bytes_to_device += f.bytes_to_device;
    r->offload_to_device_s += f.upload_seconds;
    r->offload_bytes_to_host += f.bytes_to_host;
    r->offload_to_host_s += f.download_seconds;
  }
  // ZeRO stages 1-2: every rank's updated range into everyone's parameters.
  return engine_->FinishStep(ctx_);
}

absl::Status Trainer::DelayedHostUpdate(const DelayedUpdateArgs& args, StepRecord& r) {
  // This step's gradients are all in the downloads' current bank once they drain; the bank
  // changes at Launch, so the next backward's copies never touch what this host step reads.
  ZT_RETURN_IF_ERROR(grad_downloads_->Drain());
  // The previous step's host update ran beside this step's forward and backward, which read
  // the parameters from before it; they land now, before anything reads them again.
  ZT_RETURN_IF_ERROR(LandDelayedUpdate(&r));
  ZT_RETURN_IF_ERROR(
      delayed_->Launch(engine_->param_views(), step_ + 1, args.lr, args.grad_scale, args.seed));
  if (!args.drain) return absl::OkStatus();
  // Something reads the weights after this step: its own update lands too, and the next step
  // starts the overlap again from fresh parameters.
  return LandDelayedUpdate(&r);
}

absl::Status Trainer::FinishDelayedUpdate() {
  if (delayed_ == nullptr || !delayed_->pending()) return absl::OkStatus();
  return LandDelayedUpdate(nullptr);
}

absl::StatusOr<StepRecord> Trainer::Step() {
  const auto start = Clock::now();
  const auto& train = job_.train();
  const int64_t accum = train.grad_accum_steps();
  // Data-parallel ranks: each reads its own batches (a tensor-parallel group shares one).
  const int64_t ranks = data_size_;
  const int64_t tokens_per_micro = model_->batch() * model_->seq_len();
  const CommStats comm_before = comm_stats();
  const double waited_before = engine_->waited_seconds();
  // The swap of the whole step (the gathers' shard reads with offload.params NVME as well as
  // the optimizer's pass) and its parameter-shard uploads (offload.params).
  const OffloadCounters traffic_before = OffloadCountersNow();
  const GradientDownloads::Stats downloads_before =
      grad_downloads_ ? grad_downloads_->stats() : GradientDownloads::Stats{};

  ZT_RETURN_IF_ERROR(engine_->BeginStep(ctx_));
  ZT_RETURN_IF_ERROR(engine_->BeginStatistics(ctx_));
  // The loss scale multiplies the gradient at its source (dlogits) so small fp16 gradients
  // survive the backward; the optimizer divides it back out.
  const double loss_scale = loss_scaler_ ? loss_scaler_->scale() : 1.0;
  double data_wait_s = 0;
  std::optional<double> pipeline_bubble;
  PipelineTiming pipeline_timing;
  // The step's loss is the mean over every target it counts, on every rank and in every
  // micro-batch: the loss of the one large batch that gradient accumulation and data
  // parallelism split, however unevenly documents (prompts masked, padding) spread the counted
  // targets. Every rank works the total out alone from the document plan, no collective: so a
  // pipeline's stages all know it before the schedule's first backward, the last stage's loss
  // gradient takes it, and the other stages' gradients follow from that one.
  int64_t step_counted = 0;
  for (int64_t k = step_ * accum * ranks; k < (step_ + 1) * accum * ranks; ++k) {
    ZT_ASSIGN_OR_RETURN(const int64_t counted, train_batches_->CountedTargets(k));
    step_counted += counted;
  }
  if (model_->pipelined()) {
    PipelineTiming timing;
    ZT_RETURN_IF_ERROR(RunPipelineSchedule(loss_scale, step_counted, &data_wait_s, &timing));
    ZT_ASSIGN_OR_RETURN(pipeline_bubble, PipelineBubble(timing));
    pipeline_timing = timing;
  }
  for (int64_t micro = 0; micro < accum && !model_->pipelined(); ++micro) {
    const int64_t global = (step_ * accum + micro) * ranks + data_rank_;
    const auto fill_start = Clock::now();
    ZT_ASSIGN_OR_RETURN(const int64_t counted, UploadBatch(*train_batches_, global));
    data_wait_s += std::chrono::duration<double>(Clock::now() - fill_start).count();
    // The gradient sums over the micro-batch's counted targets at grad_scale each, so
    // 1 / step_counted makes the step's gradient the token-level mean's. The loss kernel
    // averages over the micro-batch's own counted targets: dividing that by
    // step_counted / (counted · ranks) weighs it by its share of the step, and the ranks' sum
    // is divided by `ranks` below. Plain shards count all B·T targets: 1 / (N·accum·B·T) and
    // accum, as always. A micro-batch with nothing counted adds nothing.
    const float grad_scale = StepGradScale(loss_scale, step_counted);
    const double loss_divisor = MicroBatchLossDivisor(step_counted, counted, ranks);
    // The adapters' dropout masks: a function of the job's seed and the global micro-batch,
    // so a resumed run draws the masks the uninterrupted one did.
    if (model_->layout().lora) {
      model_->SetLoraDropoutSeed(job_.train().seed() * 0x9E3779B97F4A7C15ull +
                                 static_cast<uint64_t>(global));
    }
    // The step's loss is summed on the device, each micro-batch weighed as above.
    ZT_RETURN_IF_ERROR(engine_->ForwardBackward(ctx_,
                                                {.write_grad = true,
                                                 .grad_scale = grad_scale,
                                                 .loss_sum = engine_->loss_accumulator(),
                                                 .loss_divisor = loss_divisor},
                                                /*last=*/micro + 1 == accum));
  }
  ZT_RETURN_IF_ERROR(
      engine_->AccumulateGradientStatistics(ctx_, /*check_finite=*/loss_scaler_.has_value()));
  const int stop_request = options_.stop ? static_cast<int>(options_.stop->kind()) : 0;
  ZT_ASSIGN_OR_RETURN(StepTotals totals, ReadStatistics(stop_request, /*loss_divisor=*/1.0));
  StepRecord r;
  r.stop = static_cast<StopKind>(totals.stop_request);
  r.loss = totals.loss_sum / static_cast<double>(ranks);
  r.lr = LearningRate(job_.optimizer(), step_, train.max_steps());
  r.loss_scale = loss_scale;
  const auto optimizer_start = Clock::now();
  const double waited_in_step_before_optimizer = engine_->waited_seconds();
  // ZeRO-Offload's delayed update, past its warm-up (steps 1..after_steps are serial).
  const bool delayed =
      delayed_ != nullptr && step_ + 1 > job_.offload().delayed_update().after_steps();
  if (totals.nonfinite) {
    // A scaled gradient overflowed: skip the update, let the scaler back off. The step still
    // counts (data and schedule move on), as DeepSpeed counts it.
    ZT_RETURN_IF_ERROR(loss_scaler_->Update(/*overflow=*/true));
    r.grad_norm = std::numeric_limits<double>::infinity();
  } else {
    r.grad_norm = std::sqrt(totals.grad_sum_sq) / loss_scale;
    if (!std::isfinite(r.grad_norm) || !std::isfinite(r.loss)) {
      return absl::AbortedError(absl::StrFormat(
          "step %d: loss %g, gradient norm %g are not finite (lower optimizer.lr or enable "
          "optimizer.grad_clip)",
          step_ + 1, r.loss, r.grad_norm));
    }
    const float clip = job_.optimizer().grad_clip();
    const float clip_scale =
        clip > 0 && r.grad_norm > clip ? static_cast<float>(clip / (r.grad_norm + 1e-6)) : 1.0f;
    // Stochastic rounding draws a new stream every step, reproducibly from the job's seed.
    const uint64_t rounding_seed = job_.train().seed() * 0x9E3779B97F4A7C15ull + step_;
    const float grad_scale_step = static_cast<float>(clip_scale / loss_scale);
    if (delayed) {
      ZT_RETURN_IF_ERROR(DelayedHostUpdate(
          {.lr = r.lr,
           .grad_scale = grad_scale_step,
           .seed = rounding_seed,
           .drain = StateReadAfterStep(step_ + 1, static_cast<StopKind>(totals.stop_request))},
          r));
    } else if (host_optimizer_) {
      const HostOptimizer::Stats before = host_optimizer_->stats();
      ZT_RETURN_IF_ERROR(host_optimizer_->Step(host_ctx_, engine_->param_views(),
                                               engine_->grad_views(), r.lr, grad_scale_step,
                                               rounding_seed));
      const HostOptimizer::Stats& after = host_optimizer_->stats();
      r.offload_bytes_to_host = after.bytes_to_host - before.bytes_to_host;
      r.offload_bytes_to_device = after.bytes_to_device - before.bytes_to_device;
      r.offload_to_host_s = after.seconds_to_host - before.seconds_to_host;
      r.offload_to_device_s = after.seconds_to_device - before.seconds_to_device;
      r.host_optimizer_s = after.seconds_update - before.seconds_update;
    } else if (nvme_optimizer_) {
      const NvmeOptimizer::Stats before = nvme_optimizer_->stats();
      // The generation's last writes and its commit run beside the next step's compute, unless
      // something reads the states after this step (or a delayed update, whose host thread
      // commits, may take the next step).
      const bool commit_behind =
          delayed_ == nullptr &&
          !StateReadAfterStep(step_ + 1, static_cast<StopKind>(totals.stop_request));
      ZT_RETURN_IF_ERROR(
          nvme_optimizer_->Step(host_ctx_, engine_->param_views(), engine_->grad_views(), r.lr,
                                grad_scale_step, rounding_seed,
                                commit_behind ? NvmeOptimizer::CommitTiming::kBehindNextCompute
                                              : NvmeOptimizer::CommitTiming::kBeforeReturning));
      const NvmeOptimizer::Stats after = nvme_optimizer_->stats();
      r.offload_bytes_to_host = after.bytes_to_host - before.bytes_to_host;
      r.offload_bytes_to_device = after.bytes_to_device - before.bytes_to_device;
      r.offload_to_host_s = after.seconds_to_host - before.seconds_to_host;
      r.offload_to_device_s = after.seconds_to_device - before.seconds_to_device;
      r.host_optimizer_s = after.seconds_update - before.seconds_update;
    } else {
      ZT_RETURN_IF_ERROR(optimizer_->Step(ctx_, engine_->param_views(), engine_->grad_views(), r.lr,
                                          grad_scale_step, rounding_seed));
    }
    // The delayed update gathers the parameters when it uploads them.
    if (!delayed) ZT_RETURN_IF_ERROR(engine_->FinishStep(ctx_));
    if (loss_scaler_) ZT_RETURN_IF_ERROR(loss_scaler_->Update(/*overflow=*/false));
  }
  if (grad_downloads_) {
    // A skipped step's copies finish before the next backward writes the gradients again.
    ZT_RETURN_IF_ERROR(grad_downloads_->Drain());
    if (delayed) {
      r.offload_bytes_to_host += grad_downloads_->stats().bytes - downloads_before.bytes;
    }
    // The gradients' copies ran beside the backward: their seconds, outside optimizer_s.
    r.offload_to_host_s += grad_downloads_->stats().copy_seconds - downloads_before.copy_seconds;
  }
  AddOffloadTraffic(traffic_before, r);
  // An evaluation called since the last record (outside Run) is reported with this step.
  ReportEvaluationTraffic(r);
  if (loss_scaler_) r.skipped = loss_scaler_->skipped_steps();
  ++step_;
  r.step = step_;
  const auto end = Clock::now();
  const double seconds = std::chrono::duration<double>(end - start).count();
  r.step_ms = seconds * 1e3;
  r.tokens_per_s = static_cast<double>(ranks * accum * tokens_per_micro) / seconds;
  r.comm_wait_s = engine_->waited_seconds() - waited_before;
  // The optimizer's part holds the all-gather FinishStep waits for: that wait is counted in
  // comm_wait_s, so it is taken out here and the parts still add up to the step.
  const double optimizer_span = std::chrono::duration<double>(end - optimizer_start).count();
  const double waited_in_optimizer = engine_->waited_seconds() - waited_in_step_before_optimizer;
  r.data_wait_s = data_wait_s;
  r.pipeline_bubble = pipeline_bubble;
  r.pipeline_busy_s = pipeline_timing.busy_s;
  r.pipeline_span_s = pipeline_timing.span_s;
  r.optimizer_s = std::max(0.0, optimizer_span - waited_in_optimizer);
  r.compute_s = std::max(0.0, seconds - r.data_wait_s - r.optimizer_s - r.comm_wait_s);
  const CommStats comm_after = comm_stats();
  for (int k = 0; k < kNumCommKinds; ++k) {
    r.comm_bytes += comm_after.by_kind[k].bytes_sent - comm_before.by_kind[k].bytes_sent;
    r.comm_s += comm_after.by_kind[k].seconds - comm_before.by_kind[k].seconds;
  }
  return r;
}

absl::StatusOr<double> Trainer::Evaluate() {
  if (!val_batches_) return absl::FailedPreconditionError("no data.val to evaluate on");
  // The evaluation's gathers upload (and with offload.params NVME read) every shard once more:
  // counted for the next record (ReportEvaluationTraffic), a failed evaluation's too.
  const OffloadCounters traffic_before = OffloadCountersNow();
  absl::Cleanup count_traffic = [&] { AddOffloadTraffic(traffic_before, evaluation_traffic_); };
  ZT_RETURN_IF_ERROR(FinishDelayedUpdate());  // evaluate the updated weights
  const int64_t ranks = data_size_;
  const int64_t n = job_.train().eval_steps();
  // The validation loss is the mean over every target the n · ranks micro-batches count, as
  // the step's loss is (Step): a packed or padded micro-batch with few counted targets weighs
  // by its targets, not as much as a full one (MicroBatchLossDivisor). Every rank works the
  // total out alone from the document plan.
  int64_t total = 0;
  for (int64_t k = 0; k < n * ranks; ++k) {
    ZT_ASSIGN_OR_RETURN(const int64_t counted, val_batches_->CountedTargets(k));
    total += counted;
  }
  ZT_RETURN_IF_ERROR(engine_->BeginStatistics(ctx_));
  if (model_->pipelined()) {
    ZT_RETURN_IF_ERROR(RunPipelineEvaluation(n, total));
  }
  for (int64_t k = 0; k < n && !model_->pipelined(); ++k) {
    ZT_ASSIGN_OR_RETURN(const int64_t counted, UploadBatch(*val_batches_, k * ranks + data_rank_));
    ZT_RETURN_IF_ERROR(
        engine_->ForwardLoss(ctx_, {.loss_sum = engine_->loss_accumulator(),
                                    .loss_divisor = MicroBatchLossDivisor(total, counted, ranks)}));
  }
  ZT_ASSIGN_OR_RETURN(StepTotals totals, ReadStatistics(/*stop_request=*/0, /*loss_divisor=*/1.0));
  return totals.loss_sum / static_cast<double>(ranks);
}

absl::StatusOr<int64_t> Trainer::UploadBatch(MicroBatches& batches, int64_t k) {
  ZT_ASSIGN_OR_RETURN(const int64_t counted, batches.Fill(k, host_tokens_, host_targets_));
  ZT_RETURN_IF_ERROR(device_->Upload(model_->tokens(), host_tokens_));
  ZT_RETURN_IF_ERROR(device_->Upload(model_->targets(), host_targets_));
  if (!batches.packed()) return counted;
  // The loader's (B, S) starts and (B, T) positions, checked on the host as it built them
  // (kernels/packing.h: a CUDA kernel does not read them back to check), staged and copied up.
  // An Upload waits for the compute queued so far, so no queued kernel still reads the last
  // micro-batch's.
  const Tensor starts = batches.doc_starts(), positions = batches.positions();
  if (starts.numel() > batch_doc_starts_.numel()) {
    // Cannot happen: every document holds a token, so a row holds at most T (the plan's room).
    return absl::InternalError(absl::StrCat("micro-batch ", k, ": ", starts.numel(),
                                            " document starts, the plan holds ",
                                            batch_doc_starts_.numel()));
  }
  const Tensor device_starts =
      batch_doc_starts_.Slice(0, starts.numel()).Reshape({starts.dim(0), starts.dim(1)});
  const Tensor device_positions = batch_positions_.Reshape({positions.dim(0), positions.dim(1)});
  std::memcpy(host_doc_starts_, starts.raw(), starts.size_bytes());
  std::memcpy(host_positions_, positions.raw(), positions.size_bytes());
  ZT_RETURN_IF_ERROR(device_->Upload(device_starts, host_doc_starts_));
  ZT_RETURN_IF_ERROR(device_->Upload(device_positions, host_positions_));
  model_->SetDocuments(device_starts, device_positions);
  return counted;
}

absl::StatusOr<StepTotals> Trainer::ReadStatistics(int stop_request, double loss_divisor) {
  // The stop slot was zeroed with the others: only a request crosses.
  if (stop_request != 0) {
    *host_stop_ = static_cast<float>(stop_request);
    ZT_RETURN_IF_ERROR(device_->Upload(engine_->stop_slot(), host_stop_));
  }
  ZT_RETURN_IF_ERROR(engine_->ExchangeStatistics());
  if (pipeline_size_ <= 1) {
    // The step's one wait: every rank's statistics, in one read.
    ZT_RETURN_IF_ERROR(device_->Download(host_scalars_, engine_->scalars()));
    return engine_->Totals(host_scalars_, loss_divisor);
  }
  // Every stage's statistics, gathered on the device and read in one: the loss comes from the
  // last stage (the others add none), the squared gradients of each stage's units add up, any
  // overflow or stop request counts.
  const int64_t n = engine_->scalars().numel();
  const Tensor gathered = pipeline_scalars_gathered_.Slice(0, n * pipeline_size_);
  ZT_ASSIGN_OR_RETURN(CommHandle h, comms_.pipeline->AllGather(engine_->scalars(), gathered,
                                                               "pipeline statistics"));
  ZT_RETURN_IF_ERROR(h.Wait());
  ZT_RETURN_IF_ERROR(device_->Download(pipeline_scalars_.data(), gathered));
  StepTotals all;
  for (int s = 0; s < pipeline_size_; ++s) {
    const StepTotals t = engine_->Totals(pipeline_scalars_.data() + s * n, loss_divisor);
    all.loss_sum += t.loss_sum;
    all.grad_sum_sq += t.grad_sum_sq;
    all.nonfinite = all.nonfinite || t.nonfinite;
    all.stop_request = std::max(all.stop_request, t.stop_request);
  }
  return all;
}

absl::Status Trainer::AppendMetrics(const StepRecord& r) {
  if (metrics_path_.empty()) return absl::OkStatus();
  nlohmann::json line = {{"step", r.step},
                         {"loss", r.loss},
                         {"lr", r.lr},
                         {"grad_norm", r.grad_norm},
                         {"tokens_per_s", r.tokens_per_s},
                         {"step_ms", r.step_ms}};
  line["loss_scale"] = r.loss_scale;
  line["skipped"] = r.skipped;
  line["comm_bytes"] = r.comm_bytes;
  line["comm_s"] = r.comm_s;
  line["comm_wait_s"] = r.comm_wait_s;
  line["data_wait_s"] = r.data_wait_s;
  line["optimizer_s"] = r.optimizer_s;
  line["compute_s"] = r.compute_s;
  if (r.pipeline_bubble) {
    line["pipeline_bubble"] = *r.pipeline_bubble;
    line["pipeline_busy_s"] = r.pipeline_busy_s;
    line["pipeline_span_s"] = r.pipeline_span_s;
  }
  if (r.val_loss) line["val_loss"] = *r.val_loss;
  if (nvme_optimizer_ || swapped_base_) {
    line["swap_bytes_in"] = r.swap_bytes_in;
    line["swap_bytes_out"] = r.swap_bytes_out;
    line["swap_in_s"] = r.swap_in_s;
    line["swap_out_s"] = r.swap_out_s;
  }
  line["param_upload_bytes"] = r.param_upload_bytes;
  line["param_upload_s"] = r.param_upload_s;
  line["param_uploads_ahead"] = r.param_uploads_ahead;
  line["param_uploads_at_gather"] = r.param_uploads_at_gather;
  if (host_optimizer_ || nvme_optimizer_) {
    line["offload_bytes_to_host"] = r.offload_bytes_to_host;
    line["offload_bytes_to_device"] = r.offload_bytes_to_device;
    line["offload_to_host_s"] = r.offload_to_host_s;
    line["offload_to_device_s"] = r.offload_to_device_s;
    line["host_optimizer_s"] = r.host_optimizer_s;
  }
  std::FILE* f = std::fopen(metrics_path_.c_str(), "a");
  if (f == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot append to '", metrics_path_, "': ", std::strerror(errno)));
  }
  const std::string text = line.dump() + "\n";
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) {
    return absl::UnavailableError(absl::StrCat("write to '", metrics_path_, "' failed"));
  }
  return absl::OkStatus();
}

}  // namespace zt
