#include "worker/job/offload_validation.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "offload/swap_env.h"

namespace zt {
namespace {

using zerotrain::OffloadConfig;

constexpr int64_t kAlignment = kSwapAlignment;
// Bounds that keep a hostile job from overflowing the plan's byte counts (buffer_count ×
// buffer_size) or the store's 32-bit block size; far above any real configuration.
constexpr int32_t kMaxBufferCount = 1024;
constexpr int64_t kMaxBufferSize = int64_t{1} << 40;
constexpr int64_t kMaxBlockSize = int64_t{1} << 30;
constexpr int32_t kMaxQueueDepth = 4096;

std::string DeviceName(OffloadConfig::Device d) {
  const std::string name = OffloadConfig::Device_Name(d);
  return name.empty() ? absl::StrCat(static_cast<int>(d)) : name;
}

bool KnownDevice(OffloadConfig::Device d) {
  return d == OffloadConfig::NONE || d == OffloadConfig::CPU || d == OffloadConfig::NVME;
}

// `field` must be a multiple of the swap store's unit within (0, max].
void CheckAlignedSize(const std::string& field, bool has, int64_t value, int64_t max,
                      std::vector<std::string>& lines) {
  if (!has) {
    lines.push_back(absl::StrCat(field, ": not set (ApplyJobDefaults must run before validation)"));
    return;
  }
  if (value <= 0 || value % kAlignment != 0 || value > max) {
    lines.push_back(absl::StrCat(field, ": must be a positive multiple of ", kAlignment,
                                 " bytes (the swap store's O_DIRECT unit), at most ", max, " (got ",
                                 value, ")"));
  }
}

}  // namespace

bool UsesNvme(const OffloadConfig& offload) {
  return offload.optimizer() == OffloadConfig::NVME || offload.params() == OffloadConfig::NVME;
}

bool UsesOffload(const OffloadConfig& offload) {
  auto moved = [](OffloadConfig::Device d) {
    return d == OffloadConfig::CPU || d == OffloadConfig::NVME;
  };
  return moved(offload.optimizer()) || moved(offload.params());
}

std::vector<std::string> OffloadViolations(const zerotrain::JobSpec& spec) {
  std::vector<std::string> lines;
  const OffloadConfig& o = spec.offload();
  const int stage = spec.parallel().zero_stage();
  if (!KnownDevice(o.optimizer())) {
    lines.push_back(absl::StrCat("offload.optimizer: must be NONE, CPU or NVME (got ",
                                 DeviceName(o.optimizer()), ")"));
  } else if (o.optimizer() != OffloadConfig::NONE && stage < 1) {
    // DeepSpeed's rule: what moves is the rank's shard of the optimizer state.
    lines.push_back(absl::StrCat("offload.optimizer: ", DeviceName(o.optimizer()),
                                 " needs parallel.zero_stage >= 1 (got ", stage,
                                 "): the offloaded optimizer state is the rank's ZeRO shard"));
  }
  if (!KnownDevice(o.params())) {
    lines.push_back(absl::StrCat("offload.params: must be NONE, CPU or NVME (got ",
                                 DeviceName(o.params()), ")"));
  } else if (o.params() != OffloadConfig::NONE && stage != 3) {
    lines.push_back(absl::StrCat("offload.params: ", DeviceName(o.params()),
                                 " needs parallel.zero_stage 3 (got ", stage,
                                 "): only stage 3 shards the parameters"));
  }
  if (KnownDevice(o.optimizer()) && o.optimizer() != OffloadConfig::NONE &&
      spec.precision().split_master_weights()) {
    // The split master's high halves are the bf16 parameters on the device: the host step
    // would have half of each master weight.
    lines.push_back(absl::StrCat("offload.optimizer: ", DeviceName(o.optimizer()),
                                 " cannot be combined with precision.split_master_weights (the "
                                 "master weights' high halves are the device's parameters)"));
  }
  if (o.delayed_update().enabled() && o.optimizer() != OffloadConfig::CPU &&
      o.optimizer() != OffloadConfig::NVME) {
    // The delayed update overlaps the host step with the next step's compute: there must be a
    // host step.
    lines.push_back(absl::StrCat(
        "offload.delayed_update.enabled: true needs offload.optimizer "
        "CPU or NVME (got ",
        DeviceName(o.optimizer()), "): it overlaps the host optimizer step with the next step"));
  }
  if (o.delayed_update().after_steps() < 0) {
    lines.push_back(absl::StrCat("offload.delayed_update.after_steps: must be >= 0 (got ",
                                 o.delayed_update().after_steps(), ")"));
  }
  if (UsesNvme(o) && o.nvme_path().empty()) {
    lines.push_back(absl::StrCat("offload.nvme_path: required when offload.optimizer (",
                                 DeviceName(o.optimizer()), ") or offload.params (",
                                 DeviceName(o.params()), ") is NVME: the swap store's directory"));
  }
  if (!o.has_buffer_count()) {
    lines.push_back("offload.buffer_count: not set (ApplyJobDefaults must run before validation)");
  } else if (o.buffer_count() < 1 || o.buffer_count() > kMaxBufferCount) {
    lines.push_back(absl::StrCat("offload.buffer_count: must be in 1..", kMaxBufferCount, " (got ",
                                 o.buffer_count(), ")"));
  }
  CheckAlignedSize("offload.buffer_size", o.has_buffer_size(), o.buffer_size(), kMaxBufferSize,
                   lines);
  CheckAlignedSize("offload.aio.block_size", o.aio().has_block_size(), o.aio().block_size(),
                   kMaxBlockSize, lines);
  if (!o.aio().has_queue_depth()) {
    lines.push_back(
        "offload.aio.queue_depth: not set (ApplyJobDefaults must run before validation)");
  } else if (o.aio().queue_depth() < 1 || o.aio().queue_depth() > kMaxQueueDepth) {
    lines.push_back(absl::StrCat("offload.aio.queue_depth: must be in 1..", kMaxQueueDepth,
                                 " (got ", o.aio().queue_depth(), ")"));
  }
  if (spec.resources().device_memory_bytes() < 0) {
    lines.push_back(absl::StrCat("resources.device_memory_bytes: must be >= 0 (got ",
                                 spec.resources().device_memory_bytes(), ")"));
  }
  return lines;
}

absl::Status CheckNvmePath(const zerotrain::JobSpec& spec) {
  if (!UsesNvme(spec.offload())) return absl::OkStatus();
  if (spec.offload().nvme_path().empty()) {
    return absl::InvalidArgumentError("offload.nvme_path: the path is empty");
  }
  // The swap store's own check, so validation refuses exactly what opening the store would.
  return offload::CheckWritableDirectory(spec.offload().nvme_path(), "offload.nvme_path");
}

}  // namespace zt
