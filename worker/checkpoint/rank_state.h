// What one rank writes into a checkpoint and reads back on resume: the bytes of its memory
// plan's model states — every "<unit>.params" buffer and every optimizer-state buffer (fp32
// master weights, moments, 8-bit codes and their scales, Adafactor statistics) — one
// safetensors tensor per buffer, named as the plan names it, in its own dtype. Restoring
// them into the same plan (same job, world size, stage and rank) continues the run bit for
// bit: gradients and activations are rebuilt every step, and the data position, the learning
// rate and stochastic rounding are functions of the step.
//
// Another parallel layout (world size, ZeRO stage, shard-group size) reshards on read. The
// parameters and master weights are a range of one unit's elements in unit order (whole units
// where they are not sharded), so a new rank copies, from each saved rank whose range
// overlaps its own, just the overlap, out of the memory-mapped file (the pages of the other
// ranges are never read). Optimizer states are moved tensor by tensor by
// worker/checkpoint/optimizer_state_reshard.h: fp32 moments, momentum and Adafactor's statistics bit
// for bit; 8-bit AdamW's blocks bit for bit where a new block is a saved one, requantized
// from the saved blocks it overlaps elsewhere.
// A LoRA job's adapters ("<unit>.lora") are whole on every rank and come from saved rank 0, and
// so does an NF4 or INT8 base below ZeRO stage 3; at stage 3 the base is each block's flat
// quantized bytes in byte shards ("<unit>.qbase", worker/plan/lora_plan.h), read by range
// from the saved ranks that overlap (ReadQuantizedUnitBytes), in either direction across
// stage 3. The adapters' optimizer states reshard as LoraAdapterLayout's units.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "worker/model/param_layout.h"
#include "worker/plan/arena.h"
#include "worker/plan/memory_plan.h"

namespace zt {

// The plan's buffers a checkpoint holds, in plan order.
// With `weights_only`, the parameters and master weights alone (checkpoint.save_optimizer
// false; the manifest's "optimizer_saved" says which a checkpoint holds).
std::vector<const BufferSpec*> CheckpointedBuffers(const MemoryPlan& plan,
                                                   bool weights_only = false);

// Writes those buffers from `arenas` to `path` (safetensors, synced).
absl::Status WriteRankState(const std::string& path, const MemoryPlan& plan, const Arenas& arenas,
                            bool weights_only = false);
// The same from wherever `source` says each buffer's bytes are (a staging copy).
using BufferSource = std::function<absl::StatusOr<const void*>(const BufferSpec&)>;
absl::Status WriteRankState(const std::string& path, const MemoryPlan& plan,
                            const BufferSource& source, bool weights_only = false);

// Reads them back from `path`. FailedPrecondition naming the file and the first buffer that
// is missing or has another dtype or size (the checkpoint was written for another layout).
absl::Status ReadRankState(const std::string& path, const MemoryPlan& plan, const Arenas& arenas,
                           bool weights_only = false);

// Elements [begin, end) of unit `unit`'s `role` ("master" or "params"; the fp32 weights are
// "master" when the job keeps master weights, joined from "params" and "master_low" when it
// splits them) as a checkpoint written by `saved_job` holds
// them, converted to f32 into out[0, end − begin): read from each saved rank whose range
// overlaps, touching only those bytes. For streaming exports: one tensor at a time.
// Bytes [lo, hi) of model unit `unit`'s flat quantized bytes (QuantizedBytesOf over
// `layout`, the saved job's model layout) as a checkpoint written by `saved_job` holds them:
// from the saved ranks' "<unit>.qbase" shards when it was saved at ZeRO stage 3, else from
// saved rank 0's per-tensor "<unit>.nf4.*" / "<unit>.int8.*" buffers. Alignment gaps and the
// padding past the last piece read as zero. FailedPrecondition naming the file and buffer
// when one is missing or short (a base from model.init_from is not saved).
absl::Status ReadQuantizedUnitBytes(const zerotrain::JobSpec& saved_job,
                                    const std::function<std::string(int)>& rank_file,
                                    const ModelLayout& layout, const UnitLayout& unit, int64_t lo,
                                    int64_t hi, uint8_t* out);

absl::Status ReadUnitRange(const zerotrain::JobSpec& saved_job,
                           const std::function<std::string(int)>& rank_file, int unit,
                           const std::string& role, int64_t begin, int64_t end, float* out);

// Fills rank `rank` of `job` (its plan `plan`, its `arenas`) from the files of a checkpoint
// written by `saved_job` — the same model, precision and optimizer on another parallel layout.
// `rank_file(r)` is the path of saved rank r's file. FailedPrecondition naming the file and
// the buffer when a saved buffer is missing, of another dtype or too short for the layout
// its manifest names; DataLoss naming the tensor when no saved rank holds part of its state.
absl::Status ReshardRankState(const zerotrain::JobSpec& saved_job,
                              const std::function<std::string(int)>& rank_file,
                              const zerotrain::JobSpec& job, int rank, const MemoryPlan& plan,
                              const Arenas& arenas, bool weights_only = false);

}  // namespace zt
