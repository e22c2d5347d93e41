// The optimizer of one rank: AdamW, SGD, 8-bit AdamW or Adafactor over the units' flat
// buffers.
//
// Every tensor is stepped on its own slice of its unit's buffer, with the state slices that
// worker/plan/optimizer_state_layout.h assigns it (the same description the memory plan
// reserved the state from). Weight decay is decoupled and, unless
// optimizer.decay_all_parameters, applies only to the matrices of linear layers — not to
// norms, biases or embeddings (GPT-2/nanoGPT practice). Not thread-safe: one per rank.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "kernels/tensor.h"
#include "proto/job.pb.h"
#include "worker/model/param_layout.h"
#include "worker/plan/arena.h"
#include "worker/plan/optimizer_state_layout.h"

namespace zt {

// Where the parameters an offloaded step updates live: on the device (copied down and up
// around the host update), in host memory already (offload.params CPU: the stage-3 shards in
// the pinned host pool), where the host update writes them in place, or in the swap store
// (offload.params NVME: a swapped buffer of the unit beside its optimizer states, read into
// the ring, updated there and written behind with them).
enum class ParamHome : uint8_t { kDevice, kHost, kSwapped };

class Optimizer {
 public:
  // With precision.master_weights the arenas hold "<unit>.master" (f32): the update runs on
  // it and writes the 16-bit parameters from it in the same pass (rounded to nearest even,
  // or stochastically for BF16 with precision.stochastic_rounding). With
  // precision.split_master_weights they hold "<unit>.master_low" (i16) instead: the bf16
  // parameters are the master's high halves (kernels/optimizer.h).
  //
  // `ranges` (one per unit, empty: every unit whole) is the part of each unit this rank
  // steps — its ZeRO shard; the master weights and states hold that range only.
  //
  // Sharded Adafactor needs whole-tensor statistics: `shard_group` (set when the ranges are
  // ZeRO shards of a group of more than one rank) sums floats across the group, and every
  // Adafactor tensor then goes through the kernel's shard path on every rank — also tensors
  // the rank holds nothing of — so that all ranks make the same sums in the same order. Its
  // scratch is the plan's "optimizer.reduce_scratch".
  //
  // Tensor-parallel Adafactor: a split tensor's factored statistics must be the logical
  // tensor's (kernels/adafactor.h, Shard::logical_rows). `splits` (per unit, per tensor of the
  // layout; empty: no tensor parallelism) says how each is split, `tensor_sum` sums floats
  // across the tensor-parallel group, and every split tensor then goes through the kernel's
  // shard path. With the rows split (column-parallel: the output rows) each rank's rows are
  // whole, so R is local and C (sums over rows), Σ param², Σ U² and mean(R) are summed over
  // the group; with the columns split (row-parallel) R (sums over columns), Σ param² and ΣU².
  // `sum` is then empty when the ranges are not ZeRO shards.
  struct TensorSplit {
    int64_t logical_rows = 0;  // the logical matrix's rows when they are split, else 0
    int64_t logical_cols = 0;  // its columns (a vector's length) when split, else 0
    // Rows replicated on other ranks whose copy another rank counts in the group's sums
    // (AdafactorArgs::Shard::uncounted_rows: replicated KV heads' rows).
    std::vector<std::pair<int64_t, int64_t>> uncounted_rows;
  };
  struct ShardGroup {
    std::function<absl::Status(float* data, int64_t n)> sum;
    Tensor reduce_scratch;
    std::function<absl::Status(float* data, int64_t n)> tensor_sum;
    std::vector<std::vector<TensorSplit>> splits;
  };
  static absl::StatusOr<Optimizer> Create(const zerotrain::OptimizerConfig& config,
                                          const zerotrain::PrecisionConfig& precision,
                                          const ModelLayout& layout, const Arenas& state,
                                          std::vector<FlatRange> ranges = {},
                                          std::optional<ShardGroup> shard_group = {});

  // The same optimizer with no state bound: the master weights and states of each unit are
  // handed to StepUnit with each call (offload.optimizer NVME streams them in and out of the
  // swap store, worker/offload/nvme_optimizer.h). master_weights() is then empty while
  // has_master() says whether the job keeps them; Step refuses.
  static absl::StatusOr<Optimizer> CreateUnbound(const zerotrain::OptimizerConfig& config,
                                                 const zerotrain::PrecisionConfig& precision,
                                                 const ModelLayout& layout,
                                                 std::vector<FlatRange> ranges = {},
                                                 std::optional<ShardGroup> shard_group = {});

  // One update of every unit's range: param ← update(param, grad · grad_scale) at learning
  // rate `lr` (Adafactor with relative_step ignores it). params[u] and grads[u] are views
  // whose first element is element ranges[u].begin of the unit. `grad_scale` carries
  // gradient clipping and loss-scale removal. `seed` drives stochastic rounding (vary it per
  // step).
  absl::Status Step(const DeviceContext& ctx, const std::vector<Tensor>& params,
                    const std::vector<Tensor>& grads, float lr, float grad_scale,
                    uint64_t seed = 0);

  // Step one unit at a time, for a caller that moves each unit's shard in and out around its
  // update (the host step of offloaded shards, worker/optim/host_optimizer.h): StepUnit for
  // every unit u, in order, with the views Step would take for it, then CountStep. The
  // arithmetic (bias-correction step steps_taken() + 1, rounding seeds) is Step's exactly.
  absl::Status StepUnit(const DeviceContext& ctx, int u, const Tensor& params, const Tensor& grads,
                        float lr, float grad_scale, uint64_t seed = 0) const;
  void CountStep() { ++steps_taken_; }

  // A unit's master weights and states where the caller keeps them: `master` the range's f32
  // master (i16 low halves when split; empty without master weights), `buffers` parallel to
  // unit_state(u).buffers, each of its numel and dtype.
  struct UnitStateViews {
    Tensor master;
    std::vector<Tensor> buffers;
  };
  // StepUnit over those views (an unbound optimizer's step).
  absl::Status StepUnit(const DeviceContext& ctx, int u, const Tensor& params, const Tensor& grads,
                        float lr, float grad_scale, uint64_t seed,
                        const UnitStateViews& state) const;
  // The state buffers of unit u (the plan's "<unit>.<name>").
  const UnitOptimizerState& unit_state(int u) const { return units_[u].state; }
  int unit_count() const { return static_cast<int>(units_.size()); }
  // Whether the job keeps master weights (precision.master_weights), bound or not.
  bool has_master() const { return has_master_; }

  // The range of unit u this optimizer steps.
  const FlatRange& range(int u) const { return ranges_[u]; }

  // The fp32 master weights of each unit (i16 low halves when split), or empty when the
  // parameters are their own master.
  const std::vector<Tensor>& master_weights() const { return master_; }
  bool split_master() const { return has_master_ && split_; }

  // Updates applied so far (the bias-correction step is this + 1 during Step).
  int64_t steps_taken() const { return steps_taken_; }
  // Resuming from a checkpoint: the count the saved run had reached.
  void RestoreStepsTaken(int64_t steps) { steps_taken_ = steps; }

 private:
  struct Unit {
    UnitOptimizerState state;
    std::vector<Tensor> buffers;  // parallel to state.buffers, from the arenas
  };
  Optimizer() = default;
  struct TensorStep {
    Tensor param;       // the master slice (f32, or i16 low halves), or the parameters
    Tensor param_copy;  // the 16-bit parameters when `param` is a master slice
    Tensor grad;
    float lr = 0;
    float grad_scale = 1;
    int64_t step = 1;
    uint64_t seed = 0;
    TensorSplit split;  // tensor-parallel Adafactor: how the tensor is split (none by default)
  };
  static absl::StatusOr<Optimizer> Build(const zerotrain::OptimizerConfig& config,
                                         const zerotrain::PrecisionConfig& precision,
                                         const ModelLayout& layout, const Arenas* state,
                                         std::vector<FlatRange> ranges,
                                         std::optional<ShardGroup> shard_group);
  // Tensor-parallel Adafactor: the split of tensor i of unit u, and the sums its shard path
  // makes (over the ZeRO shard group when there is one, then the tensor-parallel group).
  TensorSplit SplitOf(int u, size_t i) const;
  std::function<absl::Status(float* data, int64_t n)> TensorSplitSums(
      int64_t rows, int64_t cols, const TensorSplit& split) const;
  absl::Status StepTensor(const DeviceContext& ctx, const std::vector<Tensor>& buffers,
                          const ParamSpec& p, const TensorState& t, const TensorStep& s) const;

  zerotrain::OptimizerConfig config_;
  bool stochastic_rounding_ = false;
  ModelLayout layout_;
  std::vector<Tensor> master_;
  bool has_master_ = false;
  bool split_ = false;
  bool bound_ = true;
  std::vector<Unit> units_;
  std::vector<FlatRange> ranges_;  // resolved: end ≥ 0
  std::optional<ShardGroup> shard_group_;
  int64_t steps_taken_ = 0;
};

}  // namespace zt
