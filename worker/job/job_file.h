// Job files: YAML or JSON text -> zerotrain::JobSpec, through protobuf's JSON mapping.
//
// proto/job.proto is the only schema. JSON is parsed by protobuf directly; YAML is first turned
// into that JSON by walking it with the JobSpec descriptor (worker/job/yaml_to_json.h), so both
// formats accept the same keys (proto names or lowerCamelCase) and the same values. Parsing
// does not apply defaults or validate: callers run ApplyJobDefaults (job_defaults.h) and then
// ValidateJobSpec (job_validation.h). Stateless and thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"

namespace zt {

enum class JobFormat { kYaml, kJson };

// Parses job text. `source_name` (usually the file path) prefixes every error message.
// Returns InvalidArgument for anything wrong with the text: syntax (with line and column),
// unknown fields (with the known ones), values of the wrong type or range, enum names that do
// not exist, and an empty document. Messages name the full field path ("model.n_head").
absl::StatusOr<zerotrain::JobSpec> ParseJobText(std::string_view text, JobFormat format,
                                                std::string_view source_name);

// Reads and parses the job file at `path`; the format follows the extension (.yaml, .yml or
// .json, any case). Returns NotFound naming the path when it does not exist, InvalidArgument
// for an unknown extension, a path that is not a regular file, a file over 16 MiB or any
// ParseJobText error, and PermissionDenied when it cannot be read.
absl::StatusOr<zerotrain::JobSpec> LoadJobFile(const std::string& path);

}  // namespace zt
