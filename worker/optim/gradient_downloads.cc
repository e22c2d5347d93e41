#include "worker/optim/gradient_downloads.h"

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

}  // namespace

absl::StatusOr<std::unique_ptr<GradientDownloads>> GradientDownloads::Create(Args args) {
  if (args.copies == nullptr) {
    return absl::InvalidArgumentError("gradient downloads: no copy engine");
  }
  if (args.device.size() != args.host.size()) {
    return absl::InvalidArgumentError(absl::StrCat("gradient downloads: ", args.device.size(),
                                                   " gradients but ", args.host.size(),
                                                   " host buffers"));
  }
  for (size_t u = 0; u < args.host.size(); ++u) {
    if (args.host[u].device().kind != DeviceKind::kCpu) {
      return absl::InvalidArgumentError(absl::StrCat("gradient downloads: unit ", u,
                                                     "'s host buffer is on ",
                                                     DeviceName(args.host[u].device())));
    }
    if (args.host[u].size_bytes() < args.device[u].size_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient downloads: unit ", u, "'s host buffer of ", args.host[u].size_bytes(),
          " bytes is smaller than its gradient of ", args.device[u].size_bytes()));
    }
  }
  return std::unique_ptr<GradientDownloads>(new GradientDownloads(std::move(args)));
}

GradientDownloads::GradientDownloads(Args args)
    : copies_(args.copies),
      device_(std::move(args.device)),
      host_(std::move(args.host)),
      enqueued_(device_.size(), 0),
      finished_(device_.size(), 0),
      taken_(device_.size(), 0),
      unit_status_(device_.size()),
      worker_([this] { WorkerLoop(); }) {}

GradientDownloads::~GradientDownloads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void GradientDownloads::Enqueue(int u, std::vector<CommHandle> after) {
  // The compute stream's point: whatever wrote the gradient on it comes before the copy.
  absl::StatusOr<DeviceCopyEngine::IssueMark> mark = copies_->MarkIssue();
  std::lock_guard<std::mutex> lock(mu_);
  ++enqueued_[u];
  if (!mark.ok()) {
    // Nothing to copy: the unit's Take reports it.
    ++finished_[u];
    unit_status_[u] = mark.status();
    if (first_error_.ok()) first_error_ = mark.status();
    cv_.notify_all();
    return;
  }
  if (!backward_ended_) ++stats_.enqueued_during_backward;
  queue_.push_back({.unit = u, .mark = *std::move(mark), .after = std::move(after)});
  cv_.notify_all();
}

void GradientDownloads::BackwardEnded() {
  std::lock_guard<std::mutex> lock(mu_);
  backward_ended_ = true;
}

void GradientDownloads::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything queued is done
    Task task = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    lock.unlock();
    absl::Status status;
    for (const CommHandle& h : task.after) {
      absl::Status s = h.Wait();
      if (status.ok()) status = s;
    }
    const Tensor& src = device_[task.unit];
    const auto start = Clock::now();
    if (status.ok()) {
      status = copies_->CopyToHost(task.mark, host_[task.unit].raw(), src.raw(), src.size_bytes());
    }
    const double seconds = SecondsSince(start);
    lock.lock();
    running_ = false;
    ++finished_[task.unit];
    unit_status_[task.unit] = status;
    if (!status.ok() && first_error_.ok()) first_error_ = status;
    if (status.ok()) {
      stats_.bytes += src.size_bytes();
      stats_.copy_seconds += seconds;
      ++stats_.copies;
      if (!backward_ended_) ++stats_.finished_during_backward;
    }
    cv_.notify_all();
  }
}

absl::StatusOr<Tensor> GradientDownloads::Take(int u) {
  const auto start = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  if (taken_[u] == enqueued_[u]) {
    return absl::FailedPreconditionError(
        absl::StrCat("gradient downloads: unit ", u, "'s gradient was not queued this step"));
  }
  cv_.wait(lock, [&] { return finished_[u] == enqueued_[u]; });
  taken_[u] = enqueued_[u];
  stats_.wait_seconds += SecondsSince(start);
  if (!unit_status_[u].ok()) return unit_status_[u];
  const Tensor& g = device_[u];
  return Tensor(host_[u].raw(), g.dtype(), {g.numel()}, Device{});
}

absl::Status GradientDownloads::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && !running_; });
  // A step that did not take its gradients (skipped) leaves nothing for the next to take; the
  // next step's backward starts.
  taken_ = enqueued_;
  backward_ended_ = false;
  absl::Status first = std::move(first_error_);
  first_error_ = absl::OkStatus();
  return first;
}

absl::StatusOr<std::unique_ptr<GradientDownloads>> GradientDownloadsFromPlan(
    const Arenas& arenas, const ModelLayout& trained, const std::vector<Tensor>& grads,
    DeviceCopyEngine* copies) {
  GradientDownloads::Args args{.copies = copies, .device = grads};
  for (const UnitLayout& u : trained.units) {
    const std::string name = u.name + ".grads.host";
    if (!arenas.Spec(name).ok()) break;
    ZT_ASSIGN_OR_RETURN(Tensor host, arenas.Get(name));
    args.host.push_back(host);
  }
  if (args.host.empty()) return nullptr;
  if (args.host.size() != trained.units.size()) {
    return absl::InternalError(absl::StrCat("memory plan: ", trained.units[args.host.size()].name,
                                            ".grads.host is missing beside the other units'"));
  }
  return GradientDownloads::Create(std::move(args));
}

GradientDownloads::Stats GradientDownloads::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace zt
