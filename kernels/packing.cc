#include "kernels/packing.h"

#include "absl/strings/str_cat.h"
#include "kernels/arg_checks.h"
#include "kernels/status_macros.h"

namespace zt {

absl::Status CheckDocStarts(const char* op, const Tensor& doc_starts, int64_t batch, int64_t seq,
                            const DeviceContext& ctx) {
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(op, "doc_starts", doc_starts, ctx));
  ZT_RETURN_IF_ERROR(CheckDType(op, "doc_starts", doc_starts, DType::kI32));
  if (doc_starts.ndim() != 2 || doc_starts.dim(0) != batch || doc_starts.dim(1) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": doc_starts has shape ", doc_starts.DebugString(), ", expected [", batch,
                     ", S] with S >= 1 (one row of document starts per batch row)"));
  }
  if (ctx.device.kind != DeviceKind::kCpu) return absl::OkStatus();
  const int64_t s = doc_starts.dim(1);
  const int32_t* v = doc_starts.data<int32_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t* row = v + b * s;
    if (row[0] != 0) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": doc_starts[", b, "][0] is ", row[0],
                                                     ", a row's first document starts at 0"));
    }
    for (int64_t d = 1; d < s; ++d) {
      if (row[d] < row[d - 1] || row[d] > seq) {
        return absl::InvalidArgumentError(
            absl::StrCat(op, ": doc_starts[", b, "][", d, "] is ", row[d], " after ", row[d - 1],
                         "; starts must not decrease and stay within [0, T = ", seq, "]"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status DocumentPositions(const DeviceContext& ctx, const DocumentPositionsArgs& args) {
  constexpr const char* kOp = "DocumentPositions";
  ZT_RETURN_IF_ERROR(internal::CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(internal::CheckOnDevice(kOp, "positions", args.positions, ctx));
  ZT_RETURN_IF_ERROR(CheckDType(kOp, "positions", args.positions, DType::kI32));
  ZT_RETURN_IF_ERROR(internal::CheckRank(kOp, "positions", args.positions, 2));
  const int64_t batch = args.positions.dim(0), seq = args.positions.dim(1);
  ZT_RETURN_IF_ERROR(CheckDocStarts(kOp, args.doc_starts, batch, seq, ctx));
  if (ctx.device.kind != DeviceKind::kCpu) {
    return absl::UnimplementedError(
        absl::StrCat(kOp, ": runs on the CPU only (build positions with the batch on the host)"));
  }
  const int64_t s = args.doc_starts.dim(1);
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t* starts = args.doc_starts.data<int32_t>() + b * s;
    int32_t* pos = args.positions.data<int32_t>() + b * seq;
    int64_t d = 0;
    for (int64_t t = 0; t < seq; ++t) {
      while (d + 1 < s && starts[d + 1] <= t) ++d;
      pos[t] = static_cast<int32_t>(t - starts[d]);
    }
  }
  return absl::OkStatus();
}

}  // namespace zt
