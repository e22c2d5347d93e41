#include "offload/pinned_pool.h"

#include <errno.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zt::offload {
namespace {

using ::testing::HasSubstr;

struct Warnings {
  std::vector<std::string> lines;
  WarningSink sink() {
    return [this](absl::string_view line) { lines.emplace_back(line); };
  }
};

TEST(PinnedPoolTest, HandsOutAlignedDistinctBuffersUntilExhausted) {
  Warnings warnings;
  auto pool = PinnedPool::Create({.buffer_count = 3, .buffer_size = 5000, .warn = warnings.sink()});
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ((*pool)->buffer_size(), 8192u);  // rounded up to a page
  std::vector<PinnedLease> leases;
  for (int i = 0; i < 3; ++i) {
    auto lease = (*pool)->TryAcquire();
    ASSERT_TRUE(lease.ok()) << lease.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(lease->data()) % kHostBufferAlignment, 0u);
    lease->span()[0] = std::byte{static_cast<uint8_t>(i)};
    leases.push_back(std::move(*lease));
  }
  EXPECT_NE(leases[0].data(), leases[1].data());
  EXPECT_EQ((*pool)->leased(), 3u);
  auto none = (*pool)->TryAcquire();
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(none.status().message(), HasSubstr("all 3 buffers"));
  leases.pop_back();  // the lease's destructor returns its buffer
  EXPECT_EQ((*pool)->leased(), 2u);
  EXPECT_TRUE((*pool)->TryAcquire().ok());
}

// A pool over memory the caller owns (the memory plan's rings): its buffers are that memory,
// and a pool larger than it is refused.
TEST(PinnedPoolTest, BorrowedRegionIsThePoolsMemory) {
  alignas(kHostBufferAlignment) static std::byte region[2 * kHostBufferAlignment];
  BorrowedRegionAllocator borrowed(region, sizeof(region));
  auto pool = PinnedPool::Create(
      {.buffer_count = 2, .buffer_size = kHostBufferAlignment, .allocator = &borrowed});
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto first = (*pool)->TryAcquire();
  auto second = (*pool)->TryAcquire();
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_GE(std::min(first->data(), second->data()), region);
  EXPECT_LE(std::max(first->data(), second->data()) + kHostBufferAlignment,
            region + sizeof(region));
  BorrowedRegionAllocator small(region, kHostBufferAlignment);
  auto too_big = PinnedPool::Create(
      {.buffer_count = 2, .buffer_size = kHostBufferAlignment, .allocator = &small});
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(PinnedPoolTest, RefusesZeroSizes) {
  EXPECT_THAT(PinnedPool::Create({.buffer_count = 0, .buffer_size = 4096}).status().message(),
              HasSubstr("buffer_count"));
  EXPECT_THAT(PinnedPool::Create({.buffer_count = 1, .buffer_size = 0}).status().message(),
              HasSubstr("buffer_size"));
}

TEST(PinnedPoolTest, AcquireWaitsForARelease) {
  auto pool = PinnedPool::Create({.buffer_count = 1, .buffer_size = 4096});
  ASSERT_TRUE(pool.ok()) << pool.status();
  PinnedLease held = (*pool)->Acquire();
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    PinnedLease lease = (*pool)->Acquire();
    got = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(got.load());
  held.Release();
  waiter.join();
  EXPECT_TRUE(got.load());
  EXPECT_EQ((*pool)->leased(), 0u);
}

TEST(PinnedPoolTest, SmallPoolIsPinned) {
  // 64 KiB is under the 8 MiB RLIMIT_MEMLOCK of an unprivileged user on Debian, so mlock
  // succeeds; a machine that locks less than that tests the fallback only.
  rlimit lim{};
  ASSERT_EQ(getrlimit(RLIMIT_MEMLOCK, &lim), 0);
  if (geteuid() != 0 && lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < (1u << 20)) {
    GTEST_SKIP() << "RLIMIT_MEMLOCK is " << lim.rlim_cur << " bytes, too low to lock 64 KiB "
                 << "beside what this process already locks";
  }
  Warnings warnings;
  auto pool =
      PinnedPool::Create({.buffer_count = 4, .buffer_size = 16384, .warn = warnings.sink()});
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_TRUE((*pool)->pinned());
  EXPECT_TRUE(warnings.lines.empty());
}

TEST(PinnedPoolTest, FallsBackToPageableMemoryWithOneWarningWhenMlockIsRefused) {
  // ENOMEM is what mlock returns past RLIMIT_MEMLOCK without CAP_IPC_LOCK; the tests may run as
  // root, which the limit does not bind, so the refusal comes through the allocator's seam.
  MlockAllocator refusing([](void*, size_t) { return ENOMEM; });
  Warnings warnings;
  auto pool = PinnedPool::Create(
      {.buffer_count = 4, .buffer_size = 1 << 20, .allocator = &refusing, .warn = warnings.sink()});
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_FALSE((*pool)->pinned());
  ASSERT_EQ(warnings.lines.size(), 1u);
  EXPECT_THAT(warnings.lines[0], HasSubstr("RLIMIT_MEMLOCK is "));
  EXPECT_THAT(warnings.lines[0], HasSubstr("4194304 bytes"));  // the bytes asked
  // Pageable buffers work all the same.
  PinnedLease lease = (*pool)->Acquire();
  lease.span()[lease.size() - 1] = std::byte{7};
  EXPECT_EQ(lease.span()[lease.size() - 1], std::byte{7});
}

TEST(PinnedPoolTest, LeasesMoveWithoutDoubleRelease) {
  auto pool = PinnedPool::Create({.buffer_count = 2, .buffer_size = 4096});
  ASSERT_TRUE(pool.ok()) << pool.status();
  PinnedLease a = (*pool)->Acquire();
  PinnedLease b = std::move(a);
  EXPECT_FALSE(a.valid());
  EXPECT_TRUE(b.valid());
  EXPECT_EQ((*pool)->leased(), 1u);
  PinnedLease c = (*pool)->Acquire();
  c = std::move(b);  // c's own buffer goes back
  EXPECT_EQ((*pool)->leased(), 1u);
}

}  // namespace
}  // namespace zt::offload
