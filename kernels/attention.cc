// Entry points of kernels/attention.h: argument checks, then dispatch on the device kind.
#include "kernels/attention.h"

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/arg_checks.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/packing.h"
#include "kernels/status_macros.h"

namespace zt {
namespace {

// Checks the head counts and the packed qkv tensor and derives B, T, D from it.
absl::StatusOr<cpu::AttentionDims> QkvDims(const char* op, const DeviceContext& ctx,
                                           const Tensor& qkv, int n_head, int n_kv_head) {
  ZT_RETURN_IF_ERROR(internal::CheckContext(op, ctx));
  if (n_head < 1 || n_kv_head < 1 || n_head % n_kv_head != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": n_head ", n_head, " and n_kv_head ", n_kv_head,
                     " must both be >= 1 with n_head a multiple of n_kv_head"));
  }
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, "qkv", qkv, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckFloatDType(op, "qkv", qkv));
  const int64_t heads = n_head + 2 * static_cast<int64_t>(n_kv_head);
  if (qkv.ndim() != 3 || qkv.dim(2) % heads != 0 || qkv.dim(2) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": qkv has shape ", qkv.DebugString(),
        ", expected [B, T, (n_head + 2·n_kv_head)·D] with n_head + 2·n_kv_head = ", heads,
        " and D >= 1"));
  }
  const int64_t d = qkv.dim(2) / heads;
  if (ctx.device.kind == DeviceKind::kCpu && d > cpu::kAttentionMaxHeadDim) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": qkv has head size D = ", d,
                     ", the CPU kernel supports D <= ", cpu::kAttentionMaxHeadDim));
  }
  return cpu::AttentionDims{.batch = qkv.dim(0),
                            .seq = qkv.dim(1),
                            .n_head = n_head,
                            .n_kv_head = n_kv_head,
                            .head_dim = static_cast<int>(d)};
}

}  // namespace

absl::Status AttentionForward(const DeviceContext& ctx, const AttentionForwardArgs& args) {
  constexpr const char* kOp = "AttentionForward";
  ZT_ASSIGN_OR_RETURN(const cpu::AttentionDims dims,
                      QkvDims(kOp, ctx, args.qkv, args.n_head, args.n_kv_head));
  const int64_t hd = static_cast<int64_t>(dims.n_head) * dims.head_dim;
  ZT_RETURN_IF_ERROR(
      internal::CheckFloatTensor(kOp, "out", args.out, ctx, {dims.batch, dims.seq, hd}));
  ZT_RETURN_IF_ERROR(internal::CheckTensor(kOp, "lse", args.lse, ctx, DType::kF32,
                                           {dims.batch, dims.n_head, dims.seq}));
  if (!args.doc_starts.empty()) {
    ZT_RETURN_IF_ERROR(CheckDocStarts(kOp, args.doc_starts, dims.batch, dims.seq, ctx));
  }
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::AttentionForward(ctx, dims, args));
  }
  cpu::AttentionForward(ctx, dims, args);
  return absl::OkStatus();
}

absl::Status AttentionBackward(const DeviceContext& ctx, const AttentionBackwardArgs& args) {
  constexpr const char* kOp = "AttentionBackward";
  ZT_ASSIGN_OR_RETURN(const cpu::AttentionDims dims,
                      QkvDims(kOp, ctx, args.qkv, args.n_head, args.n_kv_head));
  const int64_t hd = static_cast<int64_t>(dims.n_head) * dims.head_dim;
  ZT_RETURN_IF_ERROR(
      internal::CheckFloatTensor(kOp, "out", args.out, ctx, {dims.batch, dims.seq, hd}));
  ZT_RETURN_IF_ERROR(internal::CheckTensor(kOp, "lse", args.lse, ctx, DType::kF32,
                                           {dims.batch, dims.n_head, dims.seq}));
  ZT_RETURN_IF_ERROR(
      internal::CheckFloatTensor(kOp, "dout", args.dout, ctx, {dims.batch, dims.seq, hd}));
  ZT_RETURN_IF_ERROR(internal::CheckFloatTensor(kOp, "dqkv", args.dqkv, ctx,
                                                {dims.batch, dims.seq, args.qkv.dim(2)}));
  if (!args.doc_starts.empty()) {
    ZT_RETURN_IF_ERROR(CheckDocStarts(kOp, args.doc_starts, dims.batch, dims.seq, ctx));
  }
  const int64_t need = AttentionWorkspaceBytes(ctx.device.kind, dims.batch, dims.seq, dims.n_head);
  if (ctx.workspace.bytes < need) {
    return absl::FailedPreconditionError(
        absl::StrCat(kOp, ": the workspace holds ", ctx.workspace.bytes, " bytes, this call needs ",
                     need, " (AttentionWorkspaceBytes)"));
  }
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::AttentionBackward(ctx, dims, args));
  }
  cpu::AttentionBackward(ctx, dims, args);
  return absl::OkStatus();
}

int64_t AttentionWorkspaceBytes(DeviceKind kind, int64_t batch, int64_t seq, int n_head) {
  if (kind != DeviceKind::kCuda) return 0;
  return batch * n_head * seq * static_cast<int64_t>(sizeof(float));
}

}  // namespace zt
