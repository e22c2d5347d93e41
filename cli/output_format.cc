#include "cli/output_format.h"

#include <cctype>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/util/json_util.h"

namespace zt::cli {

absl::StatusOr<int64_t> ParseByteSize(std::string_view text, std::string_view flag) {
  const std::string input(text), name(flag);
  const std::string s = absl::AsciiStrToLower(absl::StripAsciiWhitespace(input));
  size_t split = 0;
  while (split < s.size() &&
         (std::isdigit(static_cast<unsigned char>(s[split])) || s[split] == '.')) {
    ++split;
  }
  const std::string number = s.substr(0, split);
  const std::string unit(absl::StripAsciiWhitespace(s.substr(split)));
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1},       {"b", 1},        {"k", 0x1p10},   {"kib", 0x1p10}, {"kb", 1e3},
      {"m", 0x1p20}, {"mib", 0x1p20}, {"mb", 1e6},     {"g", 0x1p30},   {"gib", 0x1p30},
      {"gb", 1e9},   {"t", 0x1p40},   {"tib", 0x1p40}, {"tb", 1e12}};
  double scale = 0;
  for (const auto& [name, factor] : kUnits) {
    if (unit == name) scale = factor;
  }
  double value = 0;
  auto bad = [&](const char* rule) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": '", input, "' ", rule));
  };
  if (number.empty() || !absl::SimpleAtod(number, &value)) {
    return bad("is not a size (expected bytes, or a number and a unit like 16GiB)");
  }
  if (scale == 0) return bad("has an unknown unit (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)");
  const double bytes = std::floor(value * scale);
  if (!(bytes >= 1)) return bad("must be at least 1 byte");
  if (bytes > 0x1p62) return bad("is larger than 4 EiB");
  return static_cast<int64_t>(bytes);
}

std::string FormatBytes(int64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (std::fabs(value) >= 1024 && unit < 5) {
    value /= 1024;
    ++unit;
  }
  if (unit == 0) return absl::StrCat(bytes, " B");
  const int decimals = std::fabs(value) >= 100 ? 0 : std::fabs(value) >= 10 ? 1 : 2;
  return absl::StrFormat("%.*f %s", decimals, value, kUnits[unit]);
}

std::string FormatAge(int64_t ms) {
  if (ms < 0) return "-";
  const int64_t s = ms / 1000;
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrCat(s / 60, "m");
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, s % 86400 / 3600);
}

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message, bool indent) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = indent;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string out;
  const auto status = google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("printing ", message.GetTypeName(),
                                            " as JSON: ", status.message().as_string()));
  }
  if (!indent) return out;
  // add_whitespace ends with a newline; callers add their own.
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace zt::cli
