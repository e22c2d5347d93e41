// Adafactor (Shazeer & Stern, Adafactor: Adaptive Learning Rates with Sublinear Memory Cost,
// 2018, Algorithms 4 and 5) for one tensor, with the conventions and defaults of the widely
// used Hugging Face transformers `Adafactor` (which follows fairseq's).
//
// For a matrix the second moment is factored: one f32 per row and one per column instead of
// one per element, so its state is (rows + cols) · 4 bytes (plus 4 bytes per element with a
// first moment). A vector keeps a full second moment (4 bytes per element).
//
// One step t, with g = grad · grad_scale:
//   β2t = 1 − t^decay_rate
//   matrix: R_i = β2t·R_i + (1 − β2t)·mean_j(g_ij² + eps1)  (over columns)
//           C_j = β2t·C_j + (1 − β2t)·mean_i(g_ij² + eps1)  (over rows)
//           V_ij = R_i·C_j / mean_i(R_i)
//   vector: V_i = β2t·V_i + (1 − β2t)·(g_i² + eps1)
//   U = g / √V;  U /= max(1, RMS(U) / clip_threshold)
//   ρ = relative_step ? min(warmup_init ? 1e-6·t : 1e-2, 1/√t) : lr
//   α = scale_parameter ? max(eps2, RMS(param before the step)) · ρ : ρ
//   with a first moment: m = β1·m + (1 − β1)·α·U, step = m;  without: step = α·U
//   param = param − weight_decay·α·param − step
// Reductions (RMS, means) are accumulated in double over fixed chunks combined in a fixed
// order, so any thread count gives the same bits.
//
// The gradient may be f32, bf16 or f16, and param_copy, stochastic_rounding and seed work as
// in AdamWArgs (kernels/optimizer.h): the updated f32 parameter is also written, rounded, to a
// 16-bit copy, with the stochastic hash's counter the element index within the tensor.
//
// Sharded (ZeRO): a rank may hold only a contiguous range of the tensor's flattened elements,
// cut anywhere (mid-row). The whole-tensor statistics (row and column means of g², mean(R),
// RMS(U), RMS(param)) are then each rank's partial sums, added across the shard group by a
// caller-supplied callback; see AdafactorArgs::Shard. Every rank applies the same summed
// values, so the replicated row and column statistics stay identical across the group.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/tensor.h"

namespace zt {

struct AdafactorArgs {
  Tensor param;       // (rows, cols) factored, or (n); f32 (or i16, a split master:
                      // kernels/optimizer.h), updated in place. Tensors of more dimensions
                      // are passed as (product of the leading ones, last one).
  Tensor grad;        // param's shape, f32, bf16 or f16
  Tensor row_state;   // (rows) f32, updated: matrices only, empty for vectors
  Tensor col_state;   // (cols) f32, updated: matrices only, empty for vectors
  Tensor full_state;  // (n) f32, updated: vectors only, empty for matrices
  Tensor m;           // param's element count, f32, updated; empty when beta1 is 0
  // The absolute step size; must be 0 with relative_step (the step size is computed then).
  float lr = 0;
  float beta1 = 0;              // in [0, 1); 0 with an empty m means no first moment
  float decay_rate = -0.8f;     // < 0
  float eps1 = 1e-30f;          // > 0, added to g² so that rows or columns of zeros stay finite
  float eps2 = 1e-3f;           // ≥ 0, the least parameter scale with scale_parameter
  float clip_threshold = 1.0f;  // > 0
  // Hugging Face's defaults; its recommendation for fine-tuning is relative_step and
  // scale_parameter false with an explicit lr and warm-up schedule.
  bool relative_step = true;
  bool scale_parameter = true;
  bool warmup_init = false;  // requires relative_step
  float weight_decay = 0;
  int64_t step = 1;                  // 1-based step count
  float grad_scale = 1.0f;           // applied to grad before use
  Tensor param_copy;                 // param's element count, bf16 or f16, or empty
  bool stochastic_rounding = false;  // bf16 param_copy only
  uint64_t seed = 0;                 // of the stochastic rounding

  // Sharded update (ZeRO): `shard` set means param, grad, m, param_copy (and full_state for a
  // vector) are vectors of the end − begin elements [begin, end) of the whole tensor's
  // row-major flattening, and other ranks of the shard group hold the rest. The whole tensor
  // is a matrix of rows × cols (factored statistics), or, with rows = 0, a vector of cols
  // elements (full second moment). For a matrix, row_state (rows) and col_state (cols) are the
  // WHOLE tensor's statistics, replicated on every rank of the group; they stay identical
  // because every rank applies the same summed values. A rank whose range is empty
  // (begin == end) must still call AdafactorUpdate to take part in the sums: its data tensors
  // are empty (or have no elements) and so may its row_state and col_state be.
  //
  // `sum_across_shards(data, n)` replaces data[0, n) in place by its element-wise sum over the
  // group (an all-reduce). Each call of AdafactorUpdate calls it exactly twice, with n =
  // rows + cols + 1 then 1 for a matrix and 1 then 1 for a vector, so every rank of the group
  // makes the same calls in the same order. An argument error is returned before the first
  // call, and an error from the callback is returned at once: either way this rank has left
  // the group's sequence of sums, which the caller must then abort.
  //
  // The partial sums are accumulated in double and handed over as f32, so the result equals
  // the unsharded one to within the f32 rounding of those sums. The stochastic rounding's
  // counter is the element index within the whole tensor (begin + i), so a sharded run rounds
  // the copy exactly as an unsharded run would round the same f32 values.
  struct Shard {
    int64_t rows = 0;  // the whole tensor's rows; 0 for a vector
    int64_t cols = 0;  // its columns; a vector's length
    int64_t begin = 0;
    int64_t end = 0;
    std::function<absl::Status(float* data, int64_t n)> sum_across_shards;
    // Tensor parallelism: the tensor above (rows × cols, or cols) is itself one rank's part of
    // a logical tensor of logical_rows × logical_cols (a vector: logical_cols), split by rows
    // (a column-parallel weight, whose output rows are split) or by columns (a row-parallel
    // weight) over a tensor-parallel group; 0 means no such split. sum_across_shards then also
    // adds over that group what the split leaves partial (the column sums of a row split, the
    // row sums of a column split, Σ param² and Σ U²: the caller's to route, see
    // worker/optim/optimizer.cc), RMS(param) and RMS(U) divide by the logical element count,
    // and with the rows split mean(R) is the logical matrix's: sum_row_states(data, 1) adds
    // the rank's Σ_i R_i over the group, a call between the two above made only by ranks with
    // a non-empty range (every rank of the group holds the same range of its part).
    int64_t logical_rows = 0;
    int64_t logical_cols = 0;
    std::function<absl::Status(float* data, int64_t n)> sum_row_states;
    // Rows of the part (sorted, disjoint [first, second) ranges of its rows) that other ranks
    // of the group hold identical copies of — the K and V rows of a KV head that several ranks'
    // query heads share — and whose copy another rank counts: this rank still updates them, but
    // leaves them out of everything summed over the group (column sums, Σ param², Σ R_i,
    // Σ U²), so the logical matrix's statistics count each row once. A part split by rows only.
    std::vector<std::pair<int64_t, int64_t>> uncounted_rows;
  };
  std::optional<Shard> shard;
  // f32 workspace for the sums, sharded only: at least rows + cols + 2 elements for a matrix
  // ([row sums | column sums | Σ param² | Σ U²]), 2 for a vector; unused when not sharded.
  Tensor reduce_scratch;
};
// Returns InvalidArgument naming the argument and the rule for bad input, or (sharded) the
// first error of sum_across_shards, prefixed with the phase. On a CUDA context,
// FailedPrecondition when ctx.workspace holds fewer than AdafactorWorkspaceBytes; and, sharded,
// reduce_scratch is device memory: sum_across_shards(data, n) gets a device pointer whose
// values are produced by work already enqueued on ctx.stream, and must leave the sums there in
// stream order (an all-reduce enqueued on ctx.stream, e.g. NCCL's; or a wait for the stream, a
// host sum and a copy back), since the op enqueues what reads them right after it returns; so
// does sum_row_states (a tensor-parallel part split by rows: its f32 Σ R_i in the workspace).
// A part's uncounted_rows hold at most 8 ranges on CUDA (InvalidArgument beyond).
absl::Status AdafactorUpdate(const DeviceContext& ctx, const AdafactorArgs& args);

// Scratch AdafactorUpdate takes from ctx.workspace on a device of `kind`, for a tensor of
// `rows` rows (a matrix's, or shard.rows when sharded; 0 for a vector): 0 on the CPU; on CUDA,
// the fixed-order partial sums (4 KiB), the update's scalars and one f32 row factor per row.
int64_t AdafactorWorkspaceBytes(DeviceKind kind, int64_t rows);

}  // namespace zt
