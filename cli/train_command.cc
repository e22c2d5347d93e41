// `zt train JOBFILE`: load and validate the job, train it in this process, then optionally
// export the weights and print a sample of generated text.
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
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
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(flags.tokenizer);
  if (!tokenizer.ok()) return tokenizer.status();
  std::vector<int32_t> prompt = (*tokenizer)->Encode(flags.prompt);
  if (prompt.empty()) prompt.push_back(0);
  absl::StatusOr<std::vector<int32_t>> tokens =
      GenerateTokens(trainer.context(), trainer.job(), trainer.arenas(), prompt,
                     {.new_tokens = flags.sample_tokens, .seed = trainer.job().train().seed()});
  if (!tokens.ok()) return tokens.status();
  std::cout << "--- sample (" << tokens->size() << " tokens) ---\n"
            << flags.prompt << (*tokenizer)->Decode(*tokens) << "\n---\n";
  return absl::OkStatus();
}

}  // namespace

absl::Status RunTrain(const TrainFlags& flags) {
  absl::StatusOr<zerotrain::JobSpec> loaded = LoadValidatedJob(flags.job_file);
  if (!loaded.ok()) return loaded.status();
  const zerotrain::JobSpec& job = *loaded;
  absl::StatusOr<DType> export_dtype = ParseExportDType(flags.export_dtype);
  if (!export_dtype.ok()) return export_dtype.status();
  TrainOptions options;
  options.run_dir = flags.run_dir.empty()
                        ? (std::filesystem::path("runs") / (job.name().empty() ? "job" : job.name()))
                              .string()
                        : flags.run_dir;
  if (flags.stop_after_step >= 0) options.stop_after_step = flags.stop_after_step;
  options.progress = !flags.quiet;
  absl::StatusOr<std::unique_ptr<Trainer>> created = Trainer::Create(job, options);
  if (!created.ok()) return created.status();
  Trainer* trainer = created->get();
  if (!flags.quiet) {
    std::fprintf(stderr, "zt: %s, %lld parameters, plan %.1f MiB, metrics in %s\n",
                 job.name().empty() ? "job" : job.name().c_str(),
                 static_cast<long long>(trainer->model().layout().total_numel),
                 static_cast<double>(trainer->plan().TotalBytes()) / (1 << 20),
                 options.run_dir.c_str());
  }
  if (absl::Status s = trainer->Run(); !s.ok()) return s;

  if (!flags.export_path.empty()) {
    std::vector<const float*> units;
    for (const Tensor& p : trainer->fp32_weights()) units.push_back(p.data<float>());
    if (absl::Status s = ExportHuggingFace(flags.export_path, job.model(),
                                           trainer->model().layout(), units, *export_dtype);
        !s.ok()) {
      return s;
    }
    if (!flags.quiet) std::fprintf(stderr, "zt: exported %s\n", flags.export_path.c_str());
  }
  if (flags.sample_tokens > 0) return PrintSample(*trainer, flags);
  return absl::OkStatus();
}

}  // namespace zt::cli
