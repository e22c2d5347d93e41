#include "worker/shard/prefetch_coordinator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"

namespace zt {

PrefetchCoordinator::PrefetchCoordinator(UnitRegistry* registry, std::vector<Tensor> pool,
                                         std::vector<Tensor> dedicated, int prefetch,
                                         GatherFn gather)
    : registry_(registry),
      pool_(std::move(pool)),
      pool_free_(pool_.size(), true),
      pool_slot_of_(dedicated.size(), -1),
      dedicated_(std::move(dedicated)),
      prefetch_(std::max(0, prefetch)),
      gather_(std::move(gather)) {}

void PrefetchCoordinator::Begin(std::vector<UnitUse> uses) {
  uses_ = std::move(uses);
  issued_through_ = -1;
  read_through_ = -1;
  // Which uses gather: the pass starts with every unit sharded (End released them), and a
  // unit stays held after a use that does not release it, so its next use gathers nothing.
  gathers_.assign(uses_.size(), false);
  std::vector<bool> held(pool_slot_of_.size(), false);
  for (size_t j = 0; j < uses_.size(); ++j) {
    const int unit = uses_[j].unit;
    gathers_[j] = !held[unit];
    held[unit] = !uses_[j].release_after;
  }
}

absl::Status PrefetchCoordinator::Issue(int unit) {
  if (registry_->state(unit) != Residency::kSharded) return absl::OkStatus();
  Tensor buffer = dedicated_[unit];
  if (buffer.empty()) {
    auto free = std::find(pool_free_.begin(), pool_free_.end(), true);
    if (free == pool_free_.end()) {
      return absl::InternalError(absl::StrCat("prefetch: no free gather buffer for unit ", unit,
                                              " (", pool_.size(), " buffers, prefetch ", prefetch_,
                                              "): the pass holds more units than it planned"));
    }
    const int slot = static_cast<int>(free - pool_free_.begin());
    pool_free_[slot] = false;
    pool_slot_of_[unit] = slot;
    buffer = pool_[slot];
  }
  ZT_ASSIGN_OR_RETURN(CommHandle handle, gather_(unit, buffer));
  return registry_->BeginGather(unit, buffer, std::move(handle));
}

absl::StatusOr<Tensor> PrefetchCoordinator::Acquire(int i) {
  const int last = std::min<int>(i + prefetch_, static_cast<int>(uses_.size()) - 1);
  for (int j = std::max(issued_through_ + 1, i); j <= last; ++j) {
    ZT_RETURN_IF_ERROR(Issue(uses_[j].unit));
    issued_through_ = j;
  }
  if (read_ahead_) {
    const int read_last =
        std::min<int>(last + std::max(prefetch_, 1), static_cast<int>(uses_.size()) - 1);
    for (int j = std::max(read_through_ + 1, last + 1); j <= read_last; ++j) {
      if (gathers_[j]) read_ahead_(uses_[j].unit);
      read_through_ = j;
    }
  }
  // A unit seen ahead while still held from an earlier use, and released since, gathers now.
  ZT_RETURN_IF_ERROR(Issue(uses_[i].unit));
  return registry_->AwaitGathered(uses_[i].unit);
}

std::vector<Tensor> PrefetchCoordinator::FirstGatherBuffers(const std::vector<int>& units) const {
  std::vector<Tensor> buffers(units.size());
  if (!uses_.empty()) return buffers;
  size_t next_slot = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    const int unit = units[i];
    if (registry_->state(unit) != Residency::kSharded) continue;
    if (!dedicated_[unit].empty()) {
      buffers[i] = dedicated_[unit];
    } else if (next_slot < pool_.size()) {
      buffers[i] = pool_[next_slot++];
    }
  }
  return buffers;
}

absl::Status PrefetchCoordinator::End() {
  absl::Status s = registry_->ReleaseAll();
  std::fill(pool_free_.begin(), pool_free_.end(), true);
  std::fill(pool_slot_of_.begin(), pool_slot_of_.end(), -1);
  uses_.clear();
  gathers_.clear();
  issued_through_ = -1;
  read_through_ = -1;
  return s;
}

absl::Status PrefetchCoordinator::Finish(int i) {
  const int unit = uses_[i].unit;
  if (!uses_[i].release_after) return absl::OkStatus();
  ZT_RETURN_IF_ERROR(registry_->Release(unit));
  if (pool_slot_of_[unit] >= 0) {
    pool_free_[pool_slot_of_[unit]] = true;
    pool_slot_of_[unit] = -1;
  }
  return absl::OkStatus();
}

}  // namespace zt
