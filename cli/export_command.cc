// `zt export CHECKPOINT [--format hf] --out DIR [--dtype fp32|bf16|fp16] [--max-shard-bytes N]`:
// a sharded checkpoint (a checkpoint.dir's latest step, or one step directory) written out as
// a Hugging Face model directory, streaming tensor by tensor (worker/checkpoint/checkpoint_export.h).
// A LoRA job's checkpoint becomes its PEFT adapter directory, or with --merge-adapters the
// merged model (worker/checkpoint/lora_export.h).
#include <cstdio>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/commands.h"
#include "worker/checkpoint/checkpoint_export.h"
#include "worker/checkpoint/lora_export.h"

namespace zt::cli {

absl::Status RunExport(const ExportFlags& flags) {
  if (flags.format != "hf") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format: '", flags.format, "' is not a known format; only hf"));
  }
  CheckpointExportOptions options;
  if (flags.dtype.empty() || flags.dtype == "fp32") {
    options.dtype = DType::kF32;
  } else if (flags.dtype == "bf16") {
    options.dtype = DType::kBF16;
  } else if (flags.dtype == "fp16") {
    options.dtype = DType::kF16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype: '", flags.dtype, "' is not one of fp32, bf16, fp16"));
  }
  if (flags.max_shard_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-shard-bytes: ", flags.max_shard_bytes, " must be ≥ 1"));
  }
  options.max_shard_bytes = flags.max_shard_bytes;
  absl::StatusOr<bool> lora = IsLoraCheckpoint(flags.checkpoint);
  if (!lora.ok()) return lora.status();
  if (*lora) {
    absl::StatusOr<LoraExportResult> exported = ExportLoraCheckpoint(
        flags.checkpoint, flags.out,
        {.merge_adapters = flags.merge_adapters,
         .dtype = flags.dtype.empty() ? std::nullopt : std::optional<DType>(options.dtype)});
    if (!exported.ok()) return exported.status();
    if (!flags.quiet) {
      std::fprintf(stderr, "zt: exported step %lld of %s to %s (%s)\n",
                   static_cast<long long>(exported->step), exported->checkpoint.c_str(),
                   flags.out.c_str(),
                   flags.merge_adapters ? "merged Hugging Face model" : "PEFT adapters");
    }
    return absl::OkStatus();
  }
  if (flags.merge_adapters) {
    return absl::InvalidArgumentError(
        absl::StrCat("--merge-adapters: checkpoint '", flags.checkpoint,
                     "' was not saved by a LoRA job; export it without the flag"));
  }
  absl::StatusOr<CheckpointExportResult> result =
      ExportCheckpoint(flags.checkpoint, flags.out, options);
  if (!result.ok()) return result.status();
  if (!flags.quiet) {
    std::fprintf(stderr, "zt: exported step %lld of %s to %s: %lld tensors, %lld bytes (%s)\n",
                 static_cast<long long>(result->step), result->checkpoint.c_str(),
                 flags.out.c_str(), static_cast<long long>(result->tensors),
                 static_cast<long long>(result->total_bytes),
                 absl::StrJoin(result->files, ", ").c_str());
  }
  return absl::OkStatus();
}

}  // namespace zt::cli
