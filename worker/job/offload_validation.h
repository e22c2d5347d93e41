// The rules of proto/job.proto's OffloadConfig (and resources.device_memory_bytes), DeepSpeed's
// where DeepSpeed has one, and the swap store's (offload/README.md) for sizes. Part of
// ValidateJobSpec and CheckJobPaths (worker/job/job_validation.h); kept apart because the
// offload tier's rules grow with it. Stateless and thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/job.pb.h"

namespace zt {

// The swap store's O_DIRECT unit (offload/swap_format.h's kExtentAlignment, checked equal
// where worker/offload includes both): ring buffers and I/O blocks are multiples of it.
inline constexpr int64_t kSwapAlignment = 4096;

// Whether the job keeps anything on NVMe (offload.optimizer or offload.params NVME): then
// offload.nvme_path is required and checked.
bool UsesNvme(const zerotrain::OffloadConfig& offload);
// Whether anything is offloaded at all.
bool UsesOffload(const zerotrain::OffloadConfig& offload);

// One line per violated rule, each naming the field, its value and the rule
// ("offload.params: NVME needs parallel.zero_stage 3 (got 2) ..."), on a spec that
// ApplyJobDefaults completed. Does not touch the file system. Empty when all hold.
std::vector<std::string> OffloadViolations(const zerotrain::JobSpec& spec);

// When the job uses NVMe: offload.nvme_path must be an existing directory this process may
// create files in (the swap store's own check, offload/swap_env.h). OK when it is (or NVMe is
// not used); else NotFound (missing), PermissionDenied (not writable or not searchable) or
// InvalidArgument (not a directory, or empty), naming the field and the path.
absl::Status CheckNvmePath(const zerotrain::JobSpec& spec);

}  // namespace zt
