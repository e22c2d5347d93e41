#include "kernels/lora.h"

#include "absl/strings/str_cat.h"
#include "kernels/arg_checks.h"
#include "kernels/cpu/load_store.h"
#if ZT_HAVE_CUDA
#include "kernels/cuda/lora.h"
#endif
#include "kernels/status_macros.h"

namespace zt {
namespace {

absl::Status CheckFloat(const char* op, const char* arg, const Tensor& t,
                        const DeviceContext& ctx) {
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, arg, t, ctx));
  return internal::CheckFloatDType(op, arg, t);
}

// The two matrices of a column-block op: wide (M, N) and part (M, n) with c0 + n ≤ N.
absl::Status CheckColumns(const char* op, const DeviceContext& ctx, const char* wide_arg,
                          const Tensor& wide, const char* part_arg, const Tensor& part,
                          int64_t col_begin) {
  ZT_RETURN_IF_ERROR(internal::CheckContext(op, ctx));
  ZT_RETURN_IF_ERROR(CheckFloat(op, wide_arg, wide, ctx));
  ZT_RETURN_IF_ERROR(CheckFloat(op, part_arg, part, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckRank(op, wide_arg, wide, 2));
  ZT_RETURN_IF_ERROR(internal::CheckRank(op, part_arg, part, 2));
  if (part.dim(0) != wide.dim(0)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", part_arg, " ", part.DebugString(),
                                                   " and ", wide_arg, " ", wide.DebugString(),
                                                   " must have the same rows"));
  }
  if (col_begin < 0 || col_begin + part.dim(1) > wide.dim(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": columns [", col_begin, ", ", col_begin + part.dim(1), ") of ", part_arg,
                     " do not lie inside the ", wide.dim(1), " columns of ", wide_arg));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ColumnsCopy(const DeviceContext& ctx, const ColumnsCopyArgs& args) {
  constexpr const char* kOp = "ColumnsCopy";
  ZT_RETURN_IF_ERROR(CheckColumns(kOp, ctx, "src", args.src, "dst", args.dst, args.col_begin));
  if (ctx.device.kind == DeviceKind::kCuda) return ZT_CUDA_OP(kOp, cuda::ColumnsCopy(ctx, args));
  const int64_t M = args.src.dim(0), N = args.src.dim(1), n = args.dst.dim(1);
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      cpu::Store(args.dst.raw(), args.dst.dtype(), i * n + j,
                 cpu::Load(args.src.raw(), args.src.dtype(), i * N + args.col_begin + j));
    }
  }
  return absl::OkStatus();
}

absl::Status ColumnsAdd(const DeviceContext& ctx, const ColumnsAddArgs& args) {
  constexpr const char* kOp = "ColumnsAdd";
  ZT_RETURN_IF_ERROR(CheckColumns(kOp, ctx, "dst", args.dst, "src", args.src, args.col_begin));
  if (ctx.device.kind == DeviceKind::kCuda) return ZT_CUDA_OP(kOp, cuda::ColumnsAdd(ctx, args));
  const int64_t M = args.dst.dim(0), N = args.dst.dim(1), n = args.src.dim(1);
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const int64_t d = i * N + args.col_begin + j;
      cpu::Store(args.dst.raw(), args.dst.dtype(), d,
                 cpu::Load(args.dst.raw(), args.dst.dtype(), d) +
                     cpu::Load(args.src.raw(), args.src.dtype(), i * n + j));
    }
  }
  return absl::OkStatus();
}

uint64_t LoraDropoutSeed(uint64_t seed, int64_t block, int64_t adapter) {
  return cpu::HashIndex(cpu::HashIndex(seed, static_cast<uint64_t>(block)),
                        static_cast<uint64_t>(adapter));
}

bool LoraDropoutKeeps(uint64_t seed, int64_t i, float p) {
  // 24 uniform bits: u in [0, 1) on a grid of 2^-24, exact in f32.
  const float u =
      static_cast<float>(cpu::HashIndex(seed, static_cast<uint64_t>(i)) >> 40) * 0x1p-24f;
  return u >= p;
}

absl::Status LoraDropout(const DeviceContext& ctx, const LoraDropoutArgs& args) {
  constexpr const char* kOp = "LoraDropout";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckFloat(kOp, "inp", args.inp, ctx));
  ZT_RETURN_IF_ERROR(CheckFloat(kOp, "out", args.out, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckSameNumel(kOp, "out", args.out, "inp", args.inp));
  if (!(args.p >= 0.0f && args.p < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": p is ", args.p, ", must be in [0, 1)"));
  }
  const float keep_scale = 1.0f / (1.0f - args.p);
  const int64_t numel = args.inp.numel();
  // A share's width n and its place in the logical row.
  int64_t n = 1, row = 1, col_begin = 0;
  if (args.logical_cols > 0) {
    const int64_t width = args.inp.ndim() > 0 ? args.inp.dim(-1) : 0;
    if (width == 0 || args.col_begin < 0 || args.col_begin + width > args.logical_cols) {
      return absl::InvalidArgumentError(absl::StrCat(
          kOp, ": a column share must lie inside the logical row: columns [", args.col_begin,
          ", ", args.col_begin + width, ") of logical_cols ", args.logical_cols));
    }
    n = width;
    row = args.logical_cols;
    col_begin = args.col_begin;
  }
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::LoraDropout(ctx, args, n, row, col_begin, keep_scale));
  }
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t i = 0; i < numel; ++i) {
    const float x = cpu::Load(args.inp.raw(), args.inp.dtype(), i);
    const int64_t logical = args.logical_cols > 0 ? (i / n) * row + col_begin + i % n : i;
    const bool keep = args.p == 0.0f || LoraDropoutKeeps(args.seed, logical, args.p);
    cpu::Store(args.out.raw(), args.out.dtype(), i, keep ? x * keep_scale : 0.0f);
  }
  return absl::OkStatus();
}

}  // namespace zt
