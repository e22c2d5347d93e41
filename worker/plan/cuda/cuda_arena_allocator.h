// CudaArenaAllocator: the ArenaAllocator of a rank on CUDA device `device`. Every category of
// the plan but pinned host is device memory, one cudaMalloc each (before the first step; the
// plan includes the cuBLASLt and attention workspaces, so nothing is allocated after); the
// pinned-host category is page-locked host memory (cudaHostAlloc), which the copy engines
// read and write at full speed. Both are zero-filled. Not thread-safe; Arenas calls it from
// the thread that builds them.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "worker/plan/arena.h"

namespace zt {

// FailedPrecondition when `device` is not a usable CUDA device.
absl::StatusOr<std::unique_ptr<ArenaAllocator>> MakeCudaArenaAllocator(int device);

}  // namespace zt
