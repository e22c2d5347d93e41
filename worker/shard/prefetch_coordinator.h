// The prefetch coordinator: which unit's all-gather is issued when, and into which buffer.
//
// A pass is a fixed sequence of unit uses — the forward order, then the backward order (or
// the forward alone for evaluation; on a pipeline stage, every use of the step's schedule in
// the order its ops run, ShardingEngine::BeginStagePass) — each marked with whether the unit is
// released when the use ends. The ordering, which every rank follows identically because collectives must be
// issued in the same order on every rank:
//   1. Before use i is computed, the gathers of the units of uses i … i+k (k = prefetch
//      depth) that are sharded are issued, in sequence order. A unit already gathered or
//      gathering (the head at the forward/backward turn, a unit kept from its forward) is
//      skipped.
//   2. Use i then waits for its own unit's gather (UnitRegistry::AwaitGathered).
//   3. When use i ends, its unit is released if the use says so; its buffer returns to the
//      pool.
// A unit with a dedicated buffer (the tied embedding, every unit without
// reshard_after_forward) gathers into it; the others take a buffer from a pool of k + 1
// slots. Since at most k + 1 pooled units are held at once (the one computed and k ahead) and
// a use's unit is released before the next use issues its gathers, a slot is always free;
// running out is reported as an internal error rather than overwriting a held buffer.
//   4. Read-ahead (optional, SetReadAhead): when use i issues the gathers through use i + k,
//      it also announces the units of the next max(k, 1) uses that will gather (those whose
//      unit is not still held from an earlier use of the pass), each use once, in sequence
//      order. A gather whose shard must first be read from slower memory (offload.params
//      NVME) then finds it read while the uses before it compute: its read runs max(k, 1)
//      uses ahead of the gather's issue, the gather k uses ahead of the use.
//
// Not thread-safe: the rank's compute thread owns it.
#pragma once

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/tensor.h"
#include "worker/shard/unit_registry.h"

namespace zt {

struct UnitUse {
  int unit = 0;
  bool release_after = true;
};

class PrefetchCoordinator {
 public:
  // Issues the all-gather of unit u's shard into `full` (the unit's padded size, or more).
  using GatherFn = std::function<absl::StatusOr<CommHandle>(int u, const Tensor& full)>;
  // Announces that unit u will be gathered, ahead of the gather (ordering rule 4).
  using ReadAheadFn = std::function<void(int u)>;

  // `dedicated[u]`: unit u's own buffer, or empty to use the pool. `registry` must outlive
  // the coordinator.
  PrefetchCoordinator(UnitRegistry* registry, std::vector<Tensor> pool,
                      std::vector<Tensor> dedicated, int prefetch, GatherFn gather);

  // Set before a pass begins; empty (the default): no announcements.
  void SetReadAhead(ReadAheadFn read_ahead) { read_ahead_ = std::move(read_ahead); }

  // Starts a pass over `uses`.
  void Begin(std::vector<UnitUse> uses);
  // Issues the gathers up to use i + k and returns use i's full parameters.
  absl::StatusOr<Tensor> Acquire(int i);
  // Ends use i (releasing its unit when the use says so).
  absl::Status Finish(int i);
  // Ends the pass: waits for gathers still in flight and releases every unit, kept or not
  // (also after an error, so no buffer is left being written).
  absl::Status End();

  int prefetch() const { return prefetch_; }

  // Between passes: the buffer each of `units` would gather into if a pass began whose first
  // gathers are those units, in that order (a dedicated buffer, or the pool's slots in the
  // order Issue takes them: at a pass's start every slot is free). Empty for a unit that is
  // not sharded now, one past the pool's room, or when a pass is under way. Lets a caller put a
  // rank's own shard into its slot ahead of the gather (ShardingEngine::ReadFirstGathersAhead);
  // the gather checks the address it is handed, so a wrong guess costs a copy, not a value.
  std::vector<Tensor> FirstGatherBuffers(const std::vector<int>& units) const;

 private:
  absl::Status Issue(int unit);

  UnitRegistry* registry_;
  std::vector<Tensor> pool_;
  std::vector<bool> pool_free_;
  std::vector<int> pool_slot_of_;  // per unit: its pool slot while held, else −1
  std::vector<Tensor> dedicated_;
  int prefetch_;
  GatherFn gather_;
  std::vector<UnitUse> uses_;
  int issued_through_ = -1;  // the last use whose gather was considered
  ReadAheadFn read_ahead_;
  std::vector<bool> gathers_;  // per use of the pass: whether it gathers its unit
  int read_through_ = -1;      // the last use announced to read_ahead_
};

}  // namespace zt
