// Entry points of kernels/nf4.h: the level table, the storage layout, argument checks, then
// dispatch on the device kind.
#include "kernels/nf4.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/arg_checks.h"
#include "kernels/cpu/nf4.h"
#include "kernels/quantization.h"
#include "kernels/status_macros.h"

namespace zt {
namespace {

// A buffer of exactly `count` elements of `dtype` on the context's device.
absl::Status CheckBuffer(const char* op, const std::string& arg, const Tensor& t,
                         const DeviceContext& ctx, DType dtype, int64_t count) {
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, arg.c_str(), t, ctx));
  ZT_RETURN_IF_ERROR(CheckDType(op, arg.c_str(), t, dtype));
  if (t.numel() == count) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", arg, " ", t.DebugString(), " has ",
                                                 t.numel(), " elements, the layout needs ", count,
                                                 " (Nf4LayoutFor)"));
}

}  // namespace

const std::array<float, 16>& Nf4Levels() {
  // QLoRA, appendix E, as bitsandbytes stores them (f32).
  static const std::array<float, 16> levels = {-1.0f,
                                               -0.6961928009986877f,
                                               -0.5250730514526367f,
                                               -0.39491748809814453f,
                                               -0.28444138169288635f,
                                               -0.18477343022823334f,
                                               -0.09105003625154495f,
                                               0.0f,
                                               0.07958029955625534f,
                                               0.16093020141124725f,
                                               0.24611230194568634f,
                                               0.33791524171829224f,
                                               0.44070982933044434f,
                                               0.5626170039176941f,
                                               0.7229568362236023f,
                                               1.0f};
  return levels;
}

Nf4Layout Nf4LayoutFor(int64_t numel, Nf4Absmax format, const Nf4ShareShape& share) {
  Nf4Layout l;
  l.numel = numel;
  l.code_bytes = (numel + 1) / 2;
  l.blocks = NumQuantBlocks(numel, kNf4Block);
  if (format == Nf4Absmax::kDoubleQuantized) {
    l.absmax_groups = NumQuantBlocks(l.blocks, kNf4AbsmaxGroup);
    l.total_bytes = l.code_bytes + l.blocks + 4 * l.absmax_groups + 4;
  } else if (format == Nf4Absmax::kGroupIndexed) {
    l.absmax_groups = NumQuantBlocks(
        NumQuantBlocks(std::max<int64_t>(share.whole_numel, 1), kNf4Block), kNf4AbsmaxGroup);
    l.rows = share.row_blocks > 0 ? l.blocks / share.row_blocks : 0;
    l.total_bytes = l.code_bytes + l.blocks + 4 * l.absmax_groups + 4 + 4 * l.rows;
  } else {
    l.total_bytes = l.code_bytes + 4 * l.blocks;
  }
  return l;
}

absl::Status CheckNf4Tensor(const char* op, const char* arg, const Nf4Tensor& t,
                            const DeviceContext& ctx) {
  if (t.numel < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", arg, ".numel is ", t.numel, ", must be at least 1"));
  }
  const std::string name(arg);
  if (t.format == Nf4Absmax::kGroupIndexed) {
    const int64_t row = t.share.row_blocks * kNf4Block;
    if (t.share.row_blocks < 1 || t.numel % row != 0 || t.share.whole_numel < t.numel) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": ", arg, " (kGroupIndexed) has ", t.numel, " elements in rows of ",
          t.share.row_blocks, " blocks out of a whole weight of ", t.share.whole_numel,
          "; share.row_blocks must be at least 1, numel a multiple of 64 · row_blocks and at most "
          "share.whole_numel"));
    }
  } else if (!t.block_base.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", arg, ".block_base must be empty; it belongs to kGroupIndexed"));
  }
  const Nf4Layout l = Nf4LayoutFor(t.numel, t.format, t.share);
  ZT_RETURN_IF_ERROR(CheckBuffer(op, name + ".codes", t.codes, ctx, DType::kU8, l.code_bytes));
  if (t.format == Nf4Absmax::kF32) {
    ZT_RETURN_IF_ERROR(CheckBuffer(op, name + ".absmax", t.absmax, ctx, DType::kF32, l.blocks));
    if (!t.absmax_scale.empty() || !t.absmax_offset.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", arg,
                       " has f32 absmax values (format kF32), so absmax_scale and "
                       "absmax_offset must be empty; they belong to kDoubleQuantized"));
    }
    return absl::OkStatus();
  }
  ZT_RETURN_IF_ERROR(CheckBuffer(op, name + ".absmax", t.absmax, ctx, DType::kU8, l.blocks));
  ZT_RETURN_IF_ERROR(
      CheckBuffer(op, name + ".absmax_scale", t.absmax_scale, ctx, DType::kF32, l.absmax_groups));
  ZT_RETURN_IF_ERROR(
      CheckBuffer(op, name + ".absmax_offset", t.absmax_offset, ctx, DType::kF32, 1));
  if (t.format != Nf4Absmax::kGroupIndexed) return absl::OkStatus();
  return CheckBuffer(op, name + ".block_base", t.block_base, ctx, DType::kI32, l.rows);
}

absl::Status Nf4Quantize(const DeviceContext& ctx, const Nf4QuantizeArgs& args) {
  constexpr const char* kOp = "Nf4Quantize";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(kOp, "src", args.src, ctx));
  ZT_RETURN_IF_ERROR(CheckDType(kOp, "src", args.src, DType::kF32));
  ZT_RETURN_IF_ERROR(CheckNf4Tensor(kOp, "dst", args.dst, ctx));
  if (args.src.numel() != args.dst.numel) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": src ", args.src.DebugString(), " has ",
                                                   args.src.numel(), " elements, dst.numel is ",
                                                   args.dst.numel, "; they must be equal"));
  }
  if (args.dst.format == Nf4Absmax::kGroupIndexed) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp,
        ": dst.format kGroupIndexed is a share sliced from a whole weight's kDoubleQuantized "
        "quantization; quantize the whole weight"));
  }
  if (ctx.device.kind == DeviceKind::kCuda) {
    return absl::UnimplementedError(
        absl::StrCat(kOp,
                     ": runs on the CPU only (weights are quantized once while they load; copy the "
                     "buffers to the device after)"));
  }
  return cpu::Nf4Quantize(ctx, args);
}

absl::Status Nf4Dequantize(const DeviceContext& ctx, const Nf4DequantizeArgs& args) {
  constexpr const char* kOp = "Nf4Dequantize";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckNf4Tensor(kOp, "src", args.src, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(kOp, "dst", args.dst, ctx));
  ZT_RETURN_IF_ERROR(CheckDType(kOp, "dst", args.dst, DType::kF32));
  if (args.dst.numel() != args.src.numel) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": dst ", args.dst.DebugString(), " has ",
                                                   args.dst.numel(), " elements, src.numel is ",
                                                   args.src.numel, "; they must be equal"));
  }
  if (ctx.device.kind == DeviceKind::kCuda) {
    return absl::UnimplementedError(absl::StrCat(
        kOp, ": runs on the CPU only (the CUDA NF4 linear dequantizes its own tiles)"));
  }
  cpu::Nf4Dequantize(ctx, args);
  return absl::OkStatus();
}

}  // namespace zt
