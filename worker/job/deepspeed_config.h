// DeepSpeed configs (ds_config.json) laid over a parsed JobSpec, so people who arrive with one
// train the same job: `zt train|submit|estimate JOB --deepspeed ds_config.json`.
//
// docs/deepspeed.md is the field-by-field table (DeepSpeed key → JobSpec field, units, what is
// refused and why). The rules in short:
//  - A key the config writes replaces the job file's value; a key it leaves out leaves the
//    job's value, except inside a section the config gives (optimizer.params, scheduler.params,
//    fp16), where an absent key takes DeepSpeed's own default, because that is what the same
//    config trained with under DeepSpeed.
//  - "auto" (Hugging Face's convention) keeps the job's value.
//  - Batch sizes follow DeepSpeed's rule train_batch_size = micro × accumulation × data-parallel
//    world size: any two determine the third; all three must agree.
//  - Anything ZeroTrain cannot do as DeepSpeed would (offloading activations, log warmup,
//  L2-coupled weight
//    decay, an optimizer it lacks, an unknown key) is an InvalidArgument error naming the file,
//    the field and the rule, never dropped. Known keys that change nothing numerically
//    (logging, profiling, communication bucketing ZeroTrain does its own way) are accepted.
//
// Pure: no defaults are applied and nothing is validated beyond the config itself; callers run
// ValidatedJob (job_loading.h) on the result. Stateless and thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"

namespace zt {

struct DeepSpeedOptions {
  // The data-parallel world size of DeepSpeed's batch rule; 0: the job's parallel.world_size
  // (1 when the job leaves it unset). `zt estimate --world-size N` passes N.
  int world_size = 0;
};

// Lays the DeepSpeed config `json_text` over `job`. `source_name` (the config's path) starts
// every error message. Returns InvalidArgument for malformed JSON (with line and column), a
// value of the wrong type or range, contradicting batch sizes, an unknown key, and any field
// ZeroTrain has no equivalent for. Every section is read: the message has one line per
// section that is wrong.
absl::StatusOr<zerotrain::JobSpec> ApplyDeepSpeedConfig(std::string_view json_text,
                                                        std::string_view source_name,
                                                        zerotrain::JobSpec job,
                                                        const DeepSpeedOptions& options = {});

// Reads the config at `path` and applies it as above. NotFound when the file does not exist,
// InvalidArgument when it is not a regular file or is over 16 MiB, PermissionDenied when it
// cannot be read.
absl::StatusOr<zerotrain::JobSpec> ApplyDeepSpeedConfigFile(const std::string& path,
                                                            zerotrain::JobSpec job,
                                                            const DeepSpeedOptions& options = {});

}  // namespace zt
