#include "worker/optim/host_optimizer.h"

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

// `n` elements of `dtype` at the start of host buffer `staging`.
Tensor HostView(const Tensor& staging, DType dtype, int64_t n) {
  return Tensor(staging.raw(), dtype, {n}, Device{});
}

}  // namespace

absl::StatusOr<HostOptimizer> HostOptimizer::Create(Args args) {
  if (args.copies == nullptr) {
    return absl::InvalidArgumentError("host optimizer: no copy engine");
  }
  const bool grads_staged = args.gradients == nullptr;
  const bool params_staged = args.params != ParamHome::kHost;
  for (const Tensor* t : {grads_staged ? &args.grad_staging : nullptr,
                          params_staged ? &args.param_staging : nullptr}) {
    if (t == nullptr) continue;
    if (t->raw() == nullptr) {
      return absl::InvalidArgumentError(
          "host optimizer: a staging buffer the step uses is missing (the plan's offload.ring)");
    }
    if (t->device().kind != DeviceKind::kCpu) {
      return absl::InvalidArgumentError(absl::StrCat("host optimizer: a staging buffer is on ",
                                                     DeviceName(t->device()), ", not the host"));
    }
  }
  return HostOptimizer(std::move(args));
}

HostOptimizer::HostOptimizer(Args args)
    : optimizer_(std::move(args.optimizer)),
      copies_(args.copies),
      grad_staging_(args.grad_staging),
      param_staging_(args.param_staging),
      params_home_(args.params),
      gradients_(args.gradients) {}

absl::Status HostOptimizer::Step(const DeviceContext& host_ctx, const std::vector<Tensor>& params,
                                 const std::vector<Tensor>& grads, float lr, float grad_scale,
                                 uint64_t seed) {
  const bool own_master = optimizer_.master_weights().empty();
  const bool on_host = params_home_ == ParamHome::kHost;
  for (size_t u = 0; u < params.size(); ++u) {
    const FlatRange& range = optimizer_.range(static_cast<int>(u));
    const int64_t n = range.end - range.begin;
    const int64_t grad_bytes = n * DTypeSize(grads[u].dtype());
    const int64_t param_bytes = n * DTypeSize(params[u].dtype());
    const bool staged_grad = gradients_ == nullptr;
    if ((staged_grad && grad_bytes > grad_staging_.size_bytes()) ||
        (!on_host && param_bytes > param_staging_.size_bytes())) {
      return absl::FailedPreconditionError(
          absl::StrCat("host optimizer: unit ", u, "'s range of ", n, " elements (", grad_bytes,
                       " bytes of gradients, ", param_bytes,
                       " of parameters) does not fit the staging "
                       "buffers of ",
                       grad_staging_.size_bytes(), " and ", param_staging_.size_bytes(),
                       " bytes (offload.buffer_size)"));
    }
    // Everything the step loop issued for this unit's gradient comes before the copy.
    const auto down = Clock::now();
    ZT_ASSIGN_OR_RETURN(const DeviceCopyEngine::IssueMark mark, copies_->MarkIssue());
    Tensor grad = HostView(grad_staging_, grads[u].dtype(), n);
    double waited = 0;
    if (staged_grad) {
      ZT_RETURN_IF_ERROR(copies_->CopyToHost(mark, grad_staging_.raw(), grads[u].raw(), grad_bytes));
    } else {
      // Copied during the backward: wait for this unit's copy alone.
      const auto wait = Clock::now();
      ZT_ASSIGN_OR_RETURN(grad, gradients_->Take(static_cast<int>(u)));
      waited = SecondsSince(wait);
      stats_.seconds_gradient_wait += waited;
      if (grad.numel() != n) {
        return absl::InternalError(absl::StrCat("host optimizer: unit ", u, "'s gradient has ",
                                                grad.numel(), " elements, its range ", n));
      }
    }
    stats_.bytes_to_host += grad_bytes;
    if (own_master && !on_host) {
      // The parameters are what the update reads: they come down too.
      ZT_RETURN_IF_ERROR(
          copies_->CopyToHost(mark, param_staging_.raw(), params[u].raw(), param_bytes));
      stats_.bytes_to_host += param_bytes;
    }
    const auto update = Clock::now();
    // A gradient copied during the backward is counted where it ran (GradientDownloads).
    stats_.seconds_to_host += std::chrono::duration<double>(update - down).count() - waited;
    const Tensor updated = on_host ? HostView(params[u], params[u].dtype(), n)
                                   : HostView(param_staging_, params[u].dtype(), n);
    ZT_RETURN_IF_ERROR(optimizer_.StepUnit(host_ctx, static_cast<int>(u), updated,
                                           grad, lr, grad_scale, seed));
    const auto up = Clock::now();
    stats_.seconds_update += std::chrono::duration<double>(up - update).count();
    if (on_host) continue;  // the host shard is the parameters: nothing goes up
    ZT_ASSIGN_OR_RETURN(const DeviceCopyEngine::IssueMark after, copies_->MarkIssue());
    ZT_RETURN_IF_ERROR(
        copies_->CopyToDevice(after, params[u].raw(), param_staging_.raw(), param_bytes));
    stats_.bytes_to_device += param_bytes;
    stats_.seconds_to_device += SecondsSince(up);
  }
  optimizer_.CountStep();
  return absl::OkStatus();
}

absl::Status HostOptimizer::StepOnHost(const DeviceContext& host_ctx,
                                       const std::vector<Tensor>& host_params,
                                       const std::vector<Tensor>& host_grads, float lr,
                                       float grad_scale, uint64_t seed) {
  if (host_params.size() != host_grads.size() ||
      static_cast<int>(host_params.size()) != optimizer_.unit_count()) {
    return absl::InternalError(
        absl::StrCat("host optimizer: ", host_params.size(), " parameter and ", host_grads.size(),
                     " gradient buffers for ", optimizer_.unit_count(), " units"));
  }
  for (size_t u = 0; u < host_params.size(); ++u) {
    const FlatRange& range = optimizer_.range(static_cast<int>(u));
    const int64_t n = range.end - range.begin;
    if (host_params[u].numel() < n || host_grads[u].numel() < n) {
      return absl::InternalError(absl::StrCat("host optimizer: unit ", u, "'s range of ", n,
                                              " elements does not fit its host buffers (",
                                              host_params[u].numel(), " parameters, ",
                                              host_grads[u].numel(), " gradients)"));
    }
    ZT_RETURN_IF_ERROR(optimizer_.StepUnit(
        host_ctx, static_cast<int>(u), HostView(host_params[u], host_params[u].dtype(), n),
        HostView(host_grads[u], host_grads[u].dtype(), n), lr, grad_scale, seed));
  }
  optimizer_.CountStep();
  return absl::OkStatus();
}

}  // namespace zt
