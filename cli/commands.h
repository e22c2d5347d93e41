// The verbs of `zt`, separated from argument parsing (main.cc) so each is a plain function
// of its flags that returns a status.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace zt::cli {

struct TrainFlags {
  std::string job_file;
  int64_t stop_after_step = -1;  // < 0: run to train.max_steps
  std::string run_dir;
  std::string export_path;
  std::string export_dtype = "fp32";
  int64_t sample_tokens = 0;
  std::string tokenizer = "bytes";
  std::string prompt = "\n";
  bool quiet = false;
  // The ranks this process runs, "A" or "A-B" (inclusive); empty: every rank of the job.
  std::string ranks;
  // Directory of the rendezvous store shared with the processes running the other ranks;
  // required when `ranks` is not every rank.
  std::string rendezvous;
  // Continue from the latest checkpoint of `resume_dir` (empty: the job's checkpoint.dir).
  bool resume = false;
  std::string resume_dir;
  // With resume: fall back to the newest older checkpoint that verifies.
  bool fallback = false;
};
absl::Status RunTrain(const TrainFlags& flags);

struct PrepareFlags {
  std::vector<std::string> inputs;
  std::string tokenizer;
  std::string out;
  std::string val_out;
  double val_fraction = 0.1;
};
absl::Status RunPrepare(const PrepareFlags& flags);

struct EstimateFlags {
  std::string job_file;
  int world_size = 0;   // 0: the job's parallel.world_size
  int zero_stage = -1;  // < 0: the job's parallel.zero_stage
  bool json = false;
};
absl::Status RunEstimate(const EstimateFlags& flags);

struct ExportFlags {
  // A checkpoint.dir (its `latest` step is exported) or one step directory.
  std::string checkpoint;
  std::string format = "hf";
  std::string out;
  std::string dtype = "fp32";
  int64_t max_shard_bytes = 5'000'000'000;  // transformers' default "5GB"
  bool quiet = false;
};
absl::Status RunExport(const ExportFlags& flags);

// 2 for errors in the user's input (InvalidArgument, NotFound, PermissionDenied,
// FailedPrecondition, OutOfRange, DataLoss), 1 otherwise.
int ExitCodeFor(const absl::Status& status);

}  // namespace zt::cli
