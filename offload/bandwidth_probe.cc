#include "offload/bandwidth_probe.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "offload/io_engine.h"
#include "offload/swap_env.h"

namespace zt::offload {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

absl::StatusOr<BandwidthResult> ProbeBandwidth(const BandwidthProbeOptions& options) {
  if (options.block_size == 0 || options.block_size % 4096 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("bandwidth probe: block_size ",
                                                   options.block_size,
                                                   " must be a positive multiple of 4096"));
  }
  if (options.bytes == 0) {
    return absl::InvalidArgumentError("bandwidth probe: bytes must be > 0");
  }
  ZT_RETURN_IF_ERROR(CheckWritableDirectory(options.path, "bandwidth probe"));
  const WarningSink warn = options.warn ? options.warn : WarningSink(WarnToStderr);
  ZT_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> engine, CreateIoEngine(options.queue_depth, warn));
  const uint64_t blocks = (options.bytes + options.block_size - 1) / options.block_size;
  const uint64_t bytes = blocks * options.block_size;

  // One buffer per I/O in flight; the bytes are not zeros, which some devices compress.
  const size_t buffer_bytes = size_t{options.queue_depth} * options.block_size;
  void* mem =
      mmap(nullptr, buffer_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("bandwidth probe: cannot map ", buffer_bytes, " bytes of buffers"));
  }
  absl::Cleanup unmap = [&] { munmap(mem, buffer_bytes); };
  auto* buffers = static_cast<std::byte*>(mem);
  for (size_t i = 0; i < buffer_bytes; ++i) buffers[i] = static_cast<std::byte>(i * 131 + 7);

  const std::string file = absl::StrCat(options.path, "/zt-bandwidth-probe-", getpid(), ".tmp");
  SwapEnv* env = DefaultSwapEnv();
  ZT_ASSIGN_OR_RETURN(const OpenedFile opened, env->Open(file, options.direct_io));
  absl::Cleanup remove = [&] {
    env->Close(opened.fd);
    unlink(file.c_str());
  };
  if (options.direct_io && !opened.direct) {
    warn(absl::StrCat("bandwidth probe: the filesystem of '", options.path,
                      "' refuses O_DIRECT; measuring buffered I/O"));
  }
  // Blocks reserved first, as the swap store's are, so the figure is that of writing, not of
  // allocating.
  ZT_RETURN_IF_ERROR(env->Preallocate(opened.fd, file, bytes));

  std::vector<IoOp> ops(blocks);
  for (uint64_t b = 0; b < blocks; ++b) {
    ops[b] = IoOp{.kind = IoOp::Kind::kWrite,
                  .fd = opened.fd,
                  .buf = buffers + (b % options.queue_depth) * options.block_size,
                  .length = options.block_size,
                  .offset = b * options.block_size,
                  .path = &file};
  }
  auto start = std::chrono::steady_clock::now();
  ZT_RETURN_IF_ERROR(engine->Run(ops));
  ZT_RETURN_IF_ERROR(engine->SyncData(opened.fd, file));
  const double write_s = Seconds(start);

  // Clean pages can be dropped: buffered reads then come from the device too.
  posix_fadvise(opened.fd, 0, static_cast<off_t>(bytes), POSIX_FADV_DONTNEED);
  for (IoOp& op : ops) op.kind = IoOp::Kind::kRead;
  start = std::chrono::steady_clock::now();
  ZT_RETURN_IF_ERROR(engine->Run(ops));
  const double read_s = Seconds(start);

  return BandwidthResult{.write_gb_per_s = static_cast<double>(bytes) / write_s / 1e9,
                         .read_gb_per_s = static_cast<double>(bytes) / read_s / 1e9,
                         .bytes = bytes,
                         .direct_io = opened.direct,
                         .io_uring = engine->uses_io_uring()};
}

}  // namespace zt::offload
