// `zt offload probe PATH [--block-size SIZE] [--queue-depth N] [--bytes SIZE] [--json]`: the
// write and read bandwidth of PATH's filesystem through the swap store's own I/O path
// (io_uring, O_DIRECT), at the block size and queue depth a job's offload.aio configures, to
// compare with `fio` and with the swap bandwidth training reaches (worker/offload/swap_probe.h).
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/commands.h"
#include "cli/output_format.h"
#include "nlohmann/json.hpp"
#include "worker/offload/swap_probe.h"
#include "worker/status_macros.h"

namespace zt::cli {

absl::Status RunOffloadProbe(const OffloadProbeFlags& flags) {
  SwapProbeOptions options{.path = flags.path, .queue_depth = flags.queue_depth};
  ZT_ASSIGN_OR_RETURN(options.block_size, ParseByteSize(flags.block_size, "--block-size"));
  ZT_ASSIGN_OR_RETURN(options.bytes, ParseByteSize(flags.bytes, "--bytes"));
  absl::StatusOr<SwapProbeResult> result = ProbeSwapBandwidth(options);
  if (!result.ok()) {
    return absl::Status(result.status().code(), absl::StrCat("offload probe ", flags.path, ": ",
                                                             result.status().message()));
  }
  if (flags.json) {
    const nlohmann::json out = {{"path", flags.path},
                                {"write_gb_per_s", result->write_gb_per_s},
                                {"read_gb_per_s", result->read_gb_per_s},
                                {"bytes", result->bytes},
                                {"block_size", options.block_size},
                                {"queue_depth", options.queue_depth},
                                {"direct_io", result->direct_io},
                                {"io_uring", result->io_uring}};
    std::cout << out.dump() << "\n";
    return absl::OkStatus();
  }
  std::cout << absl::StrFormat(
      "%s: write %.3f GB/s, read %.3f GB/s (%s at block size %s, queue depth %d; %s, %s)\n",
      flags.path, result->write_gb_per_s, result->read_gb_per_s, FormatBytes(result->bytes),
      FormatBytes(options.block_size), options.queue_depth,
      result->direct_io ? "O_DIRECT" : "buffered: the filesystem refused O_DIRECT",
      result->io_uring ? "io_uring" : "pread/pwrite: io_uring was refused");
  return absl::OkStatus();
}

}  // namespace zt::cli
