// Measures the sequential write and read bandwidth of a directory's filesystem with the swap
// store's own I/O path (io_uring, O_DIRECT where taken) at a given queue depth and block size,
// for `zt offload probe PATH` and for comparing the swap bandwidth reached in training against
// the device's. It writes one temporary file of `bytes` (removed afterwards), syncs it, drops
// it from the page cache and reads it back.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "offload/pinned_pool.h"

namespace zt::offload {

struct BandwidthProbeOptions {
  std::string path;                      // an existing, writable directory
  uint64_t bytes = uint64_t{256} << 20;  // rounded up to a multiple of block_size
  uint32_t block_size = 1u << 20;        // a positive multiple of 4096
  uint32_t queue_depth = 32;             // 1..4096
  bool direct_io = true;
  WarningSink warn = WarnToStderr;
};

struct BandwidthResult {
  double write_gb_per_s = 0;  // 1e9 bytes per second, the fdatasync included
  double read_gb_per_s = 0;
  uint64_t bytes = 0;
  bool direct_io = false;  // false: buffered, and the read may have come from the page cache
  bool io_uring = false;
};

// InvalidArgument naming a bad option; the path's errors as SwapStore::Open's;
// ResourceExhausted naming the file and bytes when the filesystem cannot hold the probe file.
absl::StatusOr<BandwidthResult> ProbeBandwidth(const BandwidthProbeOptions& options);

}  // namespace zt::offload
