#include "kernels/tensor_parallel.h"

#include "absl/strings/str_cat.h"
#include "kernels/arg_checks.h"
#include "kernels/cpu/tensor_parallel.h"
#include "kernels/cuda/tensor_parallel.h"
#include "kernels/embedding.h"
#include "kernels/status_macros.h"

namespace zt {
namespace {

// The row statistics (maxes, sums, losses) are f32, as the whole-model cross-entropy keeps
// them; the data (tables, logits, rows) may be f32, bf16 or f16.
absl::Status CheckMatrix(const char* op, const char* arg, const Tensor& t,
                         const DeviceContext& ctx) {
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, arg, t, ctx));
  ZT_RETURN_IF_ERROR(CheckDType(op, arg, t, DType::kF32));
  return internal::CheckRank(op, arg, t, 2);
}

absl::Status CheckDataMatrix(const char* op, const char* arg, const Tensor& t,
                             const DeviceContext& ctx) {
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, arg, t, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckFloatDType(op, arg, t));
  return internal::CheckRank(op, arg, t, 2);
}

absl::Status CheckValid(const char* op, int64_t valid, const Tensor& logits) {
  if (valid >= 0 && valid <= logits.dim(1)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": valid is ", valid, ", must be in [0, ",
                                                 logits.dim(1), "] (the logits' columns)"));
}

// logits (N, Vl), maxes (P, N), targets (N).
absl::Status CheckRows(const char* op, const DeviceContext& ctx, const Tensor& logits,
                       int64_t valid, const Tensor& maxes, const Tensor& targets) {
  ZT_RETURN_IF_ERROR(internal::CheckContext(op, ctx));
  ZT_RETURN_IF_ERROR(CheckDataMatrix(op, "logits", logits, ctx));
  ZT_RETURN_IF_ERROR(CheckValid(op, valid, logits));
  const int64_t n = logits.dim(0);
  ZT_RETURN_IF_ERROR(CheckMatrix(op, "maxes", maxes, ctx));
  if (maxes.dim(1) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": maxes has shape ", maxes.DebugString(), ", expected (P, ", n, ")"));
  }
  return internal::CheckTensor(op, "targets", targets, ctx, DType::kI32, {n});
}

absl::Status CheckEmbedding(const char* op, const DeviceContext& ctx, const Tensor& tokens,
                            const char* table_arg, const Tensor& table, const char* pos_arg,
                            const Tensor& pos, const Tensor& positions, const char* rows_arg,
                            const Tensor& rows) {
  ZT_RETURN_IF_ERROR(internal::CheckContext(op, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, "tokens", tokens, ctx));
  ZT_RETURN_IF_ERROR(CheckDType(op, "tokens", tokens, DType::kI32));
  ZT_RETURN_IF_ERROR(internal::CheckRank(op, "tokens", tokens, 2));
  ZT_RETURN_IF_ERROR(CheckDataMatrix(op, table_arg, table, ctx));
  const int64_t b = tokens.dim(0), t = tokens.dim(1), c = table.dim(1);
  ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(op, rows_arg, rows, ctx, {b, t, c}));
  if (!positions.empty()) {
    ZT_RETURN_IF_ERROR(internal::CheckTensor(op, "positions", positions, ctx, DType::kI32, {b, t}));
  }
  if (pos.empty()) return absl::OkStatus();
  ZT_RETURN_IF_ERROR(CheckDataMatrix(op, pos_arg, pos, ctx));
  if (pos.dim(1) != c) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", pos_arg, " has shape ",
                                                   pos.DebugString(), ", expected (Pl, ", c, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status VocabShardEmbeddingForward(const DeviceContext& ctx,
                                        const VocabShardEmbeddingForwardArgs& args) {
  constexpr const char* kOp = "VocabShardEmbeddingForward";
  ZT_RETURN_IF_ERROR(CheckEmbedding(kOp, ctx, args.tokens, "wte", args.wte, "wpe", args.wpe,
                                    args.positions, "out", args.out));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::VocabShardEmbeddingForward(ctx, args));
  }
  return cpu::VocabShardEmbeddingForward(ctx, args);
}

absl::Status VocabShardEmbeddingBackward(const DeviceContext& ctx,
                                         const VocabShardEmbeddingBackwardArgs& args) {
  constexpr const char* kOp = "VocabShardEmbeddingBackward";
  ZT_RETURN_IF_ERROR(CheckEmbedding(kOp, ctx, args.tokens, "dwte", args.dwte, "dwpe", args.dwpe,
                                    args.positions, "dout", args.dout));
  const int64_t need =
      VocabShardEmbeddingWorkspaceBytes(ctx.device.kind, args.tokens.numel(), args.dwte.dim(0));
  if (ctx.workspace.bytes < need) {
    return absl::FailedPreconditionError(
        absl::StrCat(kOp, ": the workspace holds ", ctx.workspace.bytes, " bytes, this call needs ",
                     need, " (VocabShardEmbeddingWorkspaceBytes)"));
  }
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::VocabShardEmbeddingBackward(ctx, args));
  }
  return cpu::VocabShardEmbeddingBackward(ctx, args);
}

absl::Status VocabShardRowMax(const DeviceContext& ctx, const VocabShardRowMaxArgs& args) {
  constexpr const char* kOp = "VocabShardRowMax";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckDataMatrix(kOp, "logits", args.logits, ctx));
  ZT_RETURN_IF_ERROR(CheckValid(kOp, args.valid, args.logits));
  ZT_RETURN_IF_ERROR(
      internal::CheckTensor(kOp, "max", args.max, ctx, DType::kF32, {args.logits.dim(0)}));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::VocabShardRowMax(ctx, args));
  }
  return cpu::VocabShardRowMax(ctx, args);
}

absl::Status VocabShardExpSum(const DeviceContext& ctx, const VocabShardExpSumArgs& args) {
  constexpr const char* kOp = "VocabShardExpSum";
  ZT_RETURN_IF_ERROR(CheckRows(kOp, ctx, args.logits, args.valid, args.maxes, args.targets));
  ZT_RETURN_IF_ERROR(
      internal::CheckTensor(kOp, "sums", args.sums, ctx, DType::kF32, {args.logits.dim(0), 2}));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::VocabShardExpSum(ctx, args));
  }
  return cpu::VocabShardExpSum(ctx, args);
}

absl::Status VocabShardCrossEntropy(const DeviceContext& ctx,
                                    const VocabShardCrossEntropyArgs& args) {
  constexpr const char* kOp = "VocabShardCrossEntropy";
  ZT_RETURN_IF_ERROR(CheckRows(kOp, ctx, args.logits, args.valid, args.maxes, args.targets));
  const int64_t n = args.logits.dim(0);
  ZT_RETURN_IF_ERROR(internal::CheckTensor(kOp, "sums", args.sums, ctx, DType::kF32, {n, 2}));
  ZT_RETURN_IF_ERROR(internal::CheckTensor(kOp, "losses", args.losses, ctx, DType::kF32, {n}));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::VocabShardCrossEntropy(ctx, args));
  }
  return cpu::VocabShardCrossEntropy(ctx, args);
}

absl::Status AddRowBias(const DeviceContext& ctx, const AddRowBiasArgs& args) {
  constexpr const char* kOp = "AddRowBias";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckDataMatrix(kOp, "out", args.out, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(kOp, "bias", args.bias, ctx, {args.out.dim(1)}));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::AddRowBias(ctx, args));
  }
  return cpu::AddRowBias(ctx, args);
}

int64_t VocabShardEmbeddingWorkspaceBytes(DeviceKind kind, int64_t positions, int64_t vocab_rows) {
  // The same counting sorts as the whole-table backward's: by the token's local row, then (with
  // packed positions) by position, over at most T ≤ B·T rows.
  return EmbeddingWorkspaceBytes(kind, positions, vocab_rows);
}

}  // namespace zt
