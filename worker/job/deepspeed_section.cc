#include "worker/job/deepspeed_section.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace zt::job_internal {

std::string Quoted(const std::string& text) { return nlohmann::json(text).dump(); }

DsSection::DsSection(const nlohmann::json* object, std::string source, std::string path)
    : object_(object), source_(std::move(source)), path_(std::move(path)) {}

bool DsSection::Has(const std::string& key) const { return object_->contains(key); }

bool DsSection::IsAuto(const std::string& key) const {
  const auto it = object_->find(key);
  return it != object_->end() && it->is_string() && it->get<std::string>() == "auto";
}

std::string DsSection::Field(const std::string& key) const {
  // A key is echoed as written unless it holds a control character.
  const bool plain = std::none_of(key.begin(), key.end(), [](char c) {
    return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
  });
  const std::string name = plain ? key : Quoted(key);
  return path_.empty() ? name : absl::StrCat(path_, ".", name);
}

absl::Status DsSection::Error(const std::string& key, const std::string& rule) const {
  return absl::InvalidArgumentError(absl::StrCat(source_, ": ", Field(key), ": ", rule));
}

absl::Status DsSection::CheckKeys(const std::vector<std::string>& known) const {
  for (const auto& [key, value] : object_->items()) {
    bool found = false;
    for (const std::string& k : known) found = found || k == key;
    if (!found) {
      return Error(key, absl::StrCat("not a key ZeroTrain maps (docs/deepspeed.md); known here: ",
                                     absl::StrJoin(known, ", ")));
    }
  }
  return absl::OkStatus();
}

const nlohmann::json& DsSection::Raw(const std::string& key) const { return object_->at(key); }

absl::StatusOr<std::optional<double>> DsSection::Number(const std::string& key) const {
  if (!Has(key) || IsAuto(key)) return std::nullopt;
  const nlohmann::json& v = object_->at(key);
  if (!v.is_number())
    return Error(key, absl::StrCat("must be a number or \"auto\" (got ", v.dump(), ")"));
  const double d = v.get<double>();
  if (!std::isfinite(d)) return Error(key, "must be finite");
  return d;
}

absl::StatusOr<std::optional<int64_t>> DsSection::Integer(const std::string& key) const {
  if (!Has(key) || IsAuto(key)) return std::nullopt;
  const nlohmann::json& v = object_->at(key);
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Error(key, absl::StrCat("out of range (got ", v.dump(), ")"));
    }
    return static_cast<int64_t>(v.get<uint64_t>());
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    // 2^63 is the first double past int64's range.
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2233720368547758e18) {
      return static_cast<int64_t>(d);
    }
  }
  return Error(key, absl::StrCat("must be an integer or \"auto\" (got ", v.dump(), ")"));
}

absl::StatusOr<std::optional<bool>> DsSection::Bool(const std::string& key) const {
  if (!Has(key) || IsAuto(key)) return std::nullopt;
  const nlohmann::json& v = object_->at(key);
  if (!v.is_boolean()) {
    return Error(key, absl::StrCat("must be true, false or \"auto\" (got ", v.dump(), ")"));
  }
  return v.get<bool>();
}

absl::StatusOr<std::optional<std::string>> DsSection::String(const std::string& key) const {
  if (!Has(key) || IsAuto(key)) return std::nullopt;
  const nlohmann::json& v = object_->at(key);
  if (!v.is_string()) return Error(key, absl::StrCat("must be a string (got ", v.dump(), ")"));
  return v.get<std::string>();
}

absl::StatusOr<std::optional<DsSection>> DsSection::Object(const std::string& key) const {
  if (!Has(key)) return std::nullopt;
  const nlohmann::json& v = object_->at(key);
  if (!v.is_object()) return Error(key, absl::StrCat("must be an object (got ", v.dump(), ")"));
  return DsSection(&v, source_, Field(key));
}

absl::StatusOr<DsSection> DsSection::ObjectOrEmpty(const std::string& key) const {
  static const nlohmann::json* const kEmpty = new nlohmann::json(nlohmann::json::object());
  if (!Has(key)) return DsSection(kEmpty, source_, Field(key));
  absl::StatusOr<std::optional<DsSection>> object = Object(key);
  if (!object.ok()) return object.status();
  return **object;
}

}  // namespace zt::job_internal
