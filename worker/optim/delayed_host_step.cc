#include "worker/optim/delayed_host_step.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"

namespace zt {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The optimizer's range of unit u in the device view's dtype, in bytes.
int64_t RangeBytes(const Optimizer& optimizer, int u, const Tensor& param) {
  const FlatRange& r = optimizer.range(u);
  return (r.end - r.begin) * DTypeSize(param.dtype());
}

}  // namespace

absl::StatusOr<std::unique_ptr<DelayedHostStep>> DelayedHostStep::Create(Args args) {
  if (args.host != nullptr) {
    HostOptimizer* host = args.host;
    args.optimizer = &host->optimizer();
    args.step_on_host = [host](const DeviceContext& ctx, const std::vector<Tensor>& params,
                               const std::vector<Tensor>& grads, float lr, float grad_scale,
                               uint64_t seed) {
      return host->StepOnHost(ctx, params, grads, lr, grad_scale, seed);
    };
  }
  if (args.optimizer == nullptr || !args.step_on_host || args.gradients == nullptr ||
      args.copies == nullptr) {
    return absl::InvalidArgumentError(
        "delayed host step: needs the host optimizer (or an optimizer and its step on host "
        "memory), the gradient downloads and a copy engine");
  }
  if (args.gradients->HostGradients(1).empty()) {
    return absl::InvalidArgumentError(
        "delayed host step: the gradient downloads have one bank (the plan has no "
        "\"<unit>.grads.host.1\")");
  }
  if (static_cast<int>(args.params_host.size()) != args.optimizer->unit_count()) {
    return absl::InvalidArgumentError(absl::StrCat("delayed host step: ", args.params_host.size(),
                                                   " \"<unit>.params.host\" buffers for ",
                                                   args.optimizer->unit_count(), " units"));
  }
  for (size_t u = 0; u < args.params_host.size(); ++u) {
    if (args.params_host[u].device().kind != DeviceKind::kCpu) {
      return absl::InvalidArgumentError(absl::StrCat("delayed host step: unit ", u,
                                                     "'s params.host is on ",
                                                     DeviceName(args.params_host[u].device())));
    }
  }
  return std::unique_ptr<DelayedHostStep>(new DelayedHostStep(std::move(args)));
}

DelayedHostStep::DelayedHostStep(Args args)
    : optimizer_(args.optimizer),
      step_on_host_(std::move(args.step_on_host)),
      gradients_(args.gradients),
      copies_(args.copies),
      params_host_(std::move(args.params_host)),
      host_ctx_([&] {
        DeviceContext ctx = args.host_ctx;
        ctx.workspace = Workspace{};  // the compute thread's GEMMs use it meanwhile
        return ctx;
      }()),
      on_start_(std::move(args.on_start)),
      worker_([this] { WorkerLoop(); }) {}

DelayedHostStep::~DelayedHostStep() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    // A pending step finishes first: it writes buffers that outlive this object only so long.
    cv_.wait(lock, [&] { return !has_job_ || done_; });
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void DelayedHostStep::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || (has_job_ && !done_); });
    if (stopping_) return;
    const Job job = job_;
    lock.unlock();
    if (on_start_) on_start_(job.step);
    const auto start = Clock::now();
    absl::Status status =
        step_on_host_(host_ctx_, params_host_, job.grads, job.lr, job.grad_scale, job.seed);
    const double seconds = SecondsSince(start);
    lock.lock();
    result_ = std::move(status);
    update_seconds_ = seconds;
    done_ = true;
    cv_.notify_all();
  }
}

absl::Status DelayedHostStep::Launch(const std::vector<Tensor>& params, int64_t step, float lr,
                                     float grad_scale, uint64_t seed) {
  if (pending_) {
    return absl::FailedPreconditionError(absl::StrCat("delayed host step: step ", step,
                                                      " launched while step ", job_.step,
                                                      " is pending (Finish it first)"));
  }
  if (params.size() != params_host_.size()) {
    return absl::InternalError(absl::StrCat("delayed host step: ", params.size(),
                                            " parameter views for ", params_host_.size(),
                                            " units"));
  }
  // Unless Finish just uploaded them, the host copy of the parameters may be older than the
  // device's (a serial step, a restore); the update reads it when they are their own master.
  launch_stats_ = Finished{};
  const auto down = Clock::now();
  for (size_t u = 0; u < params.size() && !uploaded_; ++u) {
    const int64_t bytes = RangeBytes(*optimizer_, static_cast<int>(u), params[u]);
    if (bytes > params_host_[u].size_bytes()) {
      return absl::InternalError(absl::StrCat("delayed host step: unit ", u, "'s range of ", bytes,
                                              " bytes does not fit its params.host of ",
                                              params_host_[u].size_bytes()));
    }
    ZT_ASSIGN_OR_RETURN(const DeviceCopyEngine::IssueMark mark, copies_->MarkIssue());
    ZT_RETURN_IF_ERROR(copies_->CopyToHost(mark, params_host_[u].raw(), params[u].raw(), bytes));
    launch_stats_.bytes_to_host += bytes;
  }
  launch_stats_.download_seconds = SecondsSince(down);
  // This step's gradients are the bank the backward just filled; the next backward's go to
  // the other one.
  const int bank = gradients_->bank();
  ZT_RETURN_IF_ERROR(gradients_->UseBank(1 - bank));
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = Job{.step = step,
               .lr = lr,
               .grad_scale = grad_scale,
               .seed = seed,
               .grads = gradients_->HostGradients(bank)};
    has_job_ = true;
    done_ = false;
  }
  cv_.notify_all();
  pending_ = true;
  uploaded_ = false;
  ++launched_;
  return absl::OkStatus();
}

absl::StatusOr<DelayedHostStep::Finished> DelayedHostStep::Finish(
    const std::vector<Tensor>& params) {
  if (!pending_) return Finished{};
  Finished f = launch_stats_;
  absl::Status result;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    has_job_ = false;
    result = std::move(result_);
    result_ = absl::OkStatus();
    f.step = job_.step;
    f.update_seconds = update_seconds_;
  }
  pending_ = false;
  if (!result.ok()) {
    return absl::Status(result.code(),
                        absl::StrCat("delayed host step of step ", f.step, ": ", result.message()));
  }
  const auto up = Clock::now();
  for (size_t u = 0; u < params.size(); ++u) {
    const int64_t bytes = RangeBytes(*optimizer_, static_cast<int>(u), params[u]);
    ZT_ASSIGN_OR_RETURN(const DeviceCopyEngine::IssueMark mark, copies_->MarkIssue());
    ZT_RETURN_IF_ERROR(copies_->CopyToDevice(mark, params[u].raw(), params_host_[u].raw(), bytes));
    f.bytes_to_device += bytes;
  }
  f.upload_seconds = SecondsSince(up);
  uploaded_ = true;
  return f;
}

}  // namespace zt
