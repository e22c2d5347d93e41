// What one rank writes into a checkpoint and reads back on resume: the bytes of its memory
// plan's model states — every "<unit>.params" buffer and every optimizer-state buffer (fp32
// master weights, moments, 8-bit codes and their scales, Adafactor statistics) — one
// safetensors tensor per buffer, named as the plan names it, in its own dtype. Restoring
// them into the same plan (same job, world size, stage and rank) continues the run bit for
// bit: gradients and activations are rebuilt every step, and the data position, the learning
// rate and stochastic rounding are functions of the step.
//
// Resuming on another parallel layout needs the buffers resharded on read (a unit's range
// maps to other ranks' buffers); until that lands, a file written for another layout is
// refused with an error naming what differs.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/plan/arena.h"
#include "worker/plan/memory_plan.h"

namespace zt {

// The plan's buffers a checkpoint holds, in plan order.
std::vector<const BufferSpec*> CheckpointedBuffers(const MemoryPlan& plan);

// Writes those buffers from `arenas` to `path` (safetensors, synced).
absl::Status WriteRankState(const std::string& path, const MemoryPlan& plan, const Arenas& arenas);

// Reads them back from `path`. FailedPrecondition naming the file and the first buffer that
// is missing or has another dtype or size (the checkpoint was written for another layout).
absl::Status ReadRankState(const std::string& path, const MemoryPlan& plan, const Arenas& arenas);

}  // namespace zt
