// Asynchronous swap-in and swap-out between callers' memory and the swap store, through a
// bounded ring of pinned buffers: write-behind (SwapOut returns once the bytes are in a ring
// buffer; the write lane's thread writes them to the store) and read-ahead (SwapIn queued ahead
// of use; the read lane's thread reads into a ring buffer and copies out). Each call returns a
// CopyHandle whose Wait gives the transfer's status.
//
// Two lanes, each a thread running its tasks in the order they were queued, side by side (the
// store moves a read and a write at once, SwapStore's io_lanes): the write lane runs swap-outs
// and commits, so a Commit queued after a generation's SwapOuts makes exactly those durable;
// the read lane runs swap-ins, and a swap-in waits only for the swap-outs queued before it of
// the same slot (job, unit, range, role), so it reads what they wrote while other writes move.
// A commit waits for the swap-ins queued before it, so they read the generations the store
// held when they were queued (a commit drops the generation it replaces).
//
// The ring bounds memory: a SwapOut or SwapIn takes its ring buffer on the caller's thread,
// waiting while all `buffer_count` are taken by queued transfers (which the lanes are always
// able to finish, since they never wait for a buffer themselves, and the read lane waits only
// for writes the write lane runs without waiting for reads). A transfer must fit in one buffer:
// buffer_size is sized to the largest unit shard (DeepSpeed's buffer_size rule).
//
// In place: a caller that works on the bytes where they land (the optimizer step of swapped
// states) holds ring buffers itself (AcquireBuffer), has extents read into them (SwapInPlace)
// and hands them back with their writes (SwapOutPlace: the buffer returns to the ring once the
// store has the bytes), so nothing is copied between the ring and other memory. A caller that
// holds buffers must not wait in AcquireBuffer unless queued SwapOuts will free enough: it
// takes read-ahead buffers with TryAcquireBuffer.
//
// Thread-safe: calls from any threads. Owns its pool and worker; does not own the store, which
// must outlive it. The destructor finishes everything queued.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "offload/pinned_pool.h"
#include "offload/swap_store.h"

namespace zt::offload {

// The completion of one queued transfer or commit. Copyable; all copies see the same result.
class CopyHandle {
 public:
  CopyHandle() = default;
  // Blocks until the transfer finished; its status. An empty handle returns OK.
  absl::Status Wait() const;
  bool done() const;
  // Bytes moved, once done.
  size_t bytes() const;

 private:
  friend class CopyQueue;
  struct State {
    mutable absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::Status status ABSL_GUARDED_BY(mu);
    size_t bytes ABSL_GUARDED_BY(mu) = 0;
  };
  explicit CopyHandle(std::shared_ptr<State> state) : state_(std::move(state)) {}
  static CopyHandle Finished(absl::Status status);
  void Complete(absl::Status status, size_t bytes) const;
  std::shared_ptr<State> state_;
};

struct CopyQueueOptions {
  size_t buffer_count = 4;               // ring buffers, > 0
  size_t buffer_size = size_t{1} << 24;  // bytes each, >= the largest transfer
  HostAllocator* allocator = nullptr;    // not owned; nullptr: mlock'd host memory
  WarningSink warn = WarnToStderr;
};

struct CopyQueueStats {
  uint64_t bytes_out = 0;  // swapped out (written to the store)
  // Queued for swapping out, when queued: a writer that does not wait for its writes (the NVMe
  // step's commit behind the next step's compute) counts its bytes where it queued them.
  uint64_t bytes_out_queued = 0;
  uint64_t bytes_in = 0;   // swapped in (read from the store)
  double seconds_out = 0;  // the write lane's time in store writes and commits
  double seconds_in = 0;   // the read lane's in store reads (the two overlap)
};

class CopyQueue {
 public:
  // `store` is not owned and must outlive the queue. Errors as PinnedPool::Create's.
  static absl::StatusOr<std::unique_ptr<CopyQueue>> Create(SwapStore* store,
                                                           CopyQueueOptions options);
  ~CopyQueue();
  CopyQueue(const CopyQueue&) = delete;
  CopyQueue& operator=(const CopyQueue&) = delete;

  // Copies `src` into a ring buffer (waiting for one) and queues its write as `key`. `src` may
  // be reused when this returns. The handle fails with InvalidArgument when `src` exceeds
  // buffer_size, or with the store's error.
  CopyHandle SwapOut(const SwapKey& key, absl::Span<const std::byte> src);
  // Queues the read of `key` into `dst`, which must stay valid until the handle is done and
  // hold the extent. Queue it ahead of use: that is the read-ahead.
  CopyHandle SwapIn(const SwapKey& key, absl::Span<std::byte> dst);
  // A ring buffer for the caller to use in place, waiting for one.
  PinnedLease AcquireBuffer();
  // ... or ResourceExhausted when all are taken.
  absl::StatusOr<PinnedLease> TryAcquireBuffer();
  // One extent at bytes [offset, offset + length) of a caller's ring buffer.
  struct BufferExtent {
    SwapKey key;
    size_t offset = 0;
    size_t length = 0;
  };
  // Queues the reads of `extents` into `lease`'s buffer, which the caller keeps and must not
  // touch in those bytes until the handle is done. InvalidArgument when an extent lies outside
  // the buffer or its stored length differs from `length`; the store's errors as they come.
  CopyHandle SwapInPlace(std::vector<BufferExtent> extents, const PinnedLease& lease);
  // Queues the writes of `extents` from `lease`'s buffer (taken over), which goes back to the
  // ring once they are done (or failed).
  CopyHandle SwapOutPlace(std::vector<BufferExtent> extents, PinnedLease lease);
  // Queues SwapStore::Commit(job, generation) after everything queued before it, swap-ins
  // included. When any of
  // `writes` (the generation's, queued before it, so done when it runs) failed, it commits
  // nothing and fails with that error: a caller may queue the commit behind its writes and go
  // on without waiting, and a torn generation is still never committed.
  CopyHandle Commit(const std::string& job, uint64_t generation,
                    std::vector<CopyHandle> writes = {});
  // Waits until everything queued so far is done; the first error among what finished since
  // the last Drain, or OK.
  absl::Status Drain();

  const PinnedPool& pool() const { return *pool_; }
  CopyQueueStats stats() const;

 private:
  // (job, unit, range_begin, range_end, role): what a swap-in waits for swap-outs of.
  using Slot = std::tuple<std::string, uint32_t, uint64_t, uint64_t, uint8_t>;
  static Slot SlotOf(const SwapKey& key);
  struct Task {
    std::function<absl::StatusOr<size_t>()> run;
    CopyHandle handle;
    bool swap_in = false;
    std::vector<Slot> slots;        // a swap-out's: the slots it writes
    uint64_t sequence = 0;          // a swap-out's place in the write lane
    // What it waits for first: a swap-in's, the swap-outs of its slots queued before it; a
    // commit's, the swap-ins queued before it.
    std::vector<CopyHandle> after;
  };
  struct Lane {
    std::deque<Task> queue;
    bool running = false;
  };
  CopyQueue(SwapStore* store, std::unique_ptr<PinnedPool> pool);
  // Queues `run` on the read lane (`swap_in`) or the write lane. `slots`: the slots a swap-out
  // writes, or a swap-in reads. `queued_out`: the bytes a swap-out queues
  // (CopyQueueStats::bytes_out_queued).
  // `after_reads`: a commit, which waits for the swap-ins queued before it.
  CopyHandle Enqueue(std::function<absl::StatusOr<size_t>()> run, bool swap_in,
                     std::vector<Slot> slots, size_t queued_out = 0, bool after_reads = false);
  void LaneLoop(bool swap_in);

  SwapStore* const store_;
  const std::unique_ptr<PinnedPool> pool_;
  mutable absl::Mutex mu_;
  Lane read_lane_ ABSL_GUARDED_BY(mu_);
  Lane write_lane_ ABSL_GUARDED_BY(mu_);
  // The last swap-out queued of each slot, not yet done: (its sequence, its handle).
  std::map<Slot, std::pair<uint64_t, CopyHandle>> last_write_ ABSL_GUARDED_BY(mu_);
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  // The swap-ins queued and maybe not done (the done ones are dropped as new ones come).
  std::vector<CopyHandle> reads_queued_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  CopyQueueStats stats_ ABSL_GUARDED_BY(mu_);
  // Last: they start after the members they read.
  std::thread read_worker_;
  std::thread write_worker_;
};

}  // namespace zt::offload
