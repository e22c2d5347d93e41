// YAML job text -> the JSON that protobuf's JSON mapping reads for a message type.
//
// YAML scalars carry no type of their own (`10`, `'10'`, `ten` are all text), so the text is
// walked together with the message's Descriptor: every scalar becomes the JSON type its field
// needs, and every mistake is reported with its full field path and its line and column.
// Protobuf's parser then builds the message from that JSON, so YAML and JSON job files share
// one mapping. Internal to worker/job; callers use job_file.h.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "google/protobuf/descriptor.h"

namespace zt::job_internal {

// Returns the JSON text of the single YAML document in `yaml_text`, read as a message of type
// `descriptor`. Rules, matching protobuf's JSON mapping where it has one:
//   - keys are field names as written in the .proto or their lowerCamelCase JSON names;
//     unknown keys and fields given twice (under either name) are errors;
//   - a null value (`key:` or `key: ~`) leaves the field at its default, as JSON null does;
//   - integers are decimal and must fit the field's type; floats accept YAML's .inf/.nan;
//     booleans are true/false; enums are value names (case-sensitive);
//   - a scalar or mapping given for a repeated field becomes a one-element list.
// Errors are InvalidArgument; each line reads
// "<source_name>:<line>:<column>: <field path>: <what is wrong>", all problems found at once.
absl::StatusOr<std::string> YamlToJson(std::string_view yaml_text,
                                       const google::protobuf::Descriptor& descriptor,
                                       std::string_view source_name);

}  // namespace zt::job_internal
