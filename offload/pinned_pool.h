// The pinned host pool: one region of host memory, sized up front and page-locked, handed out
// as fixed-size buffers. Page-locked memory is what DMA engines (NVMe, a GPU's copy engine)
// read and write without a bounce, so every byte that moves between tiers passes through it.
//
// Where the memory cannot be locked (RLIMIT_MEMLOCK is 8 MiB for non-root users on a stock
// Debian machine) the pool falls back to pageable memory with ONE warning that names the limit
// and the bytes asked; `pinned()` says which the pool got. The CUDA backend later supplies its
// own `HostAllocator` (cudaHostAlloc) through the same seam.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace zt::offload {

// Where warnings go (the library has no logger): one line each, no trailing newline.
using WarningSink = std::function<void(absl::string_view)>;
// Writes "zerotrain offload: warning: <line>" to stderr.
void WarnToStderr(absl::string_view line);

// Alignment of every pool buffer: a page, which O_DIRECT and DMA both accept.
inline constexpr size_t kHostBufferAlignment = 4096;

// One allocation of host memory.
struct HostRegion {
  std::byte* data = nullptr;
  size_t size = 0;
  bool pinned = false;  // page-locked (DMA-able without a bounce)
};

// Supplies and frees the pool's one region. Implementations need not be thread-safe: the pool
// calls Allocate once at creation and Free once at destruction.
class HostAllocator {
 public:
  virtual ~HostAllocator() = default;
  // `size` bytes aligned to kHostBufferAlignment. ResourceExhausted when the memory is not
  // there. A region that could not be locked comes back with pinned = false, and the allocator
  // reports why through `warn` (once).
  virtual absl::StatusOr<HostRegion> Allocate(size_t size, const WarningSink& warn) = 0;
  virtual void Free(const HostRegion& region) = 0;
};

// Page-aligned memory locked with mlock(2). When mlock fails (RLIMIT_MEMLOCK too low, no
// CAP_IPC_LOCK) the memory stays pageable and one warning names the limit and the bytes asked.
class MlockAllocator : public HostAllocator {
 public:
  // The locking call, a seam so tests can refuse it as an unprivileged user's limit would.
  using LockFn = std::function<int(void* addr, size_t len)>;  // 0, or an errno
  MlockAllocator();
  explicit MlockAllocator(LockFn lock);

  absl::StatusOr<HostRegion> Allocate(size_t size, const WarningSink& warn) override;
  void Free(const HostRegion& region) override;

 private:
  LockFn lock_;
};

// Page-aligned pageable memory (pinned = false), never locked and never warned about: the pool
// of a job that asked for no page-locking (offload.pin_memory false, DeepSpeed's default).
class PageableAllocator : public HostAllocator {
 public:
  absl::StatusOr<HostRegion> Allocate(size_t size, const WarningSink& warn) override;
  void Free(const HostRegion& region) override;
};

// A region the caller owns and keeps alive (an arena's pinned buffers the memory plan holds),
// handed to the pool as it is: Allocate asks no memory of the system and Free frees nothing.
// ResourceExhausted when the pool asks more than the region.
class BorrowedRegionAllocator : public HostAllocator {
 public:
  BorrowedRegionAllocator(std::byte* data, size_t size) : data_(data), size_(size) {}
  absl::StatusOr<HostRegion> Allocate(size_t size, const WarningSink& warn) override;
  void Free(const HostRegion&) override {}

 private:
  std::byte* const data_;
  const size_t size_;
};

struct PinnedPoolOptions {
  size_t buffer_count = 0;  // > 0
  size_t buffer_size = 0;   // > 0; rounded up to kHostBufferAlignment
  // Not owned; must outlive the pool. nullptr: an MlockAllocator owned by the pool.
  HostAllocator* allocator = nullptr;
  WarningSink warn = WarnToStderr;
};

class PinnedPool;

// One buffer of the pool, held until the lease is destroyed or moved from. Move-only. A lease
// must not outlive its pool. Not thread-safe itself; leases of one pool may live on any threads.
class PinnedLease {
 public:
  PinnedLease() = default;
  PinnedLease(PinnedLease&& other) noexcept;
  PinnedLease& operator=(PinnedLease&& other) noexcept;
  PinnedLease(const PinnedLease&) = delete;
  PinnedLease& operator=(const PinnedLease&) = delete;
  ~PinnedLease();

  bool valid() const { return pool_ != nullptr; }
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  absl::Span<std::byte> span() const { return {data_, size_}; }
  size_t index() const { return index_; }  // which buffer of the pool, 0..buffer_count-1
  // Returns the buffer to the pool now (what the destructor does).
  void Release();

 private:
  friend class PinnedPool;
  PinnedLease(PinnedPool* pool, size_t index, std::byte* data, size_t size)
      : pool_(pool), index_(index), data_(data), size_(size) {}
  PinnedPool* pool_ = nullptr;
  size_t index_ = 0;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// Thread-safe: Acquire/TryAcquire/release from any threads. Owns its region (through its
// allocator) and frees it at destruction, when every lease must have been released.
class PinnedPool {
 public:
  // InvalidArgument naming the field for a zero count or size or an overflowing product;
  // ResourceExhausted when the host memory cannot be had.
  static absl::StatusOr<std::unique_ptr<PinnedPool>> Create(PinnedPoolOptions options);
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // A free buffer, waiting for one when all are leased.
  PinnedLease Acquire();
  // A free buffer, or ResourceExhausted naming the pool's size when all are leased.
  absl::StatusOr<PinnedLease> TryAcquire();

  bool pinned() const { return region_.pinned; }
  size_t buffer_count() const { return buffer_count_; }
  size_t buffer_size() const { return buffer_size_; }
  size_t leased() const;  // buffers out now

 private:
  friend class PinnedLease;
  PinnedPool(size_t count, size_t size, HostRegion region, HostAllocator* allocator,
             std::unique_ptr<HostAllocator> owned_allocator);
  PinnedLease TakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Return(size_t index);

  const size_t buffer_count_;
  const size_t buffer_size_;
  const HostRegion region_;
  HostAllocator* const allocator_;
  const std::unique_ptr<HostAllocator> owned_allocator_;
  mutable absl::Mutex mu_;
  std::vector<size_t> free_ ABSL_GUARDED_BY(mu_);  // indices of free buffers, a stack
};

}  // namespace zt::offload
