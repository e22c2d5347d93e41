// `zt export`: a sharded checkpoint (worker/checkpoint/rank_state.h, docs/formats.md "Checkpoint
// directories") written out as a Hugging Face model directory (worker/checkpoint/hf_interop.h):
//   <out>/config.json                         GPT2Config or LlamaConfig fields, torch_dtype
//   <out>/model.safetensors                   every tensor, when they fit in max_shard_bytes
//   <out>/model-00001-of-0000N.safetensors …  otherwise, split in name-map order as
//   <out>/model.safetensors.index.json        transformers splits: {"metadata": {"total_size"},
//                                             "weight_map": {name: file}}
//
// Streaming: the exporter never holds the model. For each Hugging Face tensor it reads that
// tensor's contiguous range of its unit from the saved ranks' files (ReadUnitRange: only the
// bytes of that range, from whichever ranks hold it, at any world size and ZeRO stage),
// transposes it where the map says, converts it and appends it to the open safetensors file.
// The extra memory is one tensor in f32, twice for a transposed one: the saved bytes are
// converted 1 MiB at a time and their mapped pages released as they are passed.
//
// The weights are the fp32 master weights when the saved precision keeps them, else the
// parameters themselves; an export from fp32 equals `zt train --export` of the same state
// bit for bit.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"
#include "proto/job.pb.h"
#include "worker/checkpoint/checkpoint_directory.h"
#include "worker/checkpoint/hf_interop.h"

namespace zt {

// transformers' default max_shard_size, "5GB" (decimal).
inline constexpr int64_t kDefaultHfMaxShardBytes = 5'000'000'000;

struct CheckpointExportOptions {
  // F32, BF16 or F16 (rounded to nearest even).
  DType dtype = DType::kF32;
  // A file gets tensors while their bytes stay within this; a tensor larger than it gets a
  // file of its own. ≥ 1.
  int64_t max_shard_bytes = kDefaultHfMaxShardBytes;
  // Called before each read of a tensor's unit range [begin, end) (tests count the reads).
  std::function<void(const HfTensor& tensor, int64_t begin, int64_t end)> on_read;
};

struct CheckpointExportResult {
  std::string checkpoint;  // the step directory exported
  int64_t step = 0;
  // The files written into the output directory, in writing order (config.json last).
  std::vector<std::string> files;
  int64_t tensors = 0;
  int64_t total_bytes = 0;  // of the tensors' data, as the index's total_size
  // The most f32 values the exporter held at once (read buffer and transpose scratch).
  int64_t peak_buffer_floats = 0;
};

// The job that wrote `checkpoint`, as far as its manifest's state records it: the model
// config, the precision (defaults applied) and the parallel layout (world_size, zero_stage,
// shard_group_size, and tensor_parallel and pipeline_parallel (with its schedule and
// virtual_stages) when > 1: its rank files then hold tensor-parallel shares of their stage's
// units, which ExportCheckpoint and ReadCheckpointWeights join a unit at a time).
// FailedPrecondition naming the checkpoint when the state does not record the model or
// precision (written before manifests did); DataLoss naming it when a field does not parse or
// the layout is invalid.
absl::StatusOr<zerotrain::JobSpec> SavedJobSpec(const Checkpoint& checkpoint);

// Exports `checkpoint` — a checkpoint.dir (the step `latest` names) or one step directory
// (it holds manifest.json) — into the Hugging Face model directory `out_dir`, created when
// missing. Every rank file is verified against the manifest first: DataLoss naming the file
// when one is corrupt (the FindLoadable / Checkpoint::VerifyAll errors). InvalidArgument for a
// dtype other than F32/BF16/F16 or max_shard_bytes < 1, and for a model family other than GPT2
// and LLAMA; FailedPrecondition naming `out_dir` and the files when it already holds an export
// (config.json, model*.safetensors, the index), which is never overwritten piecemeal.
// Each file appears complete or not at all (written under a temporary name, synced, renamed).
absl::StatusOr<CheckpointExportResult> ExportCheckpoint(const std::string& checkpoint,
                                                        const std::string& out_dir,
                                                        const CheckpointExportOptions& options);

// The checkpoint `path` names — a step directory or a checkpoint.dir (its `latest` step) —
// opened, and every rank file verified against its manifest (DataLoss naming a corrupt one).
absl::StatusOr<std::unique_ptr<Checkpoint>> OpenVerified(const std::string& path);

// Whether `path` is a checkpoint: a checkpoint.dir (it has `latest`) or one step directory (it
// has manifest.json). model.init_from takes one, or a Hugging Face model directory.
bool IsCheckpoint(const std::string& path);

// The fp32 weights of `checkpoint` (a checkpoint.dir's `latest` step, or one step directory),
// written at any world size, ZeRO stage, tensor- and pipeline-parallel degree, into
// units[u][0, numel) of `model`'s layout (a null units[u] is not read: a pipeline stage reads
// only its own units): the master weights when the saved precision keeps them, else the
// parameters. Every rank file is
// verified first (DataLoss naming a corrupt one). FailedPrecondition naming the checkpoint
// and the first difference when it was saved for another model (family or a unit's size).
absl::Status ReadCheckpointWeights(const std::string& checkpoint,
                                   const zerotrain::ModelConfig& model,
                                   const std::vector<float*>& units);

}  // namespace zt
