// One JSON object of a DeepSpeed config, read field by field with the checks every DeepSpeed key
// needs (type, "auto", integral numbers written as 5e8) and errors that name the config file
// and the full key ("ds.json: zero_optimization.stage: ..."). Used by deepspeed_config.cc only.
// A view: the JSON it reads must outlive it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace zt::job_internal {

// `text` as JSON writes a string: quoted, control characters escaped, so a value echoed in a
// message cannot forge a log line.
std::string Quoted(const std::string& text);

class DsSection {
 public:
  // `object` is a JSON object; `path` is its key path ("" for the top level).
  DsSection(const nlohmann::json* object, std::string source, std::string path);

  bool Has(const std::string& key) const;
  // The value is the string "auto": the job's value stands.
  bool IsAuto(const std::string& key) const;
  // "zero_optimization.stage" for key "stage" of section "zero_optimization".
  std::string Field(const std::string& key) const;
  // InvalidArgument "<source>: <field>: <rule>".
  absl::Status Error(const std::string& key, const std::string& rule) const;
  // The first key not in `known`, as an error that lists the known ones.
  absl::Status CheckKeys(const std::vector<std::string>& known) const;

  // Each returns nullopt when the key is absent or "auto", and InvalidArgument naming the field
  // when the value has another type.
  absl::StatusOr<std::optional<double>> Number(const std::string& key) const;
  // A number with no fractional part (DeepSpeed configs often write 5e8), within int64.
  absl::StatusOr<std::optional<int64_t>> Integer(const std::string& key) const;
  absl::StatusOr<std::optional<bool>> Bool(const std::string& key) const;
  absl::StatusOr<std::optional<std::string>> String(const std::string& key) const;
  // A nested object ("auto" is not accepted for a whole section).
  absl::StatusOr<std::optional<DsSection>> Object(const std::string& key) const;
  // The same, but an absent key reads as an empty object (a section whose keys all default).
  absl::StatusOr<DsSection> ObjectOrEmpty(const std::string& key) const;
  // The raw value of a present key, for the few shapes above do not cover (betas).
  const nlohmann::json& Raw(const std::string& key) const;

 private:
  const nlohmann::json* object_;
  std::string source_;
  std::string path_;
};

}  // namespace zt::job_internal
