#include "worker/offload/swapped_base.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/offload/plan_ring_queue.h"
#include "worker/status_macros.h"

namespace zt {
namespace {

using offload::CopyHandle;
using offload::PinnedLease;
using offload::SwapRole;

constexpr int64_t kExtentAlignment = 4096;

int64_t RoundUp(int64_t bytes) {
  return (bytes + kExtentAlignment - 1) / kExtentAlignment * kExtentAlignment;
}

constexpr SwapRole kRoles[SwappedBase::kParts] = {SwapRole::kParameters,
                                                  SwapRole::kQuantizedBase};
constexpr const char* kSuffixes[SwappedBase::kParts] = {".params", ".qbase"};

}  // namespace

absl::StatusOr<std::unique_ptr<SwappedBase>> SwappedBase::Create(Args args) {
  if (args.store == nullptr || args.store_job.empty()) {
    return absl::InvalidArgumentError("swapped base: no store or store job key");
  }
  if (args.ring == nullptr || args.buffer_count < 1 || args.buffer_size <= 0 ||
      args.buffer_size % kExtentAlignment != 0 ||
      reinterpret_cast<uintptr_t>(args.ring) % kExtentAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "swapped base: the ring must hold at least one buffer, start on a 4096-byte boundary "
        "and its buffer_size (",
        args.buffer_size, ") be a positive multiple of 4096"));
  }
  for (const Unit& u : args.units) {
    const int64_t need = RoundUp(u.bytes[0]) + u.bytes[1];
    if (need > args.buffer_size) {
      return absl::FailedPreconditionError(absl::StrCat(
          "offload.buffer_size: ", args.buffer_size, " bytes is less than the ", need,
          " bytes of ", u.name, "'s frozen base shard (its parameters page-aligned, then its "
          "quantized bytes), which a gather reads through one ring buffer"));
    }
  }
  ZT_ASSIGN_OR_RETURN(PlanRingQueue q,
                      OpenPlanRingQueue(args.store, args.store_job, args.home_file, args.ring,
                                        args.buffer_count, args.buffer_size));
  return std::unique_ptr<SwappedBase>(
      new SwappedBase(std::move(args), std::move(q.ring), std::move(q.queue)));
}

SwappedBase::SwappedBase(Args args, std::unique_ptr<offload::BorrowedRegionAllocator> ring,
                         std::unique_ptr<offload::CopyQueue> queue)
    : units_(std::move(args.units)),
      store_(args.store),
      job_(std::move(args.store_job)),
      ring_(std::move(ring)),
      queue_(std::move(queue)) {
  staging_ = queue_->AcquireBuffer();
  reads_.resize(units_.size());
}

SwappedBase::~SwappedBase() {
  DropReads();
  if (queue_ != nullptr) queue_->Drain().IgnoreError();
  staging_.Release();
  queue_.reset();
}

offload::SwapKey SwappedBase::KeyOf(int u, Part part, uint64_t generation) const {
  const FlatRange& range = units_[u].range[static_cast<int>(part)];
  return {.job = job_,
          .unit = static_cast<uint32_t>(u),
          .range_begin = static_cast<uint64_t>(range.begin),
          .range_end = static_cast<uint64_t>(range.end),
          .role = kRoles[static_cast<int>(part)],
          .generation = generation};
}

size_t SwappedBase::OffsetOf(const Unit& unit, Part part) {
  return part == Part::kParams ? 0 : static_cast<size_t>(RoundUp(unit.bytes[0]));
}

std::string SwappedBase::NameOf(int u, Part part) const {
  return units_[u].name + kSuffixes[static_cast<int>(part)];
}

absl::StatusOr<std::pair<int, SwappedBase::Part>> SwappedBase::Find(
    const std::string& name) const {
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    for (int p = 0; p < kParts; ++p) {
      if (units_[u].bytes[p] > 0 && NameOf(u, static_cast<Part>(p)) == name) {
        return std::make_pair(u, static_cast<Part>(p));
      }
    }
  }
  return absl::NotFoundError(
      absl::StrCat("swapped base: '", name, "' is not a frozen base shard it holds"));
}

bool SwappedBase::Holds(const std::string& name) const { return Find(name).ok(); }

absl::Status SwappedBase::Initialize(
    const std::function<absl::Status(int u, Part part, std::byte* data)>& fill) {
  DropReads();
  const uint64_t generation = committed_ + 1;
  // Set-up, not the step loop: each part goes through the staging buffer and straight to the
  // store, one at a time.
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    for (int p = 0; p < kParts; ++p) {
      const int64_t bytes = units_[u].bytes[p];
      if (bytes == 0) continue;
      std::memset(staging_.data(), 0, static_cast<size_t>(bytes));
      ZT_RETURN_IF_ERROR(fill(u, static_cast<Part>(p), staging_.data()));
      if (absl::Status s = store_->Write(KeyOf(u, static_cast<Part>(p), generation),
                                         {staging_.data(), static_cast<size_t>(bytes)});
          !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("offload.nvme_path '", store_->path(),
                                                   "': writing the frozen base's ",
                                                   NameOf(u, static_cast<Part>(p)),
                                                   " failed: ", s.message()));
      }
    }
  }
  if (absl::Status s = store_->Commit(job_, generation); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("offload.nvme_path '", store_->path(),
                                               "': committing the frozen base failed: ",
                                               s.message()));
  }
  committed_ = generation;
  return absl::OkStatus();
}

void SwappedBase::ReadAhead(int u) {
  if (u < 0 || u >= static_cast<int>(units_.size())) return;
  const Unit& unit = units_[u];
  if (unit.bytes[0] == 0 && unit.bytes[1] == 0) return;
  absl::StatusOr<PinnedLease> lease = queue_->TryAcquireBuffer();
  if (!lease.ok()) return;  // the gather reads it itself
  std::vector<offload::CopyQueue::BufferExtent> extents;
  Read r;
  for (int p = 0; p < kParts; ++p) {
    if (unit.bytes[p] == 0) {
      r.taken[p] = true;  // nothing to take
      continue;
    }
    extents.push_back({.key = KeyOf(u, static_cast<Part>(p), committed_),
                       .offset = OffsetOf(unit, static_cast<Part>(p)),
                       .length = static_cast<size_t>(unit.bytes[p])});
  }
  r.lease = std::move(*lease);
  r.handle = queue_->SwapInPlace(std::move(extents), r.lease);
  reads_[u].push_back(std::move(r));
}

absl::Status SwappedBase::WithShard(int u, Part part,
                                    const std::function<absl::Status(const void*)>& use) {
  const int p = static_cast<int>(part);
  if (u < 0 || u >= static_cast<int>(units_.size()) || units_[u].bytes[p] == 0) {
    return absl::NotFoundError(absl::StrCat("swapped base: unit ", u, " has no ",
                                            kSuffixes[p] + 1, " shard in the store"));
  }
  const Unit& unit = units_[u];
  auto failed = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("offload.nvme_path '", store_->path(),
                                               "': reading ", NameOf(u, part),
                                               " for its gather failed: ", s.message()));
  };
  for (auto it = reads_[u].begin(); it != reads_[u].end(); ++it) {
    if (it->taken[p]) continue;
    if (absl::Status s = it->handle.Wait(); !s.ok()) return failed(s);
    ++stats_.reads_ahead[p];
    it->taken[p] = true;
    const absl::Status used = use(it->lease.data() + OffsetOf(unit, part));
    // The buffer goes back to the ring once the gather took both parts.
    if (it->taken[0] && it->taken[1]) reads_[u].erase(it);
    return used;
  }
  const CopyHandle read =
      queue_->SwapInPlace({{.key = KeyOf(u, part, committed_),
                            .offset = 0,
                            .length = static_cast<size_t>(unit.bytes[p])}},
                          staging_);
  if (absl::Status s = read.Wait(); !s.ok()) return failed(s);
  ++stats_.reads_at_gather[p];
  return use(staging_.data());
}

void SwappedBase::DropReads() {
  for (std::deque<Read>& reads : reads_) {
    for (const Read& r : reads) r.handle.Wait().IgnoreError();  // scratch: dropped
    reads.clear();
  }
}

absl::StatusOr<const void*> SwappedBase::ReadBuffer(const std::string& name) {
  ZT_ASSIGN_OR_RETURN(const auto found, Find(name));
  const auto [u, part] = found;
  ZT_RETURN_IF_ERROR(queue_->Drain());
  ZT_RETURN_IF_ERROR(
      store_
          ->Read(KeyOf(u, part, committed_),
                 {staging_.data(), static_cast<size_t>(units_[u].bytes[static_cast<int>(part)])})
          .status());
  return static_cast<const void*>(staging_.data());
}

void SwappedBase::BeginRestore() {
  DropReads();
  restoring_ = committed_ + 1;
}

absl::Status SwappedBase::WriteBuffer(const std::string& name, const void* data, int64_t bytes) {
  if (restoring_ == 0) return absl::FailedPreconditionError("swapped base: no restore begun");
  ZT_ASSIGN_OR_RETURN(const auto found, Find(name));
  const auto [u, part] = found;
  if (bytes != units_[u].bytes[static_cast<int>(part)]) {
    return absl::InvalidArgumentError(absl::StrCat("swapped base: restoring ", name, " from ",
                                                   bytes, " bytes; it holds ",
                                                   units_[u].bytes[static_cast<int>(part)]));
  }
  return store_->Write(KeyOf(u, part, restoring_),
                       {static_cast<const std::byte*>(data), static_cast<size_t>(bytes)});
}

absl::Status SwappedBase::FinishRestore() {
  if (restoring_ == 0) return absl::FailedPreconditionError("swapped base: no restore begun");
  const uint64_t generation = std::exchange(restoring_, 0);
  if (absl::Status s = store_->Commit(job_, generation); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("offload.nvme_path '", store_->path(),
                                               "': committing the restored frozen base failed: ",
                                               s.message()));
  }
  committed_ = generation;
  return absl::OkStatus();
}

std::map<std::string, int64_t> SwappedBase::SwappedBuffers() const {
  std::map<std::string, int64_t> out;
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    for (int p = 0; p < kParts; ++p) {
      if (units_[u].bytes[p] > 0) out[NameOf(u, static_cast<Part>(p))] = units_[u].bytes[p];
    }
  }
  return out;
}

SwappedBase::Stats SwappedBase::stats() const {
  Stats s = stats_;
  const offload::CopyQueueStats q = queue_->stats();
  s.swap_bytes_in = static_cast<int64_t>(q.bytes_in);
  s.swap_seconds_in = q.seconds_in;
  return s;
}

}  // namespace zt
