// `zt train JOBFILE`: load and validate the job, train it in this process, then optionally
// export the weights and print a sample of generated text.
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "kernels/status_macros.h"
#include "worker/checkpoint/hf_interop.h"
#include "worker/data/tokenizer.h"
#include "worker/job/job_loading.h"
#include "worker/model/text_generation.h"
#include "worker/trainer.h"

namespace zt::cli {
namespace {

absl::StatusOr<DType> ParseExportDType(const std::string& s) {
  if (s == "fp32") return DType::kF32;
  if (s == "bf16") return DType::kBF16;
  if (s == "fp16") return DType::kF16;
  return absl::InvalidArgumentError(
      absl::StrCat("--export-dtype: '", s, "' is not one of fp32, bf16, fp16"));
}

absl::Status PrintSample(const Trainer& trainer, const TrainFlags& flags) {
  ZT_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizer(flags.tokenizer));
  std::vector<int32_t> prompt = tokenizer->Encode(flags.prompt);
  if (prompt.empty()) prompt.push_back(0);
  ZT_ASSIGN_OR_RETURN(std::vector<int32_t> tokens,
                      GenerateTokens(trainer.context(), trainer.job(), trainer.arenas(), prompt,
                                     {.new_tokens = flags.sample_tokens,
                                      .seed = trainer.job().train().seed()}));
  std::cout << "--- sample (" << tokens.size() << " tokens) ---\n"
            << flags.prompt << tokenizer->Decode(tokens) << "\n---\n";
  return absl::OkStatus();
}

}  // namespace

absl::Status RunTrain(const TrainFlags& flags) {
  ZT_ASSIGN_OR_RETURN(zerotrain::JobSpec job, LoadValidatedJob(flags.job_file));
  DType export_dtype = DType::kF32;
  if (!flags.export_path.empty()) {
    ZT_ASSIGN_OR_RETURN(export_dtype, ParseExportDType(flags.export_dtype));
  }
  if (flags.stop_after_step < 0) {
    return absl::InvalidArgumentError("--steps: must be ≥ 0");
  }
  TrainOptions options;
  options.run_dir = flags.run_dir.empty()
                        ? (std::filesystem::path("runs") / (job.name().empty() ? "job" : job.name()))
                              .string()
                        : flags.run_dir;
  options.stop_after_step = flags.stop_after_step;
  options.progress = !flags.quiet;
  ZT_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(job, options));
  if (!flags.quiet) {
    std::fprintf(stderr, "zt: %s, %lld parameters, plan %.1f MiB, metrics in %s\n",
                 job.name().empty() ? "job" : job.name().c_str(),
                 static_cast<long long>(trainer->model().layout().total_numel),
                 static_cast<double>(trainer->plan().TotalBytes()) / (1 << 20),
                 options.run_dir.c_str());
  }
  ZT_RETURN_IF_ERROR(trainer->Run());

  if (!flags.export_path.empty()) {
    std::vector<const float*> units;
    for (const Tensor& p : trainer->model().unit_params()) units.push_back(p.data<float>());
    ZT_RETURN_IF_ERROR(ExportHuggingFace(flags.export_path, job.model(),
                                         trainer->model().layout(), units, export_dtype));
    if (!flags.quiet) std::fprintf(stderr, "zt: exported %s\n", flags.export_path.c_str());
  }
  if (flags.sample_tokens > 0) ZT_RETURN_IF_ERROR(PrintSample(*trainer, flags));
  return absl::OkStatus();
}

}  // namespace zt::cli
