// A LoRA job's frozen base in the node's swap store (model.lora, ZeRO stage 3, offload.params
// NVME; docs/lora.md): each model unit's "<unit>.params" shard, and a block's quantized bytes
// "<unit>.qbase" (an NF4 or INT8 base), are extents of the store that pass through host memory
// only on their way to a gather.
//
// Nothing updates a frozen base, so unlike the NVMe optimizer's states (worker/offload/
// nvme_optimizer.h) it is written once — Initialize at the start (the seeded or imported base),
// a quantized base's stream, or a restore from a checkpoint — as one committed generation of a
// store key of its own, and every step's gathers read that generation. The optimizer's units are
// the adapters (on the device, the host or NVMe), so the base's extents are keyed by model unit,
// the rank's range of the unit's flat buffer (the shard; f32 words for the quantized bytes) and the
// role (kParameters, kQuantizedBase), under the rank's key "<owner>/rank-<r>/base".
//
// The gathers' reads go through a ring of pinned buffers of the plan's own
// ("offload.base_ring.<k>", buffer_count × buffer_size, beside the optimizer's ring), on a copy
// queue of the base's: ReadAhead(u) queues the read of a unit's parts (its parameter shard and
// its quantized bytes, one extent each, in one ring buffer) when a buffer is free; WithShard
// hands each part to the gather, from that read or, when none was queued, from a read made then
// into the ring's staging buffer (the first buffer, held for it). A unit's parts must therefore
// fit one buffer together (Create refuses a buffer_size below that).
//
// Not thread-safe: one per rank. The store is not owned and must outlive it; the ring's memory
// (the rank's arenas) too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/copy_queue.h"
#include "offload/swap_store.h"
#include "worker/plan/memory_plan.h"

namespace zt {

class SwappedBase {
 public:
  // What a gather reads of a unit.
  enum class Part { kParams = 0, kQuantized = 1 };
  static constexpr int kParts = 2;

  struct Unit {
    std::string name;  // the model unit's plan prefix ("block.0")
    // Per part: the plan buffer's bytes (0: the unit has none of it, e.g. no quantized
    // weights) and the rank's range of the unit's flat buffer it holds (the store key's).
    int64_t bytes[kParts] = {0, 0};
    FlatRange range[kParts];
  };
  struct Args {
    std::vector<Unit> units;  // the rank's model units, in order
    offload::SwapStore* store = nullptr;
    std::string store_job;  // unique per rank of every job sharing the store
    uint32_t home_file = 0;
    // The plan's "offload.base_ring.<k>": buffer_count contiguous buffers of buffer_size bytes
    // (a multiple of 4096), starting on a 4096-byte boundary.
    std::byte* ring = nullptr;
    int64_t buffer_count = 0;
    int64_t buffer_size = 0;
  };
  // InvalidArgument for a ring that is not as described; FailedPrecondition naming
  // offload.buffer_size when a unit's parts do not fit one buffer; the store's errors from
  // forgetting what the key held before (a killed run's base).
  static absl::StatusOr<std::unique_ptr<SwappedBase>> Create(Args args);
  ~SwappedBase();
  SwappedBase(const SwappedBase&) = delete;
  SwappedBase& operator=(const SwappedBase&) = delete;

  // Writes the base and commits it as the key's generation: `fill(u, part, data)` writes the
  // part's bytes (zeroed before, so padding stays zero) into `data`, host memory valid during
  // the call.
  absl::Status Initialize(const std::function<absl::Status(int u, Part part, std::byte* data)>& fill);

  // The gathers' reads (ShardingEngine::SwappedShards): ReadAhead queues the read of unit u's
  // parts into a free ring buffer (nothing when none is free: the gather reads them itself);
  // WithShard calls `use` with the part's bytes, from the
  // oldest such read (waited for) or from a read made now, and frees the read's buffer once
  // both parts were taken; DropReads waits for the reads no gather took and frees them. The
  // read's errors name the buffer and the store's path.
  void ReadAhead(int u);
  absl::Status WithShard(int u, Part part, const std::function<absl::Status(const void*)>& use);
  void DropReads();

  // The committed bytes of the plan's buffer `name` ("<unit>.params" / "<unit>.qbase"), valid
  // until the next call: a checkpoint's source. NotFound for a buffer it does not hold.
  absl::StatusOr<const void*> ReadBuffer(const std::string& name);
  // Writing a generation buffer by buffer — a checkpoint's restore, or a quantized base
  // streamed from model.init_from, whose units complete in the stream's order: BeginRestore,
  // WriteBuffer for each whole buffer, FinishRestore commits them as the key's next generation
  // (buffers not written keep their content).
  void BeginRestore();
  absl::Status WriteBuffer(const std::string& name, const void* data, int64_t bytes);
  absl::Status FinishRestore();
  // Whether `name` is one of its buffers.
  bool Holds(const std::string& name) const;

  // The plan's buffers it holds, name → bytes (those of no bytes left out).
  std::map<std::string, int64_t> SwappedBuffers() const;

  // Cumulative: per part, the gathers served by a read queued ahead and by one made at the
  // gather; and the queue's bytes read and seconds (the gathers' reads).
  struct Stats {
    int64_t reads_ahead[kParts] = {0, 0};
    int64_t reads_at_gather[kParts] = {0, 0};
    int64_t swap_bytes_in = 0;
    double swap_seconds_in = 0;
  };
  Stats stats() const;
  uint64_t generation() const { return committed_; }

 private:
  struct Read {
    offload::PinnedLease lease;
    offload::CopyHandle handle;
    bool taken[kParts] = {false, false};
  };
  SwappedBase(Args args, std::unique_ptr<offload::BorrowedRegionAllocator> ring,
              std::unique_ptr<offload::CopyQueue> queue);
  offload::SwapKey KeyOf(int u, Part part, uint64_t generation) const;
  // Where part `p` of unit u sits in its ring buffer.
  static size_t OffsetOf(const Unit& unit, Part part);
  absl::StatusOr<std::pair<int, Part>> Find(const std::string& name) const;
  std::string NameOf(int u, Part part) const;

  std::vector<Unit> units_;
  offload::SwapStore* store_;
  std::string job_;
  std::unique_ptr<offload::BorrowedRegionAllocator> ring_;  // before the queue: its pool's region
  std::unique_ptr<offload::CopyQueue> queue_;
  offload::PinnedLease staging_;
  uint64_t committed_ = 0;
  uint64_t restoring_ = 0;
  std::vector<std::deque<Read>> reads_;  // per unit, oldest first
  Stats stats_;
};

}  // namespace zt
