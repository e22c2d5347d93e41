#include "worker/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"
#include "kernels/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/hf_interop.h"
#include "worker/optim/lr_schedule.h"

namespace zt {
namespace {

using Clock = std::chrono::steady_clock;

std::string FormatDuration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

}  // namespace

bool LossScalingEnabled(const zerotrain::PrecisionConfig& precision) {
  using P = zerotrain::PrecisionConfig;
  return precision.param_dtype() == P::FP16 || precision.compute_dtype() == P::FP16 ||
         precision.grad_dtype() == P::FP16;
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const zerotrain::JobSpec& job,
                                                         const TrainOptions& options) {
  std::unique_ptr<Trainer> t(new Trainer());
  t->job_ = job;
  t->options_ = options;
  t->ctx_ = JobDeviceContext(job);  // the context the plan sizes the GEMM workspace for
  const auto& model = job.model();
  const int B = job.train().micro_batch_size(), T = job.data().seq_len();

  // Data first: a bad path or a token beyond the vocabulary should fail before gigabytes
  // are allocated.
  const std::vector<std::string> train_paths(job.data().train().begin(), job.data().train().end());
  ZT_ASSIGN_OR_RETURN(TokenStream train, TokenStream::Open(train_paths, "data.train"));
  ZT_RETURN_IF_ERROR(train.CheckVocab(model.vocab_size()));
  t->train_data_.emplace(std::move(train));
  t->train_sampler_.emplace(&*t->train_data_, B, T, job.data().shuffle(), job.data().seed());
  ZT_RETURN_IF_ERROR(t->train_sampler_->Check());
  if (!job.data().val().empty()) {
    const std::vector<std::string> val_paths(job.data().val().begin(), job.data().val().end());
    ZT_ASSIGN_OR_RETURN(TokenStream val, TokenStream::Open(val_paths, "data.val"));
    ZT_RETURN_IF_ERROR(val.CheckVocab(model.vocab_size()));
    t->val_data_.emplace(std::move(val));
    // Validation always reads sequentially from the start: comparable across runs.
    t->val_sampler_.emplace(&*t->val_data_, B, T, /*shuffle=*/false, job.data().seed());
    ZT_RETURN_IF_ERROR(t->val_sampler_->Check());
  }

  t->plan_ = PlanMemory(job);
  ZT_ASSIGN_OR_RETURN(t->arenas_, Arenas::Create(t->plan_));
  ZT_ASSIGN_OR_RETURN(Tensor gemm_workspace, t->arenas_->Get("gemm_workspace"));
  t->ctx_.workspace = {.data = gemm_workspace.raw(), .bytes = gemm_workspace.size_bytes()};
  ZT_ASSIGN_OR_RETURN(Transformer m, Transformer::Bind(model, *t->arenas_, *t->arenas_, B, T));
  t->model_.emplace(std::move(m));
  ZT_ASSIGN_OR_RETURN(Optimizer opt, Optimizer::Create(job.optimizer(), job.precision(),
                                                       t->model_->layout(), *t->arenas_));
  t->optimizer_.emplace(std::move(opt));
  // Weights start in fp32 — the master copy when the parameters are 16-bit — and the
  // parameters are rounded from it.
  const std::vector<Tensor>& init_into = t->optimizer_->master_weights().empty()
                                                ? t->model_->unit_params()
                                                : t->optimizer_->master_weights();
  if (model.init_from().empty()) {
    t->model_->InitializeWeights(job.train().seed(), init_into);
  } else {
    std::vector<float*> units;
    for (const Tensor& p : init_into) units.push_back(p.data<float>());
    ZT_RETURN_IF_ERROR(ImportHuggingFace(model.init_from(), model, t->model_->layout(), units));
  }
  if (!t->optimizer_->master_weights().empty()) {
    for (size_t u = 0; u < init_into.size(); ++u) {
      ZT_RETURN_IF_ERROR(Cast(t->ctx_, init_into[u], t->model_->unit_params()[u]));
    }
  }
  if (LossScalingEnabled(job.precision())) {
    const auto& ls = job.precision().loss_scale();
    t->loss_scaler_.emplace(LossScalerConfig{
        .initial_power = ls.initial_power(),
        .window = ls.window(),
        .hysteresis = ls.hysteresis(),
        .min_scale = ls.min_scale(),
        .static_scale = ls.has_static_scale() ? ls.static_scale() : 0.0,
        .max_overflows_at_min_scale = ls.max_overflows_at_min_scale(),
        .consecutive_hysteresis = ls.consecutive_hysteresis()});
  }

  if (!options.run_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options.run_dir, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("run directory '", options.run_dir, "': ", ec.message()));
    }
    t->metrics_path_ = (std::filesystem::path(options.run_dir) / "metrics.jsonl").string();
    // A new run starts a new file.
    std::FILE* f = std::fopen(t->metrics_path_.c_str(), "w");
    if (f == nullptr) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot write '", t->metrics_path_, "': ", std::strerror(errno)));
    }
    std::fclose(f);
    ZT_RETURN_IF_ERROR(t->WriteMemoryReport(
        (std::filesystem::path(options.run_dir) / "memory.json").string()));
  }
  return t;
}

absl::Status Trainer::WriteMemoryReport(const std::string& path) const {
  nlohmann::json planned, in_use;
  for (int c = 0; c < kMemoryCategoryCount; ++c) {
    const auto category = static_cast<MemoryCategory>(c);
    planned[MemoryCategoryName(category)] = plan_.CategoryBytes(category);
    in_use[MemoryCategoryName(category)] = arenas_->BytesInUse(category);
  }
  planned["total"] = plan_.TotalBytes();
  in_use["total"] = arenas_->TotalBytesInUse();
  const std::string text =
      nlohmann::json{{"plan", planned}, {"arenas_high_water", in_use}}.dump(2) + "\n";
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write '", path, "': ", std::strerror(errno)));
  }
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) {
    return absl::UnavailableError(absl::StrCat("write to '", path, "' failed"));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepRecord> Trainer::Step() {
  const auto start = Clock::now();
  const auto& train = job_.train();
  const int64_t accum = train.grad_accum_steps();
  const int64_t tokens_per_micro = model_->batch() * model_->seq_len();
  Transformer& m = *model_;

  for (const Tensor& g : m.unit_grads()) ZT_RETURN_IF_ERROR(Zero(ctx_, g));
  // Every target is valid in training data, so the global batch has accum·B·T targets. The
  // loss scale multiplies the gradient at its source (dlogits) so small fp16 gradients
  // survive the backward; the optimizer divides it back out.
  const double loss_scale = loss_scaler_ ? loss_scaler_->scale() : 1.0;
  const float grad_scale =
      static_cast<float>(loss_scale / static_cast<double>(accum * tokens_per_micro));
  double loss = 0;
  for (int64_t micro = 0; micro < accum; ++micro) {
    ZT_RETURN_IF_ERROR(train_sampler_->Fill(step_ * accum + micro, m.tokens().data<int32_t>(),
                                            m.targets().data<int32_t>()));
    ZT_ASSIGN_OR_RETURN(double micro_loss,
                        m.ForwardLoss(ctx_, {.write_grad = true, .grad_scale = grad_scale}));
    ZT_RETURN_IF_ERROR(m.Backward(ctx_));
    loss += micro_loss / static_cast<double>(accum);
  }

  double sum_sq = 0;
  bool overflow = false;
  for (const Tensor& g : m.unit_grads()) {
    if (loss_scaler_) {
      ZT_ASSIGN_OR_RETURN(bool finite, AllFinite(ctx_, g));
      overflow |= !finite;
    }
    ZT_ASSIGN_OR_RETURN(double s, SumOfSquares(ctx_, g));
    sum_sq += s;
  }
  StepRecord r;
  r.loss = loss;
  r.lr = LearningRate(job_.optimizer(), step_, train.max_steps());
  r.loss_scale = loss_scale;
  if (overflow) {
    // A scaled gradient overflowed: skip the update, let the scaler back off. The step still
    // counts (data and schedule move on), as DeepSpeed counts it.
    ZT_RETURN_IF_ERROR(loss_scaler_->Update(/*overflow=*/true));
    r.grad_norm = std::numeric_limits<double>::infinity();
  } else {
    r.grad_norm = std::sqrt(sum_sq) / loss_scale;
    if (!std::isfinite(r.grad_norm) || !std::isfinite(loss)) {
      return absl::AbortedError(absl::StrFormat(
          "step %d: loss %g, gradient norm %g are not finite (lower optimizer.lr or enable "
          "optimizer.grad_clip)",
          step_ + 1, loss, r.grad_norm));
    }
    const float clip = job_.optimizer().grad_clip();
    const float clip_scale = clip > 0 && r.grad_norm > clip
                                 ? static_cast<float>(clip / (r.grad_norm + 1e-6))
                                 : 1.0f;
    // Stochastic rounding draws a new stream every step, reproducibly from the job's seed.
    const uint64_t rounding_seed = job_.train().seed() * 0x9E3779B97F4A7C15ull + step_;
    ZT_RETURN_IF_ERROR(optimizer_->Step(ctx_, m.unit_params(), m.unit_grads(), r.lr,
                                        static_cast<float>(clip_scale / loss_scale),
                                        rounding_seed));
    if (loss_scaler_) ZT_RETURN_IF_ERROR(loss_scaler_->Update(/*overflow=*/false));
  }
  if (loss_scaler_) r.skipped = loss_scaler_->skipped_steps();
  ++step_;
  r.step = step_;
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  r.step_ms = seconds * 1e3;
  r.tokens_per_s = static_cast<double>(accum * tokens_per_micro) / seconds;
  return r;
}

absl::StatusOr<double> Trainer::Evaluate() {
  if (!val_sampler_) return absl::FailedPreconditionError("no data.val to evaluate on");
  Transformer& m = *model_;
  double total = 0;
  const int64_t n = job_.train().eval_steps();
  for (int64_t k = 0; k < n; ++k) {
    ZT_RETURN_IF_ERROR(
        val_sampler_->Fill(k, m.tokens().data<int32_t>(), m.targets().data<int32_t>()));
    ZT_ASSIGN_OR_RETURN(double loss, m.ForwardLoss(ctx_, {.write_grad = false}));
    total += loss;
  }
  return total / static_cast<double>(n);
}

absl::Status Trainer::AppendMetrics(const StepRecord& r) {
  if (metrics_path_.empty()) return absl::OkStatus();
  nlohmann::json line = {{"step", r.step},          {"loss", r.loss},
                         {"lr", r.lr},              {"grad_norm", r.grad_norm},
                         {"tokens_per_s", r.tokens_per_s}, {"step_ms", r.step_ms}};
  line["loss_scale"] = r.loss_scale;
  line["skipped"] = r.skipped;
  if (r.val_loss) line["val_loss"] = *r.val_loss;
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

absl::Status Trainer::Run(const std::function<void(const StepRecord&)>& on_step) {
  const auto& train = job_.train();
  const int64_t last = options_.stop_after_step
                           ? std::min<int64_t>(*options_.stop_after_step, train.max_steps())
                           : train.max_steps();
  const auto start = Clock::now();
  const int64_t first = step_;
  while (step_ < last) {
    ZT_ASSIGN_OR_RETURN(StepRecord r, Step());
    const bool eval_due = val_sampler_ && train.eval_interval() > 0 &&
                          (r.step % train.eval_interval() == 0 || r.step == train.max_steps());
    if (eval_due) {
      ZT_ASSIGN_OR_RETURN(double v, Evaluate());
      r.val_loss = v;
    }
    ZT_RETURN_IF_ERROR(AppendMetrics(r));
    if (options_.progress && (r.step % train.log_interval() == 0 || r.step == last)) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      const double eta = elapsed / static_cast<double>(r.step - first) *
                         static_cast<double>(last - r.step);
      std::string val = r.val_loss ? absl::StrFormat(" | val %.4f", *r.val_loss) : "";
      std::fprintf(stderr, "step %lld/%lld | loss %.4f%s | lr %.2e | %.0f tok/s | ETA %s\n",
                   static_cast<long long>(r.step), static_cast<long long>(train.max_steps()),
                   r.loss, val.c_str(), r.lr, r.tokens_per_s, FormatDuration(eta).c_str());
    }
    if (on_step) on_step(r);
  }
  return absl::OkStatus();
}

}  // namespace zt
