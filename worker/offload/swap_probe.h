// The bandwidth of a directory's filesystem as the swap store would reach it, for
// `zt offload probe PATH` (cli/ may not include offload/ itself: DESIGN.md). A thin wrapper
// over offload/bandwidth_probe.h that takes the job schema's sizes (int64, as
// offload.aio writes them) and checks them with errors naming the field.
// Stateless and thread-safe; each call writes, syncs, reads back and removes one temporary
// file under `path`.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/job.pb.h"

namespace zt {

struct SwapProbeOptions {
  std::string path;
  // Bytes written and read back, > 0 (rounded up to a multiple of block_size).
  int64_t bytes = int64_t{256} << 20;
  // offload.aio.block_size: a positive multiple of 4096, at most 1 GiB.
  int64_t block_size = int64_t{1} << 20;
  // offload.aio.queue_depth: 1..4096.
  int32_t queue_depth = 8;
  // Where warnings go (O_DIRECT or io_uring refused); empty: stderr.
  std::function<void(absl::string_view)> warn;
};

// The probe at a job's configured I/O (offload.nvme_path, offload.aio; defaults applied).
SwapProbeOptions SwapProbeOptionsFor(const zerotrain::JobSpec& job);

struct SwapProbeResult {
  double write_gb_per_s = 0;  // 1e9 bytes per second, the final fdatasync included
  double read_gb_per_s = 0;
  int64_t bytes = 0;       // what was written and read
  bool direct_io = false;  // false: buffered (the filesystem refused O_DIRECT)
  bool io_uring = false;   // false: pread/pwrite (io_uring_setup was refused)
};

// InvalidArgument naming the option ("block_size: 1000 is not a positive multiple of 4096")
// for a bad size; the directory's errors as the swap store's (NotFound, InvalidArgument,
// PermissionDenied naming the path); ResourceExhausted naming the file and bytes when the
// filesystem cannot hold the probe's file.
absl::StatusOr<SwapProbeResult> ProbeSwapBandwidth(const SwapProbeOptions& options);

}  // namespace zt
