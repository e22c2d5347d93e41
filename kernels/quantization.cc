#include "kernels/quantization.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/arg_checks.h"
#include "kernels/cpu/quantization.h"
#include "kernels/cuda/quantization.h"
#include "kernels/status_macros.h"

namespace zt {
namespace {

// bitsandbytes' create_dynamic_map(signed, max_exponent_bits = 7, total_bits = 8). Decade
// 10^(i−6), i = 0 … 6, holds the midpoints of `slices(i)` equal slices of [0.1, 1]: 2^i of
// them for the signed map (mirrored to the negative side), 2^(i+1) for the unsigned one, so
// 127 (signed) or 254 (unsigned) non-zero values plus 0 and 1.0 make 256. Computed in double
// and rounded to f32 once.
std::array<float, 256> BuildDynamicMap(bool is_signed) {
  constexpr int kExponentBits = 7;
  std::vector<double> values;
  for (int i = 0; i < kExponentBits; ++i) {
    const int slices = is_signed ? (1 << i) : (1 << (i + 1));
    const double decade = std::pow(10.0, i - (kExponentBits - 1));
    for (int k = 0; k < slices; ++k) {
      const double mid = 0.1 + (k + 0.5) * (0.9 / slices);
      values.push_back(decade * mid);
      if (is_signed) values.push_back(-decade * mid);
    }
  }
  values.push_back(0.0);
  values.push_back(1.0);
  std::sort(values.begin(), values.end());
  std::array<float, 256> map{};
  for (size_t i = 0; i < map.size() && i < values.size(); ++i) {
    map[i] = static_cast<float>(values[i]);
  }
  return map;
}

}  // namespace

const std::array<float, 256>& DynamicMapSigned() {
  static const std::array<float, 256> map = BuildDynamicMap(/*is_signed=*/true);
  return map;
}

const std::array<float, 256>& DynamicMapUnsigned() {
  static const std::array<float, 256> map = BuildDynamicMap(/*is_signed=*/false);
  return map;
}

namespace internal {

absl::Status CheckQuantizedBuffer(const char* op, const char* codes_arg, const Tensor& codes,
                                  const char* absmax_arg, const Tensor& absmax, const char* ref_arg,
                                  const Tensor& ref, int64_t block, const DeviceContext& ctx) {
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, codes_arg, codes, ctx));
  ZT_RETURN_IF_ERROR(CheckDType(op, codes_arg, codes, DType::kU8));
  ZT_RETURN_IF_ERROR(internal::CheckSameNumel(op, codes_arg, codes, ref_arg, ref));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, absmax_arg, absmax, ctx));
  ZT_RETURN_IF_ERROR(CheckDType(op, absmax_arg, absmax, DType::kF32));
  const int64_t want = NumQuantBlocks(ref.numel(), block);
  if (absmax.numel() == want) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      op, ": ", absmax_arg, " ", absmax.DebugString(), " has ", absmax.numel(),
      " elements, must have one per block: ceil(", ref.numel(), " / ", block, ") = ", want));
}

}  // namespace internal

absl::Status CheckQuantBlock(const char* op, int64_t block) {
  if (block >= 64 && (block & (block - 1)) == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": block is ", block, ", must be a power of two, at least 64"));
}

absl::Status BlockQuantize(const DeviceContext& ctx, const BlockQuantizeArgs& args) {
  constexpr const char* kOp = "BlockQuantize";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckQuantBlock(kOp, args.block));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(kOp, "src", args.src, ctx));
  ZT_RETURN_IF_ERROR(CheckDType(kOp, "src", args.src, DType::kF32));
  ZT_RETURN_IF_ERROR(internal::CheckQuantizedBuffer(kOp, "codes", args.codes, "absmax", args.absmax,
                                                    "src", args.src, args.block, ctx));
  if (ctx.device.kind == DeviceKind::kCuda) return ZT_CUDA_OP(kOp, cuda::BlockQuantize(ctx, args));
  cpu::BlockQuantize(ctx, args);
  return absl::OkStatus();
}

absl::Status BlockDequantize(const DeviceContext& ctx, const BlockDequantizeArgs& args) {
  constexpr const char* kOp = "BlockDequantize";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckQuantBlock(kOp, args.block));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(kOp, "dst", args.dst, ctx));
  ZT_RETURN_IF_ERROR(CheckDType(kOp, "dst", args.dst, DType::kF32));
  ZT_RETURN_IF_ERROR(internal::CheckQuantizedBuffer(kOp, "codes", args.codes, "absmax", args.absmax,
                                                    "dst", args.dst, args.block, ctx));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::BlockDequantize(ctx, args));
  }
  cpu::BlockDequantize(ctx, args);
  return absl::OkStatus();
}

}  // namespace zt
