// The memory plan: every buffer a rank allocates, computed from the job before the first step.
//
// The plan is data (llm.c-style): a pure function walks the model config and fills a table of
// named buffer specs, each in one category. The engine then takes one allocation per category
// (an Arena) and carves it by walking the same table, so nothing is allocated inside the step
// loop and the plan's totals are the engine's memory, byte for byte. `zt estimate` and the
// coordinator's planner answer from the same function.
//
// Buffer names (B micro-batch, T seq_len, C d_model, Q qkv width, F d_ff, V vocab):
//   parameters:  "<unit>.params"                       each unit's flat f32 buffer
//   gradients:   "<unit>.grads"                        same size, fp32 accumulation
//   optimizer:   "<unit>.<state>" as worker/plan/optimizer_state_layout.h lays them out
//                (AdamW's adam_m/adam_v, 8-bit codes and absmax, Adafactor's statistics)
//   activations: "residual.<i>" (B·T, C) for i in 0..L  the residual stream between units
//                "block.<i>.<name>"                     what block i saves for backward
//                "head.<name>"                          what the head saves
//   workspace:   "tokens", "targets" (B·T) i32, "logits" (B·T, V) (overwritten by its
//                gradient), "gemm_workspace" u8 (the GEMM scratch the rank's DeviceContext
//                points at), and the backward's reusable gradient scratch "grad.<name>"
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "kernels/dtype.h"
#include "proto/job.pb.h"

namespace zt {

enum class MemoryCategory : uint8_t {
  kParameters,
  kGradients,
  kOptimizerState,
  kActivations,
  kWorkspace,
  kCommunication,
  kPinnedHost,
  kNvme,
};
inline constexpr int kMemoryCategoryCount = 8;

// "parameters", "gradients", "optimizer", "activations", "workspace", "communication",
// "pinned_host", "nvme": the keys of `zt estimate --json` and of the metrics.
const char* MemoryCategoryName(MemoryCategory c);

struct BufferSpec {
  std::string name;
  MemoryCategory category = MemoryCategory::kWorkspace;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;

  int64_t numel() const;
  int64_t bytes() const { return numel() * DTypeSize(dtype); }
};

// Every buffer starts on this boundary inside its arena (a cache line; AVX-512 loads).
inline constexpr int64_t kBufferAlignment = 64;

inline int64_t AlignedBytes(int64_t bytes) {
  return (bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
}

struct MemoryPlan {
  std::vector<BufferSpec> buffers;

  // Bytes an arena of this category holds: the sum of its buffers, each aligned.
  int64_t CategoryBytes(MemoryCategory c) const;
  int64_t TotalBytes() const;
};

// The context a training rank of `job` runs its ops on (CPU, resources.cpu_threads threads),
// without its workspace: the plan sizes that for this context, the engine points it at the
// plan's "gemm_workspace". The trainer and the plan both take it from here, so they agree.
DeviceContext JobDeviceContext(const zerotrain::JobSpec& job);

// The plan of training rank `rank` of `job` (defaults applied, validated), for the context
// JobDeviceContext(job). Precision decides the dtypes (parameters in param_dtype, fp32
// master weights when master_weights, gradients in grad_dtype, activations in
// compute_dtype); parallel.world_size N and zero_stage S divide the model states as ZeRO
// does: S ≥ 1 shards the optimizer state and master weights, S ≥ 2 the gradients (plus one
// unit's full gradient before its reduce-scatter), S = 3 the parameters (plus two gathered
// units: the one computed and the one prefetched). A shard is rank's 1/N of the unit's
// buffer padded to a multiple of N·kShardAlignmentElements.
MemoryPlan PlanMemory(const zerotrain::JobSpec& job, int rank = 0);

// Elements a unit's flat buffer is padded to so that it splits into N equal, aligned shards.
inline constexpr int64_t kShardAlignmentElements = 64;
int64_t PaddedUnitNumel(int64_t unit_numel, int world_size);

// Forward-only buffers (activations and workspace, no parameters or states) for `batch`
// sequences of `seq_len` tokens, the GEMM scratch sized for `ctx`: text generation after
// training plans its own.
MemoryPlan PlanInference(const zerotrain::JobSpec& job, const DeviceContext& ctx, int64_t batch,
                         int64_t seq_len);

}  // namespace zt
