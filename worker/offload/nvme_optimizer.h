// The optimizer step of ZeRO-Infinity's optimizer offload (offload.optimizer NVME, DESIGN.md
// "Offload tier"): a rank's fp32 master weights and optimizer states live in the node's swap
// store (offload/swap_store.h) and only pass through host memory, unit by unit, during the
// step. Host memory is the plan's ring ("offload.ring.<k>", buffer_count × buffer_size), handed
// to a CopyQueue as its pool: two of its buffers stage the unit's gradients (down from the
// device) and parameters (up to it), the rest hold units' states in place. For each unit u:
//   1. the reads of unit u + 1's states are queued while u is updated, when the ring has the
//      buffers free (read-ahead; else they are queued once u's writes are);
//   2. u's gradient shard comes down through the copy engine, u's reads are waited for, the
//      Optimizer's kernels update the states in their ring buffers (the very arithmetic of the
//      step without offload: bit for bit on the CPU), the parameters go back up;
//   3. u's states are queued for writing from those buffers (write-behind), each buffer going
//      back to the ring once the store has its bytes.
// Every step writes a new generation; once all its writes are done, Commit makes them durable
// and switches the store's index to it (SwapStore::Commit): a crash leaves the previous
// generation or the new one whole, never a mix. A failed write fails the step before any
// commit, naming the store's path and the bytes.
//
// The commit behind the next compute (CommitTiming::kBehindNextCompute): Step queues the
// commit behind the generation's writes and returns, so the last units' writes, their
// fdatasync and the index switch run on the copy queue's worker beside the next step's forward
// and backward, which read nothing of the store (without swapped parameters). Every call that
// reads the committed generation settles it first (SettleCommit: in practice
// ReadFirstUnitAhead at the end of that backward, by when it is done). The queue commits
// nothing when one of the writes failed, so a crash or a full disk still leaves the previous
// generation whole; the failure fails the next call, naming the step whose states it lost.
// A step's swapped-out bytes count where they are queued (Stats::swap_bytes_out), whatever
// step their writes finish in.
//
// Read ahead of the step: ReadFirstUnitAhead, called once the backward has ended, queues the
// first unit's reads (when the ring has the buffers free), so the step starts with them in
// flight or done instead of issuing them then.
//
// With swapped parameters, the gathers of the forward and the backward read the committed
// shards through the same queue and ring (ReadShardAhead / WithShard): ahead of the gather
// when the ring has a buffer free, else when the gather needs it, into a staging buffer. Those
// reads count in the swap statistics like the step's own.
//
// A unit's states are packed into as few ring buffers as hold them (first fit, each extent on
// a 4096-byte boundary): at least 2 + that many buffers are needed (Create refuses fewer); with
// 2 + twice as many, every read-ahead overlaps the previous unit's update.
//
// In the store, each (unit, state buffer) of the rank's range is one extent, keyed by the job
// key (one per rank: ranks never share a key), the unit, the rank's range and the buffer's
// role (SwapRoleFor). The store is scratch: the checkpoint is the truth, so Create forgets
// whatever the key held before (a killed run's states), and Initialize or a restore writes the
// first generation.
//
// Not thread-safe: one per rank, like its Optimizer; the one exception is the delayed update's
// StepOnHost on its own thread beside the gathers' shard reads (see there). The copy engine and the
// store are not owned and must outlive it; the ring's memory (the rank's arenas) too.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "kernels/tensor.h"
#include "offload/copy_queue.h"
#include "offload/swap_store.h"
#include "worker/comm/device_copy_engine.h"
#include "worker/model/param_layout.h"
#include "worker/optim/gradient_downloads.h"
#include "worker/optim/optimizer.h"
#include "worker/plan/memory_plan.h"

namespace zt {

// The store role of the plan's state buffer "<unit>.<name>" ("master", "adam_m",
// "adam8_v_absmax", ...). InvalidArgument naming it for a name no optimizer lays out.
absl::StatusOr<offload::SwapRole> SwapRoleFor(const std::string& name);

class NvmeOptimizer {
 public:
  struct Args {
    // Optimizer::CreateUnbound over the rank's ranges.
    Optimizer optimizer;
    // The units' names (the plan's buffer prefixes), parallel to the optimizer's units.
    std::vector<std::string> unit_names;
    // With master weights, each unit's master buffer in elements as the plan holds it (the
    // rank's padded shard: the range's elements first, then zeros); else empty.
    std::vector<int64_t> master_numel;
    DeviceCopyEngine* copies = nullptr;
    offload::SwapStore* store = nullptr;
    // The rank's key in the store: unique per rank of every job sharing the store.
    std::string store_job;
    // The store file the rank's extents go to first (SwapStore::SetPlacement).
    uint32_t home_file = 0;
    // The plan's ring: buffer_count contiguous buffers of buffer_size bytes (a multiple of
    // 4096), starting on a 4096-byte boundary.
    std::byte* ring = nullptr;
    int64_t buffer_count = 0;
    int64_t buffer_size = 0;
    // kHost: Step's params[u] are host memory (offload.params CPU), updated in place; the
    // parameter staging buffer then stays unused and no parameter crosses the copy engine.
    // kSwapped (offload.params NVME): each unit's "<unit>.params" shard is one more swapped
    // buffer of the unit, of param_numel[u] elements of param_dtype as the plan holds it (the
    // rank's padded shard); Step reads only its dtype from params[u], updates the shard in
    // its ring buffer and writes it behind with the states, in the same generation.
    ParamHome params = ParamHome::kDevice;
    std::vector<int64_t> param_numel;
    DType param_dtype = DType::kF32;
    // Not owned: the reduced gradients, copied down during the backward (ZeRO-Offload's
    // overlap); Step takes unit u's from it instead of copying it into a ring buffer.
    GradientDownloads* gradients = nullptr;
  };
  // FailedPrecondition naming offload.buffer_count / offload.buffer_size when the ring cannot
  // hold two staging buffers and a unit's states, or a state buffer exceeds a ring buffer;
  // InvalidArgument for a ring that is not as described; the store's errors from forgetting
  // the key's previous content.
  static absl::StatusOr<std::unique_ptr<NvmeOptimizer>> Create(Args args);
  ~NvmeOptimizer();
  NvmeOptimizer(const NvmeOptimizer&) = delete;
  NvmeOptimizer& operator=(const NvmeOptimizer&) = delete;

  // Writes the first generation: for each unit, zeroed states and the master weights that
  // `fill(u, master, params)` writes into `master` (an empty tensor when the job keeps no
  // master weights; `fill` still runs, for the parameters), and with swapped parameters the
  // shard it writes into `params` (else an empty tensor); then commits it.
  absl::Status Initialize(
      const std::function<absl::Status(int u, const Tensor& master, const Tensor& params)>& fill);

  // When Step's generation becomes the committed one (see the file comment).
  enum class CommitTiming {
    kBeforeReturning,    // Step waits for its writes and the commit
    kBehindNextCompute,  // queued behind the writes; settled by the next call that reads it
  };
  // Optimizer::Step's contract (see the file comment): params[u] and grads[u] are device views
  // whose first element is element range(u).begin of unit u. The swap's and the store's
  // errors name the unit, the store's path and the bytes. With swapped parameters (which the
  // next forward reads) the commit is always made before returning.
  absl::Status Step(const DeviceContext& host_ctx, const std::vector<Tensor>& params,
                    const std::vector<Tensor>& grads, float lr, float grad_scale, uint64_t seed = 0,
                    CommitTiming timing = CommitTiming::kBeforeReturning);
  // Waits for a commit Step left behind the next compute and makes its generation the
  // committed one; OK when none is left. Its failure (a write or the commit, naming the step,
  // the store's path and the bytes) is kept: every later call that reads the store returns it.
  absl::Status SettleCommit();

  // ZeRO-Offload's delayed update (worker/optim/delayed_host_step.h): Step's arithmetic and
  // swap on host memory alone — `host_params` (the plan's "<unit>.params.host", the second
  // bank the next step's gathers and compute never read) and `host_grads` (a drained bank of
  // the gradient downloads) — so it may run on another thread beside the rank's next forward
  // and backward. Touches neither the copy engine, the staging buffers nor Stats (the caller
  // times it; the swap's bytes count in the queue's). The rank's thread meanwhile calls no
  // ReadFirstUnitAhead, ReadBuffer or restore; never beside Step.
  // Without swapped parameters it commits the step's generation. With them (offload.params
  // NVME) `host_params` is empty: the update reads and writes each unit's shard in the ring with
  // its states, and the step's generation stays staged, so the gathers of the rank's thread
  // (ReadShardAhead, WithShard: thread-safe beside it) go on reading the committed one, the
  // parameters from before this update, until CommitHostStep switches them.
  absl::Status StepOnHost(const DeviceContext& host_ctx, const std::vector<Tensor>& host_params,
                          const std::vector<Tensor>& host_grads, float lr, float grad_scale,
                          uint64_t seed = 0);
  // The delayed update's switch (offload.params NVME), on the rank's thread once StepOnHost
  // has returned OK: commits the generation it staged, which the gathers read from then on.
  // OK when none is staged; the commit's errors name the store's path.
  absl::Status CommitHostStep();

  // Queues the reads of the first unit's states for the next Step, if the ring has their
  // buffers free now (else Step issues them itself). A restore drops them.
  void ReadFirstUnitAhead();

  // offload.params NVME, the gathers' reads (ShardingEngine::SwappedShards), unit u of the
  // optimizer's units: ReadShardAhead queues the read of u's committed shard into a free ring
  // buffer (nothing when none is free); WithShard calls `use` with the bytes of the oldest read
  // queued for u, waited for, or of a read made now into a staging buffer, and frees the
  // buffer; DropShardReads waits for the reads no WithShard took and frees their buffers.
  // The read's errors name the unit and the store's path.
  void ReadShardAhead(int u);
  absl::Status WithShard(int u, const std::function<absl::Status(const void*)>& use);
  void DropShardReads();

  // The committed bytes of the plan's state buffer `name` ("<unit>.<state>"), read into a
  // ring buffer and valid until the next call of any method: a checkpoint's source.
  // NotFound for a buffer this optimizer does not swap.
  absl::StatusOr<const void*> ReadBuffer(const std::string& name);
  // Restoring from a checkpoint: BeginRestore, WriteBuffer for each restored buffer (`data`
  // holds its bytes), FinishRestore commits them as a new generation; buffers not written
  // keep their committed content.
  void BeginRestore();
  absl::Status WriteBuffer(const std::string& name, const void* data, int64_t bytes);
  absl::Status FinishRestore();

  // The plan's buffers this optimizer swaps, name → bytes (those of no bytes left out): what
  // the trainer checks against the plan's kNvme buffers.
  std::map<std::string, int64_t> SwappedBuffers() const;

  // What the steps so far moved and spent, cumulative: device ↔ host copies and host updates
  // as HostOptimizer::Stats, and the swap: bytes read from the store by the copy queue, bytes
  // queued for writing to it (counted in the step that queued them, though a commit behind the
  // next compute finishes them in that step), and the seconds its worker spent on them as they
  // finished (writes include the commits).
  struct Stats {
    int64_t bytes_to_host = 0;
    int64_t bytes_to_device = 0;
    double seconds_to_host = 0;
    double seconds_to_device = 0;
    double seconds_update = 0;
    int64_t swap_bytes_in = 0;
    int64_t swap_bytes_out = 0;
    double swap_seconds_in = 0;
    double swap_seconds_out = 0;
    // Gathers served by a shard read queued ahead of them, and by one made when they needed
    // it (offload.params NVME); steps whose first unit's reads were queued before Step.
    int64_t shard_reads_ahead = 0;
    int64_t shard_reads_at_gather = 0;
    int64_t first_unit_reads_ahead = 0;
    // With Args::gradients: seconds Step waited for a gradient copy still in flight.
    double seconds_gradient_wait = 0;
  };
  Stats stats() const;

  const Optimizer& optimizer() const { return optimizer_; }
  Optimizer& optimizer() { return optimizer_; }
  // The store's committed generation of this rank's key (a commit left behind the next compute
  // counts once settled).
  uint64_t generation() const { return committed_; }
  const std::string& store_path() const { return store_->path(); }

 private:
  // One state buffer of a unit: where it sits in the unit's ring buffers.
  struct Slot {
    std::string name;  // the plan's "<unit>.<state>"
    offload::SwapRole role = offload::SwapRole::kMaster;
    DType dtype = DType::kF32;
    int64_t numel = 0;
    int64_t bytes = 0;
    int bin = 0;        // which of the unit's ring buffers
    size_t offset = 0;  // bytes into it, a multiple of 4096
    // index into the optimizer's unit_state(u).buffers; kMasterSlot, kParamsSlot: those
    int buffer = -1;
  };
  struct UnitSlots {
    std::vector<Slot> slots;
    int bins = 0;
  };
  // A unit's states on their way in: its ring buffers and their reads (of `generation`).
  struct Pending {
    int unit = -1;
    uint64_t generation = 0;
    std::vector<offload::PinnedLease> bins;
    std::vector<offload::CopyHandle> reads;
  };

  NvmeOptimizer(Args args, std::vector<UnitSlots> units,
                std::unique_ptr<offload::BorrowedRegionAllocator> ring,
                std::unique_ptr<offload::CopyQueue> queue);
  offload::SwapKey KeyOf(int u, const Slot& slot, uint64_t generation) const;
  std::vector<offload::CopyQueue::BufferExtent> ExtentsOf(int u, int bin,
                                                          uint64_t generation) const;
  // The ring buffers of unit u's states, with their reads of `generation` queued: waiting for
  // buffers (`wait`), or nullopt when the ring has too few free now.
  std::optional<Pending> Issue(int u, uint64_t generation, bool wait);
  // Queues the writes of a unit's buffers under `generation`, handing the buffers back.
  void WriteBehind(Pending pending, uint64_t generation, std::vector<offload::CopyHandle>& writes);
  // Waits for `writes`, then commits `generation`. The first failure, with the context.
  absl::Status CommitGeneration(std::vector<offload::CopyHandle>& writes, uint64_t generation,
                                const std::string& what);
  // Waits for `writes` alone (the generation stays staged); the first failure, with the context.
  absl::Status WaitForWrites(std::vector<offload::CopyHandle>& writes, uint64_t generation,
                             const std::string& what);
  absl::Status GenerationFailed(const absl::Status& failed, uint64_t generation,
                                const std::string& what) const;
  static constexpr int kMasterSlot = -1;
  static constexpr int kParamsSlot = -2;
  // The views of unit u's master and states in its ring buffers.
  Optimizer::UnitStateViews ViewsOf(const Pending& pending) const;
  // The first `n` elements of unit u's swapped parameter shard in its ring buffers (an empty
  // view at an address that exists when the rank holds none of the unit).
  Tensor ParamsOf(const Pending& pending, int64_t n) const;
  absl::StatusOr<const Slot*> FindSlot(const std::string& name, int* unit) const;
  int64_t GenerationBytes() const;
  // Waits for `pending`'s reads and gives its buffers back to the ring.
  static void Discard(std::optional<Pending>& pending);
  // Unit u's swapped parameter shard slot; nullptr without one.
  const Slot* ParamSlotOf(int u) const;
  // Step and StepOnHost: `host_only`, the parameters and gradients are host memory to use as
  // they are (no copy, no Stats).
  absl::Status StepUnits(const DeviceContext& host_ctx, const std::vector<Tensor>& params,
                         const std::vector<Tensor>& grads, float lr, float grad_scale,
                         uint64_t seed, bool host_only, CommitTiming timing);

  Optimizer optimizer_;
  std::vector<std::string> unit_names_;
  DeviceCopyEngine* copies_;
  ParamHome params_home_;
  GradientDownloads* gradients_;
  std::vector<int64_t> param_numel_;  // kSwapped: each unit's shard, as the plan holds it
  DType params_dtype_;
  offload::SwapStore* store_;
  std::string job_;
  std::vector<UnitSlots> units_;
  std::unique_ptr<offload::BorrowedRegionAllocator> ring_;  // before the queue: its pool's region
  std::unique_ptr<offload::CopyQueue> queue_;
  offload::PinnedLease grad_staging_, param_staging_;
  uint64_t committed_ = 0;
  // A step's commit queued behind its writes and not yet waited for (CommitTiming::
  // kBehindNextCompute), and the failure of the last one settled, kept for every later call.
  struct DeferredCommit {
    uint64_t generation = 0;
    std::string what;
    std::vector<offload::CopyHandle> writes;
    offload::CopyHandle commit;
  };
  std::optional<DeferredCommit> deferred_commit_;
  absl::Status deferred_failure_;
  // The generation a StepOnHost with swapped parameters wrote and left for CommitHostStep;
  // 0: none. Written by the host step's thread, read after it (DelayedHostStep::Finish orders
  // the two).
  uint64_t host_step_staged_ = 0;
  uint64_t restoring_ = 0;              // the generation a restore writes; 0: none begun
  Stats stats_;                         // the copies and updates (the swap's come from the queue)
  std::optional<Pending> first_ahead_;  // ReadFirstUnitAhead's unit 0, for the next Step
  // Per unit, the shard reads queued ahead of gathers, oldest first.
  struct ShardRead {
    offload::PinnedLease lease;
    offload::CopyHandle read;
  };
  std::vector<std::deque<ShardRead>> shard_reads_;
};

}  // namespace zt
