#include "offload/copy_queue.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/offload/offload_test_util.h"

namespace zt::offload {
namespace {

using testing::GateEnv;
using ::testing::HasSubstr;
using testing::Pattern;
using testing::TempDir;

SwapKey Key(uint32_t unit, uint64_t generation) {
  return {.job = "job-q",
          .unit = unit,
          .range_begin = 0,
          .range_end = 4096,
          .role = SwapRole::kMomentum,
          .generation = generation};
}

class CopyQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = SwapStore::Open(
        {.path = dir_.path(), .file_size = 8 << 20, .queue_depth = 8, .block_size = 65536});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    auto queue = CopyQueue::Create(store_.get(), {.buffer_count = 3, .buffer_size = 100000});
    ASSERT_TRUE(queue.ok()) << queue.status();
    queue_ = std::move(*queue);
  }
  TempDir dir_;
  std::unique_ptr<SwapStore> store_;
  std::unique_ptr<CopyQueue> queue_;
};

TEST_F(CopyQueueTest, WriteBehindThenReadAheadRoundTripsMoreUnitsThanTheRingHolds) {
  constexpr int kUnits = 12;  // four times the ring
  std::vector<CopyHandle> outs;
  for (int u = 0; u < kUnits; ++u) {
    std::vector<std::byte> src = Pattern(60000 + 1000 * u, u);
    outs.push_back(queue_->SwapOut(Key(u, 1), src));
    // The source is free once SwapOut returns: scribbling on it changes nothing stored.
    std::fill(src.begin(), src.end(), std::byte{0});
  }
  CopyHandle commit = queue_->Commit("job-q", 1);
  ASSERT_TRUE(commit.Wait().ok()) << commit.Wait();
  for (int u = 0; u < kUnits; ++u) {
    ASSERT_TRUE(outs[u].done());  // queued before the commit, so done before it
    EXPECT_TRUE(outs[u].Wait().ok()) << outs[u].Wait();
    EXPECT_EQ(outs[u].bytes(), size_t(60000 + 1000 * u));
  }
  EXPECT_EQ(store_->CommittedGeneration("job-q"), 1u);

  // Read-ahead: every swap-in queued before the first is waited for.
  std::vector<std::vector<std::byte>> dst(kUnits, std::vector<std::byte>(100000));
  std::vector<CopyHandle> ins;
  for (int u = 0; u < kUnits; ++u) ins.push_back(queue_->SwapIn(Key(u, 1), absl::MakeSpan(dst[u])));
  for (int u = 0; u < kUnits; ++u) {
    ASSERT_TRUE(ins[u].Wait().ok()) << ins[u].Wait();
    dst[u].resize(ins[u].bytes());
    EXPECT_EQ(dst[u], Pattern(60000 + 1000 * u, u)) << "unit " << u;
  }
  EXPECT_TRUE(queue_->Drain().ok());
  EXPECT_EQ(queue_->pool().leased(), 0u);
  const CopyQueueStats stats = queue_->stats();
  EXPECT_EQ(stats.bytes_out, stats.bytes_in);
  EXPECT_EQ(stats.bytes_out, uint64_t{kUnits * 60000 + 1000 * (kUnits - 1) * kUnits / 2});
}

TEST_F(CopyQueueTest, ErrorsReachTheHandleAndDrain) {
  std::vector<std::byte> big(queue_->pool().buffer_size() + 1);  // 100000 rounded to pages, + 1
  CopyHandle too_big = queue_->SwapOut(Key(0, 1), big);
  const absl::Status refused = too_big.Wait();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("buffer_size 102400"));

  std::vector<std::byte> dst(100000);
  CopyHandle missing = queue_->SwapIn(Key(7, 1), absl::MakeSpan(dst));
  CopyHandle after = queue_->SwapOut(Key(1, 1), Pattern(10, 1));
  absl::Status drained = queue_->Drain();
  EXPECT_EQ(drained.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(drained.message(), HasSubstr(SwapKeyText(Key(7, 1))));
  EXPECT_EQ(missing.Wait().code(), absl::StatusCode::kNotFound);
  // One failure does not stop the queue.
  EXPECT_TRUE(after.Wait().ok());
  EXPECT_TRUE(queue_->Drain().ok());  // the error was reported once
}

// A commit queued behind its generation's writes, the caller not waiting for them (the NVMe
// step's commit behind the next step's compute): a failed write keeps the generation from
// being committed, and a whole one is committed.
TEST_F(CopyQueueTest, CommitBehindWritesCommitsNothingWhenOneFailed) {
  std::vector<CopyHandle> writes;
  writes.push_back(queue_->SwapOut(Key(0, 1), Pattern(5000, 0)));
  const std::vector<std::byte> big(queue_->pool().buffer_size() + 1);
  writes.push_back(queue_->SwapOut(Key(1, 1), big));  // refused: larger than a ring buffer
  writes.push_back(queue_->SwapOut(Key(2, 1), Pattern(6000, 2)));
  CopyHandle torn = queue_->Commit("job-q", 1, writes);
  const absl::Status refused = torn.Wait();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("generation 1 of job-q not committed"));
  EXPECT_EQ(store_->CommittedGeneration("job-q"), 0u);
  // The refused write queued nothing; the two others are counted where they were queued.
  EXPECT_EQ(queue_->stats().bytes_out_queued, 11000u);
  queue_->Drain().IgnoreError();

  // The staged generation, written again whole, commits.
  std::vector<CopyHandle> whole;
  for (int u = 0; u < 3; ++u) whole.push_back(queue_->SwapOut(Key(u, 1), Pattern(4000, u)));
  EXPECT_EQ(queue_->stats().bytes_out_queued, 23000u) << "counted before the worker writes";
  const absl::Status committed = queue_->Commit("job-q", 1, whole).Wait();
  ASSERT_TRUE(committed.ok()) << committed;
  EXPECT_EQ(store_->CommittedGeneration("job-q"), 1u);
  EXPECT_EQ(queue_->stats().bytes_out, 23000u);
}

TEST_F(CopyQueueTest, DestructorFinishesWhatIsQueued) {
  std::vector<CopyHandle> outs;
  for (int u = 0; u < 6; ++u) outs.push_back(queue_->SwapOut(Key(u, 1), Pattern(50000, u)));
  CopyHandle commit = queue_->Commit("job-q", 1);
  queue_.reset();
  EXPECT_TRUE(commit.done());
  EXPECT_TRUE(commit.Wait().ok());
  EXPECT_EQ(store_->CommittedGeneration("job-q"), 1u);
}

// In place: the caller's ring buffer is written from and read into directly; a swapped-out
// buffer goes back to the ring once written, and TryAcquireBuffer says when none is free.
TEST_F(CopyQueueTest, InPlaceTransfersUseTheCallersRingBuffers) {
  PinnedLease out = queue_->AcquireBuffer();
  const std::vector<std::byte> a = Pattern(5000, 1), b = Pattern(7000, 2);
  std::copy(a.begin(), a.end(), out.data());
  std::copy(b.begin(), b.end(), out.data() + 8192);
  PinnedLease second = queue_->AcquireBuffer();
  PinnedLease third = queue_->AcquireBuffer();
  EXPECT_EQ(queue_->TryAcquireBuffer().status().code(), absl::StatusCode::kResourceExhausted);
  CopyHandle written = queue_->SwapOutPlace({{.key = Key(0, 1), .offset = 0, .length = 5000},
                                             {.key = Key(1, 1), .offset = 8192, .length = 7000}},
                                            std::move(out));
  ASSERT_TRUE(written.Wait().ok()) << written.Wait();
  EXPECT_EQ(written.bytes(), 12000u);
  ASSERT_TRUE(queue_->Commit("job-q", 1).Wait().ok());
  // The written buffer is the ring's again.
  absl::StatusOr<PinnedLease> in = queue_->TryAcquireBuffer();
  ASSERT_TRUE(in.ok()) << in.status();
  std::fill(in->data(), in->data() + in->size(), std::byte{0});
  CopyHandle read = queue_->SwapInPlace({{.key = Key(1, 1), .offset = 4096, .length = 7000},
                                         {.key = Key(0, 1), .offset = 16384, .length = 5000}},
                                        *in);
  ASSERT_TRUE(read.Wait().ok()) << read.Wait();
  EXPECT_EQ(read.bytes(), 12000u);
  EXPECT_TRUE(std::equal(b.begin(), b.end(), in->data() + 4096));
  EXPECT_TRUE(std::equal(a.begin(), a.end(), in->data() + 16384));
  EXPECT_EQ(queue_->stats().bytes_in, 12000u);
  // A length that is not the extent's, or bytes outside the buffer, are refused.
  CopyHandle wrong = queue_->SwapInPlace({{.key = Key(0, 1), .offset = 0, .length = 4000}}, *in);
  EXPECT_EQ(wrong.Wait().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(wrong.Wait().message()), HasSubstr("holds 5000 bytes"));
  CopyHandle outside =
      queue_->SwapInPlace({{.key = Key(0, 1), .offset = in->size() - 100, .length = 5000}}, *in);
  EXPECT_EQ(outside.Wait().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(outside.Wait().message()), HasSubstr("outside the ring buffer"));
  queue_->Drain().IgnoreError();
}

// A store whose transfers of one kind wait at a gate (GateEnv), and a queue on it.
struct GatedQueue {
  explicit GatedQueue(IoOp::Kind held) : env(held, absl::Seconds(30)) {}
  absl::Status Open() {
    auto opened = SwapStore::Open({.path = dir.path(),
                                   .file_size = 8 << 20,
                                   .queue_depth = 8,
                                   .block_size = 65536,
                                   .env = &env});
    if (!opened.ok()) return opened.status();
    store = std::move(*opened);
    auto created = CopyQueue::Create(store.get(), {.buffer_count = 4, .buffer_size = 100000});
    if (!created.ok()) return created.status();
    queue = std::move(*created);
    return absl::OkStatus();
  }
  TempDir dir;
  GateEnv env;
  std::unique_ptr<SwapStore> store;
  std::unique_ptr<CopyQueue> queue;  // last: destroyed first
};

// The read lane passes the write lane: a swap-in of another slot finishes while a swap-out is
// held at the gate, and a swap-in of the held write's slot waits for it and reads its bytes.
TEST(CopyQueueLanesTest, ReadsPassWritesOfOtherSlotsAndWaitForTheirOwn) {
  GatedQueue gated(IoOp::Kind::kWrite);
  ASSERT_TRUE(gated.Open().ok());
  CopyQueue& q = *gated.queue;
  GateEnv& env = gated.env;
  const std::vector<std::byte> a = Pattern(4096, 1), b = Pattern(4096, 2);
  ASSERT_TRUE(q.SwapOut(Key(0, 1), a).Wait().ok());
  ASSERT_TRUE(q.Commit("job-q", 1).Wait().ok());
  env.Arm();
  const CopyHandle write = q.SwapOut(Key(1, 2), b);
  ASSERT_TRUE(env.WaitUntilHeld(absl::Seconds(10)));
  std::vector<std::byte> other(4096), own(4096);
  const CopyHandle read_other = q.SwapIn(Key(0, 1), absl::MakeSpan(other));
  const CopyHandle read_own = q.SwapIn(Key(1, 2), absl::MakeSpan(own));
  EXPECT_TRUE(read_other.Wait().ok());  // while the write is held
  EXPECT_TRUE(other == a);
  EXPECT_FALSE(write.done());
  EXPECT_FALSE(read_own.done()) << "a swap-in ran before the swap-out of its slot";
  env.Release();
  EXPECT_TRUE(write.Wait().ok());
  ASSERT_TRUE(read_own.Wait().ok());
  EXPECT_TRUE(own == b);
  EXPECT_TRUE(q.Drain().ok());
}

// A commit waits for the swap-ins queued before it: a read still waiting in the read lane when
// the next generation's commit is queued reads the generation it asked for (the commit would
// drop it: NotFound). The first read is held at the gate, the second waits behind it.
TEST(CopyQueueLanesTest, ACommitWaitsForTheReadsQueuedBeforeIt) {
  GatedQueue gated(IoOp::Kind::kRead);
  ASSERT_TRUE(gated.Open().ok());
  CopyQueue& q = *gated.queue;
  GateEnv& env = gated.env;
  const std::vector<std::byte> a = Pattern(4096, 1), b = Pattern(4096, 2);
  ASSERT_TRUE(q.SwapOut(Key(0, 1), a).Wait().ok());
  ASSERT_TRUE(q.SwapOut(Key(1, 1), b).Wait().ok());
  ASSERT_TRUE(q.Commit("job-q", 1).Wait().ok());
  env.Arm();
  std::vector<std::byte> got_a(4096), got_b(4096);
  const CopyHandle read_a = q.SwapIn(Key(0, 1), absl::MakeSpan(got_a));
  ASSERT_TRUE(env.WaitUntilHeld(absl::Seconds(10)));
  const CopyHandle read_b = q.SwapIn(Key(1, 1), absl::MakeSpan(got_b));
  const CopyHandle write = q.SwapOut(Key(1, 2), Pattern(4096, 3));
  const CopyHandle commit = q.Commit("job-q", 2, {write});
  EXPECT_TRUE(write.Wait().ok());  // the write lane moves on to the commit, which waits
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(commit.done()) << "the commit ran before the reads queued ahead of it";
  env.Release();
  ASSERT_TRUE(read_a.Wait().ok());
  ASSERT_TRUE(read_b.Wait().ok()) << read_b.Wait();
  EXPECT_TRUE(got_a == a);
  EXPECT_TRUE(got_b == b);
  EXPECT_TRUE(commit.Wait().ok());
  EXPECT_EQ(gated.store->CommittedGeneration("job-q"), 2u);
  EXPECT_TRUE(q.Drain().ok());
}

}  // namespace
}  // namespace zt::offload
