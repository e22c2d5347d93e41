#include "offload/pinned_pool.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace zt::offload {

void WarnToStderr(absl::string_view line) {
  std::fprintf(stderr, "zerotrain offload: warning: %.*s\n", static_cast<int>(line.size()),
               line.data());
}

namespace {

std::string MemlockLimitText() {
  rlimit lim{};
  if (getrlimit(RLIMIT_MEMLOCK, &lim) != 0) return "unknown";
  if (lim.rlim_cur == RLIM_INFINITY) return "unlimited";
  return absl::StrCat(lim.rlim_cur, " bytes");
}

}  // namespace

MlockAllocator::MlockAllocator()
    : MlockAllocator([](void* addr, size_t len) { return mlock(addr, len) == 0 ? 0 : errno; }) {}

MlockAllocator::MlockAllocator(LockFn lock) : lock_(std::move(lock)) {}

absl::StatusOr<HostRegion> MlockAllocator::Allocate(size_t size, const WarningSink& warn) {
  // mmap, not malloc: page-aligned, and returned to the system whole at Free.
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "pinned host pool: cannot map ", size, " bytes of host memory: ", std::strerror(errno)));
  }
  HostRegion region{.data = static_cast<std::byte*>(p), .size = size, .pinned = true};
  if (const int err = lock_(p, size); err != 0) {
    region.pinned = false;
    // Swapping still works from pageable memory, only slower (the kernel bounces DMA), so
    // this is a warning and not an error.
    warn(absl::StrCat("pinned host pool: cannot page-lock ", size, " bytes (mlock: ",
                      std::strerror(err), "; RLIMIT_MEMLOCK is ", MemlockLimitText(),
                      "): using pageable memory instead; raise `ulimit -l` or grant "
                      "CAP_IPC_LOCK to pin it"));
  }
  return region;
}

void MlockAllocator::Free(const HostRegion& region) {
  if (region.data == nullptr) return;
  // munmap unlocks as well.
  munmap(region.data, region.size);
}

absl::StatusOr<HostRegion> BorrowedRegionAllocator::Allocate(size_t size, const WarningSink&) {
  if (size > size_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host pool: asks ", size, " bytes of a borrowed region of ", size_));
  }
  return HostRegion{.data = data_, .size = size, .pinned = false};
}

absl::StatusOr<HostRegion> PageableAllocator::Allocate(size_t size, const WarningSink&) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "host pool: cannot map ", size, " bytes of host memory: ", std::strerror(errno)));
  }
  return HostRegion{.data = static_cast<std::byte*>(p), .size = size, .pinned = false};
}

void PageableAllocator::Free(const HostRegion& region) {
  if (region.data != nullptr) munmap(region.data, region.size);
}

PinnedLease::PinnedLease(PinnedLease&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      index_(other.index_),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

PinnedLease& PinnedLease::operator=(PinnedLease&& other) noexcept {
  if (this != &other) {
    Release();
    pool_ = std::exchange(other.pool_, nullptr);
    index_ = other.index_;
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

PinnedLease::~PinnedLease() { Release(); }

void PinnedLease::Release() {
  if (pool_ == nullptr) return;
  std::exchange(pool_, nullptr)->Return(index_);
  data_ = nullptr;
  size_ = 0;
}

absl::StatusOr<std::unique_ptr<PinnedPool>> PinnedPool::Create(PinnedPoolOptions options) {
  if (options.buffer_count == 0) {
    return absl::InvalidArgumentError("pinned host pool: buffer_count must be > 0 (got 0)");
  }
  if (options.buffer_size == 0) {
    return absl::InvalidArgumentError("pinned host pool: buffer_size must be > 0 (got 0)");
  }
  const size_t size = (options.buffer_size + kHostBufferAlignment - 1) / kHostBufferAlignment *
                      kHostBufferAlignment;
  if (size > std::numeric_limits<size_t>::max() / options.buffer_count) {
    return absl::InvalidArgumentError(absl::StrCat("pinned host pool: buffer_count ",
                                                   options.buffer_count, " x buffer_size ", size,
                                                   " overflows the address space"));
  }
  std::unique_ptr<HostAllocator> owned;
  HostAllocator* allocator = options.allocator;
  if (allocator == nullptr) {
    owned = std::make_unique<MlockAllocator>();
    allocator = owned.get();
  }
  const WarningSink warn = options.warn ? options.warn : WarningSink(WarnToStderr);
  auto region = allocator->Allocate(size * options.buffer_count, warn);
  if (!region.ok()) return region.status();
  return std::unique_ptr<PinnedPool>(
      new PinnedPool(options.buffer_count, size, *region, allocator, std::move(owned)));
}

PinnedPool::PinnedPool(size_t count, size_t size, HostRegion region, HostAllocator* allocator,
                       std::unique_ptr<HostAllocator> owned_allocator)
    : buffer_count_(count),
      buffer_size_(size),
      region_(region),
      allocator_(allocator),
      owned_allocator_(std::move(owned_allocator)) {
  free_.reserve(count);
  // Reversed so that the first Acquire hands out buffer 0.
  for (size_t i = count; i > 0; --i) free_.push_back(i - 1);
}

PinnedPool::~PinnedPool() { allocator_->Free(region_); }

PinnedLease PinnedPool::TakeLocked() {
  const size_t index = free_.back();
  free_.pop_back();
  return PinnedLease(this, index, region_.data + index * buffer_size_, buffer_size_);
}

PinnedLease PinnedPool::Acquire() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](std::vector<size_t>* free) { return !free->empty(); }, &free_));
  return TakeLocked();
}

absl::StatusOr<PinnedLease> PinnedPool::TryAcquire() {
  absl::MutexLock lock(&mu_);
  if (free_.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat("pinned host pool: all ", buffer_count_,
                                                     " buffers of ", buffer_size_,
                                                     " bytes are leased"));
  }
  return TakeLocked();
}

size_t PinnedPool::leased() const {
  absl::MutexLock lock(&mu_);
  return buffer_count_ - free_.size();
}

void PinnedPool::Return(size_t index) {
  absl::MutexLock lock(&mu_);
  free_.push_back(index);
}

}  // namespace zt::offload
