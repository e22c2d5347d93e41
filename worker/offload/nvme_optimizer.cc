#include "worker/offload/nvme_optimizer.h"

#include <chrono>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "worker/offload/plan_ring_queue.h"
#include "worker/status_macros.h"

namespace zt {
namespace {

using Clock = std::chrono::steady_clock;
using offload::CopyHandle;
using offload::CopyQueue;
using offload::PinnedLease;
using offload::SwapRole;

constexpr int64_t kExtentAlignment = 4096;

int64_t RoundUp(int64_t bytes) {
  return (bytes + kExtentAlignment - 1) / kExtentAlignment * kExtentAlignment;
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

absl::StatusOr<SwapRole> SwapRoleFor(const std::string& name) {
  static const std::pair<const char*, SwapRole> kRoles[] = {
      {"master", SwapRole::kMaster},
      {"master_low", SwapRole::kMaster},
      {"adam_m", SwapRole::kMomentum},
      {"momentum", SwapRole::kMomentum},
      {"adafactor_m", SwapRole::kMomentum},
      {"adam_v", SwapRole::kVariance},
      {"adam8_m_codes", SwapRole::kMomentumCodes},
      {"adam8_v_codes", SwapRole::kVarianceCodes},
      {"adam8_m_absmax", SwapRole::kQuantScales},
      {"adam8_v_absmax", SwapRole::kVarianceScales},
      {"adafactor_row", SwapRole::kFactorRow},
      {"adafactor_col", SwapRole::kFactorCol},
      {"adafactor_full", SwapRole::kFactorFull},
  };
  for (const auto& [known, role] : kRoles) {
    if (name == known) return role;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("offload: no swap store role for optimizer state '", name, "'"));
}

absl::StatusOr<std::unique_ptr<NvmeOptimizer>> NvmeOptimizer::Create(Args args) {
  if (args.copies == nullptr || args.store == nullptr || args.store_job.empty()) {
    return absl::InvalidArgumentError("nvme optimizer: no copy engine, store or store job key");
  }
  if (args.ring == nullptr || args.buffer_size <= 0 || args.buffer_size % kExtentAlignment != 0 ||
      reinterpret_cast<uintptr_t>(args.ring) % kExtentAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nvme optimizer: the ring must start on a 4096-byte boundary and its buffer_size (",
        args.buffer_size, ") be a positive multiple of 4096"));
  }
  const Optimizer& opt = args.optimizer;
  if (static_cast<int>(args.unit_names.size()) != opt.unit_count()) {
    return absl::InvalidArgumentError(absl::StrCat("nvme optimizer: ", args.unit_names.size(),
                                                   " unit names for ", opt.unit_count(), " units"));
  }
  std::vector<UnitSlots> units(opt.unit_count());
  int most_bins = 0;
  for (int u = 0; u < opt.unit_count(); ++u) {
    const FlatRange& range = opt.range(u);
    const int64_t n = range.end - range.begin;
    std::vector<Slot> slots;
    if (opt.has_master()) {
      if (args.master_numel.size() != args.unit_names.size() || args.master_numel[u] < n) {
        return absl::InvalidArgumentError(absl::StrCat("nvme optimizer: unit ", args.unit_names[u],
                                                       " needs a master buffer of at least ", n,
                                                       " elements"));
      }
      const bool split = opt.split_master();
      slots.push_back({.name = args.unit_names[u] + (split ? ".master_low" : ".master"),
                       .role = SwapRole::kMaster,
                       .dtype = split ? DType::kI16 : DType::kF32,
                       .numel = args.master_numel[u],
                       .buffer = kMasterSlot});
    }
    if (args.params == ParamHome::kSwapped) {
      if (args.param_numel.size() != args.unit_names.size() || args.param_numel[u] < n) {
        return absl::InvalidArgumentError(absl::StrCat("nvme optimizer: unit ", args.unit_names[u],
                                                       " needs a parameter shard of at least ", n,
                                                       " elements"));
      }
      slots.push_back({.name = args.unit_names[u] + ".params",
                       .role = SwapRole::kParameters,
                       .dtype = args.param_dtype,
                       .numel = args.param_numel[u],
                       .buffer = kParamsSlot});
    }
    const UnitOptimizerState& state = opt.unit_state(u);
    for (size_t b = 0; b < state.buffers.size(); ++b) {
      ZT_ASSIGN_OR_RETURN(const SwapRole role, SwapRoleFor(state.buffers[b].name));
      slots.push_back({.name = args.unit_names[u] + "." + state.buffers[b].name,
                       .role = role,
                       .dtype = state.buffers[b].dtype,
                       .numel = state.buffers[b].numel,
                       .buffer = static_cast<int>(b)});
    }
    // First fit into ring buffers, each extent page-aligned (O_DIRECT's unit).
    std::vector<int64_t> used;
    for (Slot& slot : slots) {
      slot.bytes = slot.numel * DTypeSize(slot.dtype);
      if (slot.bytes == 0) continue;
      const int64_t placed = RoundUp(slot.bytes);
      if (placed > args.buffer_size) {
        return absl::FailedPreconditionError(
            absl::StrCat("offload.buffer_size: ", args.buffer_size,
                         " bytes is less than optimizer state ", slot.name, " of ", slot.bytes,
                         " bytes, which the NVMe optimizer step swaps through one ring buffer"));
      }
      size_t bin = 0;
      while (bin < used.size() && used[bin] + placed > args.buffer_size) ++bin;
      if (bin == used.size()) used.push_back(0);
      slot.bin = static_cast<int>(bin);
      slot.offset = static_cast<size_t>(used[bin]);
      used[bin] += placed;
    }
    std::erase_if(slots, [](const Slot& s) { return s.bytes == 0; });
    units[u].slots = std::move(slots);
    units[u].bins = static_cast<int>(used.size());
    most_bins = std::max(most_bins, units[u].bins);
  }
  if (args.buffer_count < 2 + most_bins) {
    return absl::FailedPreconditionError(absl::StrCat(
        "offload.buffer_count: ", args.buffer_count, " — the NVMe optimizer step needs ",
        2 + most_bins, " ring buffers of offload.buffer_size ", args.buffer_size,
        " (2 to stage gradients and parameters, ", most_bins,
        " for a unit's master weights and states), and ", 2 + 2 * most_bins,
        " to read the next unit ahead"));
  }
  ZT_ASSIGN_OR_RETURN(PlanRingQueue q,
                      OpenPlanRingQueue(args.store, args.store_job, args.home_file, args.ring,
                                        args.buffer_count, args.buffer_size));
  return std::unique_ptr<NvmeOptimizer>(
      new NvmeOptimizer(std::move(args), std::move(units), std::move(q.ring), std::move(q.queue)));
}

NvmeOptimizer::NvmeOptimizer(Args args, std::vector<UnitSlots> units,
                             std::unique_ptr<offload::BorrowedRegionAllocator> ring,
                             std::unique_ptr<offload::CopyQueue> queue)
    : optimizer_(std::move(args.optimizer)),
      unit_names_(std::move(args.unit_names)),
      copies_(args.copies),
      params_home_(args.params),
      gradients_(args.gradients),
      param_numel_(std::move(args.param_numel)),
      params_dtype_(args.param_dtype),
      store_(args.store),
      job_(std::move(args.store_job)),
      units_(std::move(units)),
      ring_(std::move(ring)),
      queue_(std::move(queue)) {
  grad_staging_ = queue_->AcquireBuffer();
  param_staging_ = queue_->AcquireBuffer();
  shard_reads_.resize(units_.size());
}

NvmeOptimizer::~NvmeOptimizer() {
  SettleCommit().IgnoreError();  // the trainer settles it and reports its failure
  if (queue_ != nullptr) queue_->Drain().IgnoreError();
  first_ahead_.reset();
  shard_reads_.clear();
  grad_staging_.Release();
  param_staging_.Release();
  queue_.reset();
}

offload::SwapKey NvmeOptimizer::KeyOf(int u, const Slot& slot, uint64_t generation) const {
  const FlatRange& range = optimizer_.range(u);
  return {.job = job_,
          .unit = static_cast<uint32_t>(u),
          .range_begin = static_cast<uint64_t>(range.begin),
          .range_end = static_cast<uint64_t>(range.end),
          .role = slot.role,
          .generation = generation};
}

std::vector<CopyQueue::BufferExtent> NvmeOptimizer::ExtentsOf(int u, int bin,
                                                              uint64_t generation) const {
  std::vector<CopyQueue::BufferExtent> out;
  for (const Slot& slot : units_[u].slots) {
    if (slot.bin != bin) continue;
    out.push_back({.key = KeyOf(u, slot, generation),
                   .offset = slot.offset,
                   .length = static_cast<size_t>(slot.bytes)});
  }
  return out;
}

std::optional<NvmeOptimizer::Pending> NvmeOptimizer::Issue(int u, uint64_t generation, bool wait) {
  Pending p;
  p.unit = u;
  p.generation = generation;
  for (int b = 0; b < units_[u].bins; ++b) {
    if (wait) {
      p.bins.push_back(queue_->AcquireBuffer());
    } else {
      absl::StatusOr<PinnedLease> lease = queue_->TryAcquireBuffer();
      // The leases taken so far go back to the ring with `p`.
      if (!lease.ok()) return std::nullopt;
      p.bins.push_back(std::move(*lease));
    }
  }
  for (int b = 0; b < units_[u].bins; ++b) {
    p.reads.push_back(queue_->SwapInPlace(ExtentsOf(u, b, generation), p.bins[b]));
  }
  return p;
}

void NvmeOptimizer::WriteBehind(Pending pending, uint64_t generation,
                                std::vector<CopyHandle>& writes) {
  for (int b = 0; b < units_[pending.unit].bins; ++b) {
    writes.push_back(
        queue_->SwapOutPlace(ExtentsOf(pending.unit, b, generation), std::move(pending.bins[b])));
  }
}

int64_t NvmeOptimizer::GenerationBytes() const {
  int64_t total = 0;
  for (const UnitSlots& u : units_) {
    for (const Slot& s : u.slots) total += RoundUp(s.bytes);
  }
  return total;
}

absl::Status NvmeOptimizer::GenerationFailed(const absl::Status& failed, uint64_t generation,
                                             const std::string& what) const {
  return absl::Status(
      failed.code(),
      absl::StrCat("offload.nvme_path '", store_->path(), "': ", what, " (generation ", generation,
                   " of ", GenerationBytes(), " bytes of this rank's states, ",
                   "beside the committed one) failed: ", failed.message()));
}

absl::Status NvmeOptimizer::WaitForWrites(std::vector<CopyHandle>& writes, uint64_t generation,
                                          const std::string& what) {
  absl::Status failed;
  for (const CopyHandle& w : writes) {
    if (absl::Status s = w.Wait(); !s.ok() && failed.ok()) failed = s;
  }
  writes.clear();
  if (!failed.ok()) return GenerationFailed(failed, generation, what);
  return absl::OkStatus();
}

absl::Status NvmeOptimizer::CommitGeneration(std::vector<CopyHandle>& writes, uint64_t generation,
                                             const std::string& what) {
  // Nothing of a generation with a failed write is committed: the previous one stays whole.
  absl::Status failed = WaitForWrites(writes, generation, what);
  if (!failed.ok()) {
    queue_->Drain().IgnoreError();  // the error is the handle's, taken above
    return failed;
  }
  failed = queue_->Commit(job_, generation).Wait();
  queue_->Drain().IgnoreError();  // the errors are the handles', taken above
  if (!failed.ok()) return GenerationFailed(failed, generation, what);
  committed_ = generation;
  return absl::OkStatus();
}

absl::Status NvmeOptimizer::SettleCommit() {
  if (!deferred_commit_) return deferred_failure_;
  DeferredCommit d = std::move(*deferred_commit_);
  deferred_commit_.reset();
  // A failed write is the first cause (the commit task refused to commit after it).
  absl::Status failed = WaitForWrites(d.writes, d.generation, d.what);
  if (const absl::Status commit = d.commit.Wait(); failed.ok() && !commit.ok()) {
    failed = GenerationFailed(commit, d.generation, d.what);
  }
  if (!failed.ok()) {
    queue_->Drain().IgnoreError();  // the error is the handles', taken above
    deferred_failure_ = failed;
    return failed;
  }
  committed_ = d.generation;
  return absl::OkStatus();
}

Optimizer::UnitStateViews NvmeOptimizer::ViewsOf(const Pending& pending) const {
  const int u = pending.unit;
  Optimizer::UnitStateViews views;
  views.buffers.resize(optimizer_.unit_state(u).buffers.size());
  for (const Slot& slot : units_[u].slots) {
    const Tensor t(pending.bins[slot.bin].data() + slot.offset, slot.dtype, {slot.numel}, Device{});
    if (slot.buffer == kMasterSlot) {
      views.master = t;
    } else if (slot.buffer >= 0) {
      views.buffers[slot.buffer] = t;
    }
  }
  // A range that holds none of the unit has no master bytes: an empty view, at an address
  // that exists.
  if (optimizer_.has_master() && views.master.raw() == nullptr) {
    views.master = Tensor(grad_staging_.data(),
                          optimizer_.split_master() ? DType::kI16 : DType::kF32, {0}, Device{});
  }
  return views;
}

Tensor NvmeOptimizer::ParamsOf(const Pending& pending, int64_t n) const {
  for (const Slot& slot : units_[pending.unit].slots) {
    if (slot.buffer != kParamsSlot) continue;
    return Tensor(pending.bins[slot.bin].data() + slot.offset, slot.dtype, {n}, Device{});
  }
  return Tensor(grad_staging_.data(), params_dtype_, {0}, Device{});
}

absl::Status NvmeOptimizer::Initialize(
    const std::function<absl::Status(int u, const Tensor& master, const Tensor& params)>& fill) {
  ZT_RETURN_IF_ERROR(SettleCommit());
  Discard(first_ahead_);
  DropShardReads();
  const uint64_t generation = committed_ + 1;
  std::vector<CopyHandle> writes;
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    Pending p;
    p.unit = u;
    for (int b = 0; b < units_[u].bins; ++b) {
      p.bins.push_back(queue_->AcquireBuffer());
      std::memset(p.bins.back().data(), 0, p.bins.back().size());
    }
    const Optimizer::UnitStateViews views = ViewsOf(p);
    Tensor params;
    if (params_home_ == ParamHome::kSwapped) {
      // The whole shard as the plan holds it (its padding stays the zeros set above).
      params = ParamsOf(p, param_numel_[u]);
    }
    ZT_RETURN_IF_ERROR(fill(u, views.master, params));
    WriteBehind(std::move(p), generation, writes);
  }
  return CommitGeneration(writes, generation, "writing the initial optimizer states");
}

absl::Status NvmeOptimizer::Step(const DeviceContext& host_ctx, const std::vector<Tensor>& params,
                                 const std::vector<Tensor>& grads, float lr, float grad_scale,
                                 uint64_t seed, CommitTiming timing) {
  return StepUnits(host_ctx, params, grads, lr, grad_scale, seed, /*on_host=*/false, timing);
}

absl::Status NvmeOptimizer::StepOnHost(const DeviceContext& host_ctx,
                                       const std::vector<Tensor>& host_params,
                                       const std::vector<Tensor>& host_grads, float lr,
                                       float grad_scale, uint64_t seed) {
  // Swapped shards are updated in the ring with the states: no host bank is read.
  const size_t param_banks = params_home_ == ParamHome::kSwapped ? 0 : units_.size();
  if (host_params.size() != param_banks || host_grads.size() != units_.size()) {
    return absl::InternalError(absl::StrCat("nvme optimizer: ", host_params.size(),
                                            " parameter and ", host_grads.size(),
                                            " gradient buffers for ", units_.size(), " units"));
  }
  // On the host step's thread: the generation is committed there (or at the switch), never
  // left behind the rank thread's compute.
  return StepUnits(host_ctx, host_params, host_grads, lr, grad_scale, seed, /*on_host=*/true,
                   CommitTiming::kBeforeReturning);
}

absl::Status NvmeOptimizer::StepUnits(const DeviceContext& host_ctx,
                                      const std::vector<Tensor>& params,
                                      const std::vector<Tensor>& grads, float lr, float grad_scale,
                                      uint64_t seed, bool host_only, CommitTiming timing) {
  // The step reads the committed generation: a previous step's commit is settled first.
  ZT_RETURN_IF_ERROR(SettleCommit());
  const bool own_master = !optimizer_.has_master();
  // The parameters are where the update writes them already (host shards, or swapped with
  // the states): none comes down or goes up.
  const bool on_host = host_only || params_home_ != ParamHome::kDevice;
  const bool swapped = params_home_ == ParamHome::kSwapped;
  const uint64_t read = committed_, write = committed_ + 1;
  const int n_units = static_cast<int>(units_.size());
  std::vector<CopyHandle> writes;
  std::optional<Pending> next, cur;
  // On an early return, the reads still queued into the held buffers finish before the
  // buffers go back to the ring (this runs before `cur` and `next` are destroyed).
  absl::Cleanup drain = [this] { queue_->Drain().IgnoreError(); };
  if (first_ahead_ && first_ahead_->generation == read) {
    next = std::move(first_ahead_);
    first_ahead_.reset();
    if (!host_only) ++stats_.first_unit_reads_ahead;
  }
  Discard(first_ahead_);  // of another generation (none is read after a restore)
  if (n_units > 0 && !next) next = Issue(0, read, /*wait=*/true);
  for (int u = 0; u < n_units; ++u) {
    cur = std::move(next);
    next.reset();
    // Read-ahead: the next unit's states come in while this one is updated, if the ring has
    // room beside this unit's buffers and the writes still in flight.
    if (u + 1 < n_units) next = Issue(u + 1, read, /*wait=*/false);
    const FlatRange& range = optimizer_.range(u);
    const int64_t n = range.end - range.begin;
    if (host_only) {
      // The delayed update's bank: the gradient and the parameters are host buffers of the
      // unit's range already (swapped parameters are in the ring with the states); nothing is
      // copied and no Stats change (another thread reads them meanwhile).
      if (grads[u].numel() < n || (!swapped && params[u].numel() < n)) {
        return absl::InternalError(absl::StrCat("nvme optimizer: unit ", unit_names_[u],
                                                "'s host buffers hold fewer than its range of ",
                                                n, " elements"));
      }
      for (const CopyHandle& r : cur->reads) {
        if (absl::Status st = r.Wait(); !st.ok()) {
          return absl::Status(st.code(), absl::StrCat("offload.nvme_path '", store_->path(),
                                                      "': swapping in unit ", unit_names_[u],
                                                      "'s optimizer states failed: ",
                                                      st.message()));
        }
      }
      const Tensor grad(grads[u].raw(), grads[u].dtype(), {n}, Device{});
      const Tensor updated =
          swapped ? ParamsOf(*cur, n) : Tensor(params[u].raw(), params[u].dtype(), {n}, Device{});
      ZT_RETURN_IF_ERROR(optimizer_.StepUnit(host_ctx, u, updated, grad, lr, grad_scale, seed,
                                             ViewsOf(*cur)));
      WriteBehind(std::move(*cur), write, writes);
      cur.reset();
      if (u + 1 < n_units && !next) next = Issue(u + 1, read, /*wait=*/true);
      continue;
    }
    const int64_t grad_bytes = n * DTypeSize(grads[u].dtype());
    const int64_t param_bytes = n * DTypeSize(params[u].dtype());
    const bool staged_grad = gradients_ == nullptr;
    if ((staged_grad && grad_bytes > static_cast<int64_t>(grad_staging_.size())) ||
        param_bytes > static_cast<int64_t>(param_staging_.size())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "nvme optimizer: unit ", unit_names_[u], "'s range of ", n, " elements (", grad_bytes,
          " bytes of gradients, ", param_bytes, " of parameters) does not fit a ring buffer of ",
          grad_staging_.size(), " bytes (offload.buffer_size)"));
    }
    const auto down = Clock::now();
    ZT_ASSIGN_OR_RETURN(const DeviceCopyEngine::IssueMark mark, copies_->MarkIssue());
    Tensor grad(grad_staging_.data(), grads[u].dtype(), {n}, Device{});
    double waited = 0;
    if (staged_grad) {
      ZT_RETURN_IF_ERROR(
          copies_->CopyToHost(mark, grad_staging_.data(), grads[u].raw(), grad_bytes));
    } else {
      // Copied during the backward: wait for this unit's copy alone.
      const auto wait = Clock::now();
      ZT_ASSIGN_OR_RETURN(grad, gradients_->Take(u));
      waited = SecondsSince(wait);
      stats_.seconds_gradient_wait += waited;
      if (grad.numel() != n) {
        return absl::InternalError(absl::StrCat("nvme optimizer: unit ", unit_names_[u],
                                                "'s gradient has ", grad.numel(),
                                                " elements, its range ", n));
      }
    }
    stats_.bytes_to_host += grad_bytes;
    if (own_master && !on_host) {
      ZT_RETURN_IF_ERROR(
          copies_->CopyToHost(mark, param_staging_.data(), params[u].raw(), param_bytes));
      stats_.bytes_to_host += param_bytes;
    }
    // A gradient copied during the backward is counted where it ran (GradientDownloads).
    stats_.seconds_to_host += SecondsSince(down) - waited;
    for (const CopyHandle& r : cur->reads) {
      if (absl::Status s = r.Wait(); !s.ok()) {
        return absl::Status(
            s.code(), absl::StrCat("offload.nvme_path '", store_->path(), "': swapping in unit ",
                                   unit_names_[u], "'s optimizer states failed: ", s.message()));
      }
    }
    const auto update = Clock::now();
    const Tensor updated = swapped ? ParamsOf(*cur, n)
                                   : Tensor(on_host ? params[u].raw() : param_staging_.data(),
                                            params[u].dtype(), {n}, Device{});
    ZT_RETURN_IF_ERROR(optimizer_.StepUnit(
        host_ctx, u, updated, grad, lr, grad_scale, seed, ViewsOf(*cur)));
    const auto up = Clock::now();
    stats_.seconds_update += std::chrono::duration<double>(up - update).count();
    if (!on_host) {
      ZT_ASSIGN_OR_RETURN(const DeviceCopyEngine::IssueMark after, copies_->MarkIssue());
      ZT_RETURN_IF_ERROR(
          copies_->CopyToDevice(after, params[u].raw(), param_staging_.data(), param_bytes));
      stats_.bytes_to_device += param_bytes;
      stats_.seconds_to_device += SecondsSince(up);
    }
    WriteBehind(std::move(*cur), write, writes);
    cur.reset();
    // This rank now holds no state buffer: waiting for the ring is safe (the writes in flight
    // give theirs back).
    if (u + 1 < n_units && !next) next = Issue(u + 1, read, /*wait=*/true);
  }
  const std::string what =
      absl::StrCat("swapping out step ", optimizer_.steps_taken() + 1, "'s states");
  if (host_only && swapped) {
    // The gathers beside this host step read the committed generation: this one waits for the
    // switch (CommitHostStep), its writes done.
    ZT_RETURN_IF_ERROR(WaitForWrites(writes, write, what));
    host_step_staged_ = write;
  } else if (timing == CommitTiming::kBehindNextCompute && !swapped && !host_only) {
    // The next forward and backward read nothing of the store: the writes still in flight and
    // the commit behind them finish beside them (the ring buffers the writes hold go back as
    // each lands), and the next call that reads the store settles it.
    offload::CopyHandle commit = queue_->Commit(job_, write, writes);
    deferred_commit_ = DeferredCommit{.generation = write,
                                      .what = what,
                                      .writes = std::move(writes),
                                      .commit = std::move(commit)};
    std::move(drain).Cancel();
  } else {
    ZT_RETURN_IF_ERROR(CommitGeneration(writes, write, what));
  }
  optimizer_.CountStep();
  return absl::OkStatus();
}

absl::Status NvmeOptimizer::CommitHostStep() {
  if (host_step_staged_ == 0) return absl::OkStatus();
  const uint64_t generation = std::exchange(host_step_staged_, 0);
  std::vector<CopyHandle> written;  // StepOnHost waited for them
  return CommitGeneration(
      written, generation,
      absl::StrCat("committing step ", optimizer_.steps_taken(), "'s states at the switch"));
}

absl::StatusOr<const NvmeOptimizer::Slot*> NvmeOptimizer::FindSlot(const std::string& name,
                                                                   int* unit) const {
  for (size_t u = 0; u < units_.size(); ++u) {
    for (const Slot& s : units_[u].slots) {
      if (s.name == name) {
        *unit = static_cast<int>(u);
        return &s;
      }
    }
  }
  return absl::NotFoundError(
      absl::StrCat("nvme optimizer: '", name, "' is not a state it swaps (or holds no bytes)"));
}

absl::StatusOr<const void*> NvmeOptimizer::ReadBuffer(const std::string& name) {
  ZT_RETURN_IF_ERROR(SettleCommit());
  int u = 0;
  ZT_ASSIGN_OR_RETURN(const Slot* slot, FindSlot(name, &u));
  ZT_RETURN_IF_ERROR(queue_->Drain());
  ZT_RETURN_IF_ERROR(store_
                         ->Read(KeyOf(u, *slot, committed_),
                                {grad_staging_.data(), static_cast<size_t>(slot->bytes)})
                         .status());
  return static_cast<const void*>(grad_staging_.data());
}

void NvmeOptimizer::Discard(std::optional<Pending>& pending) {
  if (!pending) return;
  for (const CopyHandle& r : pending->reads) r.Wait().IgnoreError();  // scratch: dropped
  pending.reset();
}

void NvmeOptimizer::ReadFirstUnitAhead() {
  if (first_ahead_ || units_.empty()) return;
  // The reads are of the committed generation; a failed commit is Step's to report.
  if (!SettleCommit().ok()) return;
  first_ahead_ = Issue(0, committed_, /*wait=*/false);
}

const NvmeOptimizer::Slot* NvmeOptimizer::ParamSlotOf(int u) const {
  if (u < 0 || u >= static_cast<int>(units_.size())) return nullptr;
  for (const Slot& slot : units_[u].slots) {
    if (slot.buffer == kParamsSlot) return &slot;
  }
  return nullptr;
}

void NvmeOptimizer::ReadShardAhead(int u) {
  const Slot* slot = ParamSlotOf(u);
  if (slot == nullptr || slot->bytes == 0) return;
  absl::StatusOr<PinnedLease> lease = queue_->TryAcquireBuffer();
  if (!lease.ok()) return;  // the gather reads it itself
  ShardRead r{.lease = std::move(*lease)};
  r.read = queue_->SwapInPlace({{.key = KeyOf(u, *slot, committed_),
                                 .offset = 0,
                                 .length = static_cast<size_t>(slot->bytes)}},
                               r.lease);
  shard_reads_[u].push_back(std::move(r));
}

absl::Status NvmeOptimizer::WithShard(int u, const std::function<absl::Status(const void*)>& use) {
  const Slot* slot = ParamSlotOf(u);
  if (slot == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("nvme optimizer: unit ", u, " has no swapped parameter shard"));
  }
  auto failed = [&](const absl::Status& s) {
    return absl::Status(
        s.code(), absl::StrCat("offload.nvme_path '", store_->path(), "': reading ", slot->name,
                               " for its gather failed: ", s.message()));
  };
  if (!shard_reads_[u].empty()) {
    ShardRead r = std::move(shard_reads_[u].front());
    shard_reads_[u].pop_front();
    if (absl::Status s = r.read.Wait(); !s.ok()) return failed(s);
    ++stats_.shard_reads_ahead;
    return use(r.lease.data());  // the lease goes back to the ring on return
  }
  if (slot->bytes > 0) {
    const CopyHandle read = queue_->SwapInPlace({{.key = KeyOf(u, *slot, committed_),
                                                  .offset = 0,
                                                  .length = static_cast<size_t>(slot->bytes)}},
                                                grad_staging_);
    if (absl::Status s = read.Wait(); !s.ok()) return failed(s);
  }
  ++stats_.shard_reads_at_gather;
  return use(grad_staging_.data());
}

void NvmeOptimizer::DropShardReads() {
  for (std::deque<ShardRead>& reads : shard_reads_) {
    for (const ShardRead& r : reads) r.read.Wait().IgnoreError();  // scratch: dropped
    reads.clear();
  }
}

void NvmeOptimizer::BeginRestore() {
  // Settled first: the restore's generation follows the committed one. A failed commit stays
  // for FinishRestore to return.
  SettleCommit().IgnoreError();
  Discard(first_ahead_);
  DropShardReads();
  restoring_ = committed_ + 1;
}

absl::Status NvmeOptimizer::WriteBuffer(const std::string& name, const void* data, int64_t bytes) {
  if (restoring_ == 0) return absl::FailedPreconditionError("nvme optimizer: no restore begun");
  int u = 0;
  ZT_ASSIGN_OR_RETURN(const Slot* slot, FindSlot(name, &u));
  if (bytes != slot->bytes) {
    return absl::InvalidArgumentError(absl::StrCat("nvme optimizer: restoring ", name, " from ",
                                                   bytes, " bytes; it holds ", slot->bytes));
  }
  return store_->Write(KeyOf(u, *slot, restoring_),
                       {static_cast<const std::byte*>(data), static_cast<size_t>(bytes)});
}

absl::Status NvmeOptimizer::FinishRestore() {
  if (restoring_ == 0) return absl::FailedPreconditionError("nvme optimizer: no restore begun");
  const uint64_t generation = std::exchange(restoring_, 0);
  ZT_RETURN_IF_ERROR(deferred_failure_);
  std::vector<CopyHandle> none;
  return CommitGeneration(none, generation, "writing the restored optimizer states");
}

std::map<std::string, int64_t> NvmeOptimizer::SwappedBuffers() const {
  std::map<std::string, int64_t> out;
  for (const UnitSlots& u : units_) {
    for (const Slot& s : u.slots) out[s.name] = s.bytes;
  }
  return out;
}

NvmeOptimizer::Stats NvmeOptimizer::stats() const {
  Stats s = stats_;
  const offload::CopyQueueStats q = queue_->stats();
  s.swap_bytes_in = static_cast<int64_t>(q.bytes_in);
  s.swap_bytes_out = static_cast<int64_t>(q.bytes_out_queued);
  s.swap_seconds_in = q.seconds_in;
  s.swap_seconds_out = q.seconds_out;
  return s;
}

}  // namespace zt
