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
  if (!args.host_bank1.empty() && args.host_bank1.size() != args.host.size()) {
    return absl::InvalidArgumentError(absl::StrCat("gradient downloads: ", args.host.size(),
                                                   " host buffers but ", args.host_bank1.size(),
                                                   " in bank 1"));
  }
  for (int bank = 0; bank < 2; ++bank) {
    const std::vector<Tensor>& host = bank == 0 ? args.host : args.host_bank1;
    for (size_t u = 0; u < host.size(); ++u) {
      if (host[u].device().kind != DeviceKind::kCpu) {
        return absl::InvalidArgumentError(absl::StrCat("gradient downloads: unit ", u,
                                                       "'s host buffer (bank ", bank, ") is on ",
                                                       DeviceName(host[u].device())));
      }
      if (host[u].size_bytes() < args.device[u].size_bytes()) {
        return absl::InvalidArgumentError(
            absl::StrCat("gradient downloads: unit ", u, "'s host buffer (bank ", bank, ") of ",
                         host[u].size_bytes(), " bytes is smaller than its gradient of ",
                         args.device[u].size_bytes()));
      }
    }
  }
  return std::unique_ptr<GradientDownloads>(new GradientDownloads(std::move(args)));
}

GradientDownloads::GradientDownloads(Args args)
    : copies_(args.copies),
      device_(std::move(args.device)),
      host_(std::move(args.host)),
      host_bank1_(std::move(args.host_bank1)),
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
  queue_.push_back({.unit = u, .mark = *std::move(mark), .after = std::move(after), .bank = bank_});
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
    const Tensor& dst = task.bank == 0 ? host_[task.unit] : host_bank1_[task.unit];
    const auto start = Clock::now();
    if (status.ok()) {
      status = copies_->CopyToHost(task.mark, dst.raw(), src.raw(), src.size_bytes());
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
  return Tensor((bank_ == 0 ? host_ : host_bank1_)[u].raw(), g.dtype(), {g.numel()}, Device{});
}

absl::Status GradientDownloads::UseBank(int bank) {
  std::lock_guard<std::mutex> lock(mu_);
  if (bank != 0 && (bank != 1 || host_bank1_.empty())) {
    return absl::FailedPreconditionError(absl::StrCat("gradient downloads: no host bank ", bank,
                                                      " (the plan holds ",
                                                      host_bank1_.empty() ? 1 : 2, ")"));
  }
  if (!queue_.empty() || running_) {
    return absl::FailedPreconditionError(
        "gradient downloads: the bank changes while copies are in flight (Drain first)");
  }
  bank_ = bank;
  return absl::OkStatus();
}

int GradientDownloads::bank() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bank_;
}

std::vector<Tensor> GradientDownloads::HostGradients(int bank) const {
  const std::vector<Tensor>& host = bank == 0 ? host_ : host_bank1_;
  std::vector<Tensor> out;
  for (size_t u = 0; u < host.size(); ++u) {
    out.push_back(Tensor(host[u].raw(), device_[u].dtype(), {device_[u].numel()}, Device{}));
  }
  return out;
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
    if (arenas.Spec(name + ".1").ok()) {
      ZT_ASSIGN_OR_RETURN(Tensor spare, arenas.Get(name + ".1"));
      args.host_bank1.push_back(spare);
    }
  }
  if (!args.host_bank1.empty() && args.host_bank1.size() != args.host.size()) {
    return absl::InternalError("memory plan: some units have .grads.host.1 and others not");
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
