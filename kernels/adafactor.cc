#include "kernels/adafactor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/arg_checks.h"
#include "kernels/cpu/adafactor.h"
#include "kernels/cuda/adafactor.h"
#include "kernels/status_macros.h"

namespace zt {
namespace {

// An optional f32 state buffer: must be present (with `numel` elements) exactly when `want`.
absl::Status CheckState(const char* op, const char* arg, const Tensor& t, bool want, int64_t numel,
                        const char* rule, const DeviceContext& ctx) {
  if (!want) {
    if (t.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", arg, " ", t.DebugString(), " is given but must be empty: ", rule));
  }
  if (t.empty() && numel != 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", arg, " is empty: ", rule));
  }
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, arg, t, ctx));
  ZT_RETURN_IF_ERROR(CheckDType(op, arg, t, DType::kF32));
  if (t.numel() == numel) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", arg, " ", t.DebugString(), " has ",
                                                 t.numel(), " elements, must have ", numel, ": ",
                                                 rule));
}

absl::Status CheckHyperparameters(const char* op, const AdafactorArgs& a) {
  const auto bad = [op](const char* field, float value, const char* rule) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", field, " is ", value, ", ", rule));
  };
  if (a.step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": step is ", a.step, ", must be at least 1 (it is 1-based)"));
  }
  if (!(a.beta1 >= 0.0f && a.beta1 < 1.0f)) return bad("beta1", a.beta1, "must be in [0, 1)");
  // A rank holding none of a sharded tensor has no first moment to keep.
  const bool empty_shard = a.shard.has_value() && a.shard->begin == a.shard->end;
  if (a.m.empty() && a.beta1 != 0.0f && !empty_shard) {
    return bad("beta1", a.beta1,
               "but m is empty; a first-moment buffer is required unless beta1 is 0");
  }
  if (!(a.decay_rate < 0.0f)) {
    return bad("decay_rate", a.decay_rate, "must be < 0 (beta2 at step t is 1 - t^decay_rate)");
  }
  if (!(a.eps1 > 0.0f)) return bad("eps1", a.eps1, "must be > 0");
  if (!(a.eps2 >= 0.0f)) return bad("eps2", a.eps2, "must be >= 0");
  if (!(a.clip_threshold > 0.0f)) return bad("clip_threshold", a.clip_threshold, "must be > 0");
  if (!(a.lr >= 0.0f)) return bad("lr", a.lr, "must be >= 0");
  if (a.relative_step && a.lr != 0.0f) {
    return bad("lr", a.lr,
               "but relative_step is set, which computes the step size; set lr to 0 or "
               "relative_step to false");
  }
  if (a.warmup_init && !a.relative_step) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": warmup_init is set but relative_step is not; it requires it"));
  }
  return absl::OkStatus();
}

// No element: absent, or a view of zero elements (an empty shard's slices).
absl::Status CheckNoElements(const char* op, const char* arg, const Tensor& t) {
  if (t.empty() || t.numel() == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", arg, " ", t.DebugString(),
                   " has elements, but the shard's range is empty (begin == end)"));
}

// The data and state tensors of an unsharded update: param is the whole tensor.
absl::Status CheckWholeTensor(const char* op, const DeviceContext& ctx, const AdafactorArgs& args) {
  ZT_RETURN_IF_ERROR(internal::CheckMaster(op, args.param, args.param_copy,
                                           args.stochastic_rounding, ctx));
  const int ndim = args.param.ndim();
  if (ndim != 1 && ndim != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": param has shape ", args.param.DebugString(),
                     ", must be a vector (n) or a matrix (rows, cols); pass (product of leading "
                     "dims, last dim)"));
  }
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, "grad", args.grad, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckFloatDType(op, "grad", args.grad));
  ZT_RETURN_IF_ERROR(internal::CheckSameShape(op, "grad", args.grad, "param", args.param));
  ZT_RETURN_IF_ERROR(
      internal::CheckParamCopy(op, args.param_copy, args.stochastic_rounding, args.param, ctx));
  const bool factored = ndim == 2;
  const int64_t rows = factored ? args.param.dim(0) : 0, cols = factored ? args.param.dim(1) : 0;
  ZT_RETURN_IF_ERROR(CheckState(op, "row_state", args.row_state, factored, rows,
                                "a matrix param needs one per row, a vector none", ctx));
  ZT_RETURN_IF_ERROR(CheckState(op, "col_state", args.col_state, factored, cols,
                                "a matrix param needs one per column, a vector none", ctx));
  ZT_RETURN_IF_ERROR(CheckState(op, "full_state", args.full_state, !factored, args.param.numel(),
                                "a vector param needs one per element, a matrix none", ctx));
  return CheckState(op, "m", args.m, !args.m.empty(), args.param.numel(),
                    "one per parameter element", ctx);
}

// The shard description and the tensors of a sharded update: param is the shard's range.
absl::Status CheckShard(const char* op, const DeviceContext& ctx, const AdafactorArgs& args) {
  const AdafactorArgs::Shard& s = *args.shard;
  if (!s.sum_across_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        op,
        ": shard.sum_across_shards is empty; a sharded update sums its partial statistics "
        "across the shard group through it"));
  }
  if (s.rows < 0 || s.cols < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": shard.rows ", s.rows, " and shard.cols ",
                                                   s.cols, " must be >= 0 (rows 0: a vector)"));
  }
  const bool factored = s.rows > 0;
  const int64_t whole = factored ? s.rows * s.cols : s.cols;
  if (!(0 <= s.begin && s.begin <= s.end && s.end <= whole)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": shard range [", s.begin, ", ", s.end, ") is outside the tensor of ",
                     whole, " elements (shard.rows ", s.rows, ", shard.cols ", s.cols,
                     "); need 0 <= begin <= end <= the element count"));
  }
  const bool tensor_split = s.logical_rows > 0 || s.logical_cols > 0;
  if (tensor_split) {
    if (ctx.device.kind == DeviceKind::kCuda &&
        s.uncounted_rows.size() > static_cast<size_t>(cuda::kAdafactorMaxUncountedRanges)) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": shard.uncounted_rows holds ", s.uncounted_rows.size(),
          " ranges; the CUDA kernel takes at most ", cuda::kAdafactorMaxUncountedRanges));
    }
    const int64_t rows = s.logical_rows > 0 ? s.logical_rows : s.rows;
    const int64_t cols = s.logical_cols > 0 ? s.logical_cols : s.cols;
    if (rows < s.rows || cols < s.cols || (!factored && s.logical_rows != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": shard.logical_rows ", s.logical_rows, " and logical_cols ", s.logical_cols,
          " must hold the part (", s.rows, " x ", s.cols, "); a vector has logical_rows 0"));
    }
    if (!s.uncounted_rows.empty() && !(factored && s.logical_rows > s.rows)) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": shard.uncounted_rows is set for a part not split by rows (logical_rows ",
          s.logical_rows, ", rows ", s.rows, "); only a row-split matrix holds replicated rows"));
    }
    int64_t previous_end = 0;
    for (const auto& [first, last] : s.uncounted_rows) {
      if (first < previous_end || last <= first || last > s.rows) {
        return absl::InvalidArgumentError(absl::StrCat(
            op, ": shard.uncounted_rows range [", first, ", ", last, ") is not a sorted, disjoint, "
            "non-empty range of the part's ", s.rows, " rows"));
      }
      previous_end = last;
    }
    if (rows > s.rows && !s.sum_row_states) {
      return absl::InvalidArgumentError(absl::StrCat(
          op,
          ": shard.sum_row_states is empty; a part of a matrix split by rows sums its row "
          "statistics across the tensor-parallel group through it"));
    }
  }
  const int64_t n = s.end - s.begin;
  const int64_t scratch_need = factored ? s.rows + s.cols + 2 : 2;
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, "reduce_scratch", args.reduce_scratch, ctx));
  ZT_RETURN_IF_ERROR(CheckDType(op, "reduce_scratch", args.reduce_scratch, DType::kF32));
  if (args.reduce_scratch.empty() || args.reduce_scratch.numel() < scratch_need) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": reduce_scratch ", args.reduce_scratch.DebugString(), " is too small: a sharded ",
        factored ? "matrix needs shard.rows + shard.cols + 2 = " : "vector needs ", scratch_need,
        " f32 elements"));
  }
  if (n == 0) {
    for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"param", &args.param},
                                  {"grad", &args.grad},
                                  {"m", &args.m},
                                  {"param_copy", &args.param_copy},
                                  {"full_state", &args.full_state}}) {
      ZT_RETURN_IF_ERROR(CheckNoElements(op, name, *t));
    }
  } else {
    ZT_RETURN_IF_ERROR(internal::CheckMaster(op, args.param, args.param_copy,
                                             args.stochastic_rounding, ctx));
    ZT_RETURN_IF_ERROR(internal::CheckTensor(op, "param", args.param, ctx, args.param.dtype(), {n}));
    ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, "grad", args.grad, ctx));
    ZT_RETURN_IF_ERROR(internal::CheckFloatDType(op, "grad", args.grad));
    ZT_RETURN_IF_ERROR(internal::CheckSameShape(op, "grad", args.grad, "param", args.param));
    ZT_RETURN_IF_ERROR(
        internal::CheckParamCopy(op, args.param_copy, args.stochastic_rounding, args.param, ctx));
    ZT_RETURN_IF_ERROR(CheckState(op, "full_state", args.full_state, !factored, n,
                                  "a sharded vector needs one per element of the shard, a "
                                  "matrix none",
                                  ctx));
    ZT_RETURN_IF_ERROR(
        CheckState(op, "m", args.m, !args.m.empty(), n, "one per element of the shard", ctx));
  }
  // An empty shard may omit the replicated statistics: it updates nothing with them.
  const bool want_rows = factored && (n > 0 || !args.row_state.empty());
  const bool want_cols = factored && (n > 0 || !args.col_state.empty());
  ZT_RETURN_IF_ERROR(CheckState(
      op, "row_state", args.row_state, want_rows, s.rows,
      "a sharded matrix needs the whole tensor's, one per row (shard.rows), a vector none", ctx));
  return CheckState(
      op, "col_state", args.col_state, want_cols, s.cols,
      "a sharded matrix needs the whole tensor's, one per column (shard.cols), a vector none", ctx);
}

}  // namespace

int64_t AdafactorWorkspaceBytes(DeviceKind kind, int64_t rows) {
  return kind == DeviceKind::kCuda ? cuda::AdafactorCudaWorkspaceBytes(rows) : 0;
}

absl::Status AdafactorUpdate(const DeviceContext& ctx, const AdafactorArgs& args) {
  constexpr const char* kOp = "AdafactorUpdate";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  if (args.shard.has_value()) {
    ZT_RETURN_IF_ERROR(CheckShard(kOp, ctx, args));
  } else {
    ZT_RETURN_IF_ERROR(CheckWholeTensor(kOp, ctx, args));
  }
  ZT_RETURN_IF_ERROR(CheckHyperparameters(kOp, args));
  if (ctx.device.kind == DeviceKind::kCuda) {
    if (!args.shard.has_value() && args.param.numel() == 0) return absl::OkStatus();
    const int64_t rows = args.shard.has_value() ? args.shard->rows
                                                : (args.param.ndim() == 2 ? args.param.dim(0) : 0);
    const int64_t need = AdafactorWorkspaceBytes(ctx.device.kind, rows);
    if (ctx.workspace.bytes < need || ctx.workspace.data == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(kOp, ": ctx.workspace holds ", ctx.workspace.bytes,
                       " bytes, this call needs ", need, " (AdafactorWorkspaceBytes)"));
    }
    return ZT_CUDA_OP(kOp, cuda::AdafactorUpdate(ctx, args));
  }
  // An empty tensor has nothing to update (and no RMS to take); an empty shard still takes
  // part in its group's sums.
  if (!args.shard.has_value() && args.param.numel() == 0) return absl::OkStatus();
  return cpu::AdafactorUpdate(ctx, args);
}

}  // namespace zt
