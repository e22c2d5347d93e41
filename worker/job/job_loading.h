// The one entry every verb uses to turn a job file into a JobSpec the engine can run:
// parse (YAML/JSON) → apply defaults → validate the rules → check the paths → check that
// this engine supports what the job asks. The first failing stage's error is returned; each
// stage reports all of its violations at once.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"

namespace zt {

struct JobLoadOptions {
  // Check that data files and init_from exist (off for tools that only plan, like estimate).
  bool check_paths = true;
  // Check that this engine can train the job (off for tools that only plan).
  bool check_engine_support = true;
  // A DeepSpeed ds_config.json laid over the job file after parsing, before defaults
  // (worker/job/deepspeed_config.h); empty: none. Only the Load* functions read it.
  std::string deepspeed_config;
  // The world size of DeepSpeed's batch rule; 0: the job's parallel.world_size.
  int deepspeed_world_size = 0;
  // ≥ 0: replaces parallel.zero_stage before defaults and validation (`zt estimate
  // --zero-stage`), so the rules that depend on the stage (offload's) see the one planned.
  // Only the Load* functions read it.
  int zero_stage = -1;
};

// The job file as written with options.deepspeed_config laid over it (and options.zero_stage
// when ≥ 0): no defaults, no validation. Errors as LoadJobFile's and ApplyDeepSpeedConfigFile's
// (each names its file).
absl::StatusOr<zerotrain::JobSpec> LoadJobSource(const std::string& path,
                                                 const JobLoadOptions& options = {});

absl::StatusOr<zerotrain::JobSpec> LoadValidatedJob(const std::string& path,
                                                    const JobLoadOptions& options = {});
// The same stages for a job already parsed (from an RPC, or a test).
absl::StatusOr<zerotrain::JobSpec> ValidatedJob(zerotrain::JobSpec job,
                                                const JobLoadOptions& options = {});

// The sharding planner's input (worker/plan/sharding_planner.h): the stages above run on a
// copy with every default applied, and the spec returned has those defaults too, except
// parallel.zero_stage, tensor_parallel, pipeline_parallel, shard_group_size (its default
// follows the layout), memory.activation_checkpointing, offload.optimizer and offload.params,
// which stay as the job file left them (unset / *_UNSPECIFIED: the planner chooses). An
// offload the job sets with the stage unset is validated at the lowest stage allowing it.
// Errors as ValidatedJob's.
absl::StatusOr<zerotrain::JobSpec> JobForPlanning(zerotrain::JobSpec job,
                                                  const JobLoadOptions& options = {});
// The same for a job file; errors as LoadValidatedJob's (each line names the file).
absl::StatusOr<zerotrain::JobSpec> LoadJobForPlanning(const std::string& path,
                                                      const JobLoadOptions& options = {});

}  // namespace zt
