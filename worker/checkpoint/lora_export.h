// `zt export` of a LoRA job's checkpoint (docs/lora.md, "Checkpoints and export"): the trained
// adapters as a PEFT adapter directory (worker/checkpoint/peft_adapter.h), or with
// merge_adapters the merged model W + scale·B·A as a Hugging Face model directory
// (config.json + model.safetensors).
//
// Where the weights come from: the adapters are the "<unit>.lora" tensors of the checkpoint's
// rank 0 file (whole on every rank at ZeRO stages 0–2); the frozen base is the checkpoint's
// "<unit>.params" when it was generated from train.seed, and model.init_from's (a Hugging Face
// directory or a ZeroTrain checkpoint) when the job loaded it from there, since such a
// checkpoint does not hold it (IsCheckpointed). Holds the whole base in f32 for a merge.
// A quantized (NF4 or INT8) base merges as what its weights dequantize to (what the job
// trained against): a seeded one from the checkpoint's "<unit>.nf4.*" / "<unit>.int8.*"
// buffers, one from model.init_from by quantizing the file's values again as the job's start
// did; the merged model is written as the same model without base_dtype. Saved on pipeline
// stages or tensor-parallel ranks, a seeded quantized base is joined from the ranks' shares,
// each dequantized with its saving rank's layout (one rank's dequantized base bit for bit); at
// ZeRO stage 3 each share's bytes are first joined from its data-parallel group's
// "<unit>.qbase" byte shards.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"
#include "proto/job.pb.h"

namespace zt {

// Whether the checkpoint `checkpoint` (a checkpoint.dir or one step directory) was saved by a
// LoRA job (model.lora set). Verifies its files (OpenVerified's errors).
absl::StatusOr<bool> IsLoraCheckpoint(const std::string& checkpoint);

struct LoraExportOptions {
  // false: the PEFT adapter directory; true: the merged Hugging Face model.
  bool merge_adapters = false;
  // The merged model's dtype (F32, BF16 or F16); unused for the adapters (PEFT's F32). Unset:
  // the base's original dtype, that of model.init_from's Hugging Face weights
  // (HuggingFaceWeightsDType), else precision.param_dtype (a seeded base, or one from a
  // ZeroTrain checkpoint); a quantized base merges in the dtype it was quantized from.
  std::optional<DType> dtype;
};

struct LoraExportResult {
  std::string checkpoint;  // the step directory exported
  int64_t step = 0;
};

// Writes the export into `out_dir` (created when missing). FailedPrecondition naming the
// checkpoint when it holds no adapters (not a LoRA job's); the checkpoint, safetensors, PEFT
// and Hugging Face writers' errors
// otherwise, each naming its file.
absl::StatusOr<LoraExportResult> ExportLoraCheckpoint(const std::string& checkpoint,
                                                      const std::string& out_dir,
                                                      const LoraExportOptions& options);

}  // namespace zt
