#include "kernels/embedding.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/arg_checks.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cuda/embedding.h"
#include "kernels/status_macros.h"

namespace zt {
namespace {

// Shapes shared by forward and backward: tokens (B, T) i32, table (V, C) in a float dtype,
// and the optional positions table (P, C) with P ≥ T.
absl::Status CheckTables(const char* op, const DeviceContext& ctx, const Tensor& tokens,
                         const char* table_arg, const Tensor& table, const char* pos_arg,
                         const Tensor& pos) {
  ZT_RETURN_IF_ERROR(internal::CheckContext(op, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, "tokens", tokens, ctx));
  ZT_RETURN_IF_ERROR(CheckDType(op, "tokens", tokens, DType::kI32));
  ZT_RETURN_IF_ERROR(internal::CheckRank(op, "tokens", tokens, 2));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, table_arg, table, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckFloatDType(op, table_arg, table));
  ZT_RETURN_IF_ERROR(internal::CheckRank(op, table_arg, table, 2));
  if (pos.empty()) return absl::OkStatus();
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, pos_arg, pos, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckFloatDType(op, pos_arg, pos));
  ZT_RETURN_IF_ERROR(internal::CheckRank(op, pos_arg, pos, 2));
  if (pos.dim(1) != table.dim(1)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", pos_arg, " has ", pos.dim(1),
                                                   " channels, ", table_arg, " has ", table.dim(1),
                                                   "; they must be equal"));
  }
  if (pos.dim(0) < tokens.dim(1)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", pos_arg, " has ", pos.dim(0),
                                                   " positions, fewer than the sequence length ",
                                                   tokens.dim(1), " of tokens"));
  }
  return absl::OkStatus();
}

// positions (B, T) i32 like tokens, on the context's device, each in [0, T) (T ≤ P): a
// packed sequence's positions restart, never run past the row. On CUDA they are device data
// and are not read back (that would wait for the stream): the CUDA twin poisons the output row
// of a position outside [0, T) and its backward adds nothing for one outside [0, T)
// (kernels/cuda/embedding.cu).
absl::Status CheckPositions(const char* op, const DeviceContext& ctx, const Tensor& tokens,
                            const Tensor& positions, const char* pos_arg, const Tensor& pos) {
  if (positions.empty()) return absl::OkStatus();
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, "positions", positions, ctx));
  ZT_RETURN_IF_ERROR(CheckDType(op, "positions", positions, DType::kI32));
  if (positions.ndim() != 2 || positions.dim(0) != tokens.dim(0) ||
      positions.dim(1) != tokens.dim(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": positions must have the shape of tokens (B, T)"));
  }
  if (pos.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": positions are given but ", pos_arg, " is empty"));
  }
  if (ctx.device.kind == DeviceKind::kCuda) return absl::OkStatus();
  const int32_t* p = positions.data<int32_t>();
  for (int64_t i = 0; i < positions.numel(); ++i) {
    if (p[i] < 0 || p[i] >= tokens.dim(1)) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": positions[", i, "] = ", p[i],
                                                     " is outside [0, ", tokens.dim(1), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EmbeddingForward(const DeviceContext& ctx, const EmbeddingForwardArgs& args) {
  constexpr const char* kOp = "EmbeddingForward";
  ZT_RETURN_IF_ERROR(CheckTables(kOp, ctx, args.tokens, "wte", args.wte, "wpe", args.wpe));
  const int64_t b = args.tokens.dim(0), t = args.tokens.dim(1), c = args.wte.dim(1);
  ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(kOp, "out", args.out, ctx, {b, t, c}));
  ZT_RETURN_IF_ERROR(CheckPositions(kOp, ctx, args.tokens, args.positions, "wpe", args.wpe));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::EmbeddingForward(ctx, args));
  }
  return cpu::EmbeddingForward(ctx, args);
}

absl::Status EmbeddingBackward(const DeviceContext& ctx, const EmbeddingBackwardArgs& args) {
  constexpr const char* kOp = "EmbeddingBackward";
  ZT_RETURN_IF_ERROR(CheckTables(kOp, ctx, args.tokens, "dwte", args.dwte, "dwpe", args.dwpe));
  const int64_t b = args.tokens.dim(0), t = args.tokens.dim(1), c = args.dwte.dim(1);
  ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(kOp, "dout", args.dout, ctx, {b, t, c}));
  ZT_RETURN_IF_ERROR(CheckPositions(kOp, ctx, args.tokens, args.positions, "dwpe", args.dwpe));
  const int64_t need = EmbeddingWorkspaceBytes(ctx.device.kind, b * t, args.dwte.dim(0));
  if (ctx.workspace.bytes < need) {
    return absl::FailedPreconditionError(
        absl::StrCat(kOp, ": the workspace holds ", ctx.workspace.bytes, " bytes, this call needs ",
                     need, " (EmbeddingWorkspaceBytes)"));
  }
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::EmbeddingBackward(ctx, args));
  }
  return cpu::EmbeddingBackward(ctx, args);
}

int64_t EmbeddingWorkspaceBytes(DeviceKind kind, int64_t positions, int64_t vocab) {
  if (kind != DeviceKind::kCuda) return 0;
  // The counting sort of kernels/cuda/row_scatter.h over the vocabulary's rows, and with packed
  // positions over the position table's first T ≤ B·T rows (the two sorts run one after the
  // other in the same bytes): offsets (rows + 1), cursors (rows) and the sorted positions (B·T),
  // all i32.
  return (2 * std::max(vocab, positions) + 1 + positions) * static_cast<int64_t>(sizeof(int32_t));
}

}  // namespace zt
