#include "offload/copy_queue.h"

#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace zt::offload {

absl::Status CopyHandle::Wait() const {
  if (state_ == nullptr) return absl::OkStatus();
  absl::MutexLock lock(&state_->mu);
  state_->mu.Await(absl::Condition(&state_->done));
  return state_->status;
}

bool CopyHandle::done() const {
  if (state_ == nullptr) return true;
  absl::MutexLock lock(&state_->mu);
  return state_->done;
}

size_t CopyHandle::bytes() const {
  if (state_ == nullptr) return 0;
  absl::MutexLock lock(&state_->mu);
  return state_->bytes;
}

CopyHandle CopyHandle::Finished(absl::Status status) {
  CopyHandle handle(std::make_shared<State>());
  handle.Complete(std::move(status), 0);
  return handle;
}

void CopyHandle::Complete(absl::Status status, size_t bytes) const {
  absl::MutexLock lock(&state_->mu);
  state_->status = std::move(status);
  state_->bytes = bytes;
  state_->done = true;
}

absl::StatusOr<std::unique_ptr<CopyQueue>> CopyQueue::Create(SwapStore* store,
                                                             CopyQueueOptions options) {
  if (store == nullptr) return absl::InvalidArgumentError("copy queue: store must not be null");
  auto pool = PinnedPool::Create({.buffer_count = options.buffer_count,
                                  .buffer_size = options.buffer_size,
                                  .allocator = options.allocator,
                                  .warn = options.warn});
  if (!pool.ok()) return pool.status();
  return std::unique_ptr<CopyQueue>(new CopyQueue(store, std::move(*pool)));
}

CopyQueue::CopyQueue(SwapStore* store, std::unique_ptr<PinnedPool> pool)
    : store_(store),
      pool_(std::move(pool)),
      read_worker_([this] { LaneLoop(/*swap_in=*/true); }),
      write_worker_([this] { LaneLoop(/*swap_in=*/false); }) {}

CopyQueue::~CopyQueue() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  read_worker_.join();
  write_worker_.join();
}

CopyQueue::Slot CopyQueue::SlotOf(const SwapKey& key) {
  return Slot{key.job, key.unit, key.range_begin, key.range_end, static_cast<uint8_t>(key.role)};
}

CopyHandle CopyQueue::Enqueue(std::function<absl::StatusOr<size_t>()> run, bool swap_in,
                              std::vector<Slot> slots, size_t queued_out, bool after_reads) {
  CopyHandle handle(std::make_shared<CopyHandle::State>());
  absl::MutexLock lock(&mu_);
  stats_.bytes_out_queued += queued_out;
  Task task{.run = std::move(run), .handle = handle, .swap_in = swap_in};
  std::erase_if(reads_queued_, [](const CopyHandle& read) { return read.done(); });
  if (after_reads) task.after = reads_queued_;
  if (swap_in) {
    reads_queued_.push_back(handle);
    // What it reads may still be on its way out: it waits for those writes, and only those.
    for (const Slot& slot : slots) {
      if (auto it = last_write_.find(slot); it != last_write_.end()) {
        task.after.push_back(it->second.second);
      }
    }
    read_lane_.queue.push_back(std::move(task));
  } else {
    task.sequence = ++next_sequence_;
    for (const Slot& slot : slots) last_write_[slot] = {task.sequence, handle};
    task.slots = std::move(slots);
    write_lane_.queue.push_back(std::move(task));
  }
  return handle;
}

CopyHandle CopyQueue::SwapOut(const SwapKey& key, absl::Span<const std::byte> src) {
  if (src.size() > pool_->buffer_size()) {
    return CopyHandle::Finished(absl::InvalidArgumentError(
        absl::StrCat("swap-out of ", SwapKeyText(key), ": ", src.size(),
                     " bytes exceed the copy queue's buffer_size ", pool_->buffer_size())));
  }
  // The lease moves into the task, which returns it once the store has the bytes.
  auto lease = std::make_shared<PinnedLease>(pool_->Acquire());
  std::memcpy(lease->data(), src.data(), src.size());
  const size_t n = src.size();
  return Enqueue(
      [this, key, lease, n]() -> absl::StatusOr<size_t> {
        absl::Status s = store_->Write(key, lease->span().subspan(0, n));
        lease->Release();
        if (!s.ok()) return s;
        return n;
      },
      /*swap_in=*/false, {SlotOf(key)}, n);
}

CopyHandle CopyQueue::SwapIn(const SwapKey& key, absl::Span<std::byte> dst) {
  auto lease = std::make_shared<PinnedLease>(pool_->Acquire());
  return Enqueue(
      [this, key, lease, dst]() -> absl::StatusOr<size_t> {
        auto length = store_->Length(key);
        if (!length.ok()) return length.status();
        if (*length > lease->size() || *length > dst.size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("swap-in of ", SwapKeyText(key), ": the extent's ", *length,
                           " bytes exceed the destination's ", dst.size(), " or the buffer_size ",
                           lease->size()));
        }
        auto n = store_->Read(key, lease->span());
        if (n.ok()) std::memcpy(dst.data(), lease->data(), *n);
        lease->Release();
        return n;
      },
      /*swap_in=*/true, {SlotOf(key)});
}

PinnedLease CopyQueue::AcquireBuffer() { return pool_->Acquire(); }

absl::StatusOr<PinnedLease> CopyQueue::TryAcquireBuffer() { return pool_->TryAcquire(); }

namespace {

absl::Status CheckInside(const CopyQueue::BufferExtent& e, size_t buffer_size, const char* what) {
  if (e.offset > buffer_size || e.length > buffer_size - e.offset) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " of ", SwapKeyText(e.key), ": bytes [", e.offset, ", ",
                     e.offset + e.length, ") lie outside the ring buffer of ", buffer_size));
  }
  return absl::OkStatus();
}

}  // namespace

CopyHandle CopyQueue::SwapInPlace(std::vector<BufferExtent> extents, const PinnedLease& lease) {
  for (const BufferExtent& e : extents) {
    if (absl::Status s = CheckInside(e, lease.size(), "swap-in"); !s.ok()) {
      return CopyHandle::Finished(std::move(s));
    }
  }
  std::byte* base = lease.data();
  std::vector<Slot> slots;
  for (const BufferExtent& e : extents) slots.push_back(SlotOf(e.key));
  return Enqueue(
      [this, extents = std::move(extents), base]() -> absl::StatusOr<size_t> {
        size_t total = 0;
        for (const BufferExtent& e : extents) {
          auto length = store_->Length(e.key);
          if (!length.ok()) return length.status();
          if (*length != e.length) {
            return absl::InvalidArgumentError(
                absl::StrCat("swap-in of ", SwapKeyText(e.key), ": the extent holds ", *length,
                             " bytes, the caller expects ", e.length));
          }
          auto n = store_->Read(e.key, {base + e.offset, e.length});
          if (!n.ok()) return n.status();
          total += *n;
        }
        return total;
      },
      /*swap_in=*/true, std::move(slots));
}

CopyHandle CopyQueue::SwapOutPlace(std::vector<BufferExtent> extents, PinnedLease lease) {
  for (const BufferExtent& e : extents) {
    if (absl::Status s = CheckInside(e, lease.size(), "swap-out"); !s.ok()) {
      return CopyHandle::Finished(std::move(s));
    }
  }
  auto held = std::make_shared<PinnedLease>(std::move(lease));
  size_t queued = 0;
  std::vector<Slot> slots;
  for (const BufferExtent& e : extents) {
    queued += e.length;
    slots.push_back(SlotOf(e.key));
  }
  return Enqueue(
      [this, extents = std::move(extents), held]() -> absl::StatusOr<size_t> {
        size_t total = 0;
        absl::Status s;
        for (const BufferExtent& e : extents) {
          s = store_->Write(e.key, {held->data() + e.offset, e.length});
          if (!s.ok()) break;
          total += e.length;
        }
        held->Release();
        if (!s.ok()) return s;
        return total;
      },
      /*swap_in=*/false, std::move(slots), queued);
}

CopyHandle CopyQueue::Commit(const std::string& job, uint64_t generation,
                             std::vector<CopyHandle> writes) {
  return Enqueue(
      [this, job, generation, writes = std::move(writes)]() -> absl::StatusOr<size_t> {
        for (const CopyHandle& w : writes) {
          // Queued before this task on its lane, so finished: Wait returns at once.
          if (absl::Status s = w.Wait(); !s.ok()) {
            return absl::Status(s.code(), absl::StrCat("generation ", generation, " of ", job,
                                                       " not committed: ", s.message()));
          }
        }
        absl::Status s = store_->Commit(job, generation);
        if (!s.ok()) return s;
        return size_t{0};
      },
      /*swap_in=*/false, {}, /*queued_out=*/0, /*after_reads=*/true);
}

absl::Status CopyQueue::Drain() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](CopyQueue* q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu_) {
        return q->read_lane_.queue.empty() && !q->read_lane_.running &&
               q->write_lane_.queue.empty() && !q->write_lane_.running;
      },
      this));
  return std::exchange(first_error_, absl::OkStatus());
}

CopyQueueStats CopyQueue::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void CopyQueue::LaneLoop(bool swap_in) {
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      Lane& lane = swap_in ? read_lane_ : write_lane_;
      mu_.Await(absl::Condition(
          swap_in ? +[](CopyQueue* q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                         q->mu_) { return !q->read_lane_.queue.empty() || q->stopping_; }
                  : +[](CopyQueue* q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                         q->mu_) { return !q->write_lane_.queue.empty() || q->stopping_; },
          this));
      if (lane.queue.empty()) return;  // stopping, and everything queued is done
      task = std::move(lane.queue.front());
      lane.queue.pop_front();
      lane.running = true;
    }
    // A swap-in's slots' writes, queued before it on the write lane; a commit's reads, queued
    // before it on the read lane. Neither waits for what was queued after it, so they end;
    // whatever they returned, the task then finds what the store holds.
    for (const CopyHandle& earlier : task.after) earlier.Wait().IgnoreError();
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<size_t> result = task.run();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    {
      absl::MutexLock lock(&mu_);
      if (result.ok()) {
        (task.swap_in ? stats_.bytes_in : stats_.bytes_out) += *result;
      } else if (first_error_.ok()) {
        first_error_ = result.status();
      }
      (task.swap_in ? stats_.seconds_in : stats_.seconds_out) += seconds;
      for (const Slot& slot : task.slots) {
        auto it = last_write_.find(slot);
        if (it != last_write_.end() && it->second.first == task.sequence) last_write_.erase(it);
      }
    }
    // Completed after the stats count it and before Drain may return, so both see it.
    task.handle.Complete(result.ok() ? absl::OkStatus() : result.status(),
                         result.ok() ? *result : 0);
    absl::MutexLock lock(&mu_);
    (swap_in ? read_lane_ : write_lane_).running = false;
  }
}

}  // namespace zt::offload
