// The parts of a RankDevice on a CUDA GPU (worker/train/rank_device.h): the rank's GPU is
// `cuda_device` when ≥ 0 (placed by a coordinator), else local rank % the visible device count
// (ranks are threads of one process; cudaSetDevice is per thread, so this is called on the
// rank's thread); a compute stream of its own
// (non-blocking), a CudaCopyEngine on a copy stream beside it, arenas from
// MakeCudaArenaAllocator, scratch from cudaMalloc. Communicators: NCCL, each on a stream of
// its own ordered after the compute stream by events, when every rank of the job has a GPU of
// its own (placed by a coordinator, or world size ≤ device count), else staged through pinned host memory over Gloo with
// a CudaCopyEngine each.
//
// DeviceContext.allow_tf32 is the job's precision.allow_tf32 (off by default: TF32 off is the
// CPU-matching default, docs/cuda.md).
#pragma once

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "worker/train/rank_device.h"

namespace zt {

// FailedPrecondition naming the CUDA call and error when no GPU can be used, or naming
// `cuda_device` when it is not a visible GPU.
absl::StatusOr<RankDevice::Parts> CudaRankDeviceParts(const zerotrain::JobSpec& job, int rank,
                                                      int cuda_device);

}  // namespace zt
