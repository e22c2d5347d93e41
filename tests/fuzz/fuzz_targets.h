// The job-spec fuzz target (issue 6, Security): arbitrary bytes through every way a job enters
// the system before it reaches the coordinator's planner, with the checks a daemon runs.
//
//   - as YAML text and as JSON text: ParseJobText (worker/job/job_file.h), then defaults and
//     validation (ValidatedJob with check_paths off: the fuzzer must not depend on the
//     filesystem) and the planner's view of the job (JobForPlanning);
//   - as a serialized zerotrain::JobSpec (what SubmitJob carries): ParseFromArray, then the
//     same stages.
//
// tests/fuzz/job_spec_fuzzer.cc hands libFuzzer's inputs to RunJobSpecInput, and
// tests/unit/worker/job/fuzz_regression_test.cc feeds it the checked-in corpus under the
// default (GCC) build, so what the fuzzer found stays fixed without clang. Header-only so both
// build it without a library of their own. Thread-safe (stateless).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "worker/job/job_file.h"
#include "worker/job/job_loading.h"

namespace zt::fuzz {

// What each path made of one input: OK when the job was accepted (parsed, defaulted,
// validated and planned as far as worker/job goes), else the first error.
struct JobSpecFuzzResult {
  absl::Status yaml;
  absl::Status json;
  absl::Status proto;
};

inline absl::Status ValidateForDaemon(zerotrain::JobSpec job) {
  // The coordinator's options (daemon/coordinator.cc SubmitValidated): paths are checked
  // against the allowed roots there, never opened here.
  const JobLoadOptions options{.check_paths = false, .check_engine_support = true};
  absl::StatusOr<zerotrain::JobSpec> validated = ValidatedJob(job, options);
  if (!validated.ok()) return validated.status();
  return JobForPlanning(std::move(job), options).status();
}

inline absl::Status ParseAndValidate(std::string_view text, JobFormat format) {
  absl::StatusOr<zerotrain::JobSpec> job = ParseJobText(text, format, "fuzz");
  if (!job.ok()) return job.status();
  return ValidateForDaemon(*std::move(job));
}

inline JobSpecFuzzResult RunJobSpecInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  JobSpecFuzzResult result;
  result.yaml = ParseAndValidate(text, JobFormat::kYaml);
  result.json = ParseAndValidate(text, JobFormat::kJson);
  zerotrain::JobSpec job;
  // ParseFromArray takes an int size; libFuzzer's inputs are far below 2 GiB.
  if (job.ParseFromArray(data, static_cast<int>(size))) {
    result.proto = ValidateForDaemon(std::move(job));
  } else {
    result.proto = absl::InvalidArgumentError("not a serialized JobSpec");
  }
  return result;
}

}  // namespace zt::fuzz
