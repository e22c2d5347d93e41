#include "worker/offload/swap_probe.h"

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "offload/bandwidth_probe.h"
#include "offload/swap_format.h"
#include "worker/job/offload_validation.h"
#include "worker/plan/memory_plan.h"

namespace zt {
namespace {

constexpr int64_t kAlignment = static_cast<int64_t>(offload::swap_format::kExtentAlignment);
// The job's rules and the plan's NVMe extents name the store's unit without including it.
static_assert(kSwapAlignment == kAlignment);
static_assert(kNvmeExtentAlignment == kAlignment);
// The store's block size is 32-bit; a gigabyte per I/O is already far past any benefit.
constexpr int64_t kMaxBlockSize = int64_t{1} << 30;
// The probe keeps one file of this size: a terabyte is past any useful measurement.
constexpr int64_t kMaxBytes = int64_t{1} << 40;

}  // namespace

SwapProbeOptions SwapProbeOptionsFor(const zerotrain::JobSpec& job) {
  return SwapProbeOptions{.path = job.offload().nvme_path(),
                          .block_size = job.offload().aio().block_size(),
                          .queue_depth = job.offload().aio().queue_depth()};
}

absl::StatusOr<SwapProbeResult> ProbeSwapBandwidth(const SwapProbeOptions& options) {
  if (options.block_size <= 0 || options.block_size % kAlignment != 0 ||
      options.block_size > kMaxBlockSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size: ", options.block_size, " is not a positive multiple of ",
                     kAlignment, " (O_DIRECT's unit) of at most ", kMaxBlockSize));
  }
  if (options.queue_depth < 1 || options.queue_depth > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("queue_depth: ", options.queue_depth, " is outside 1..4096"));
  }
  if (options.bytes <= 0 || options.bytes > kMaxBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes: ", options.bytes, " is outside 1..", kMaxBytes));
  }
  offload::BandwidthProbeOptions probe{.path = options.path,
                                       .bytes = static_cast<uint64_t>(options.bytes),
                                       .block_size = static_cast<uint32_t>(options.block_size),
                                       .queue_depth = static_cast<uint32_t>(options.queue_depth)};
  if (options.warn) probe.warn = options.warn;
  ZT_ASSIGN_OR_RETURN(const offload::BandwidthResult r, offload::ProbeBandwidth(probe));
  return SwapProbeResult{.write_gb_per_s = r.write_gb_per_s,
                         .read_gb_per_s = r.read_gb_per_s,
                         .bytes = static_cast<int64_t>(r.bytes),
                         .direct_io = r.direct_io,
                         .io_uring = r.io_uring};
}

}  // namespace zt
