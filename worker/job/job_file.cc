#include "worker/job/job_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/util/json_util.h"
#include "kernels/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/job/yaml_to_json.h"

namespace zt {
namespace {

// A job file is a few hundred bytes; anything this large is the wrong file.
constexpr std::uintmax_t kMaxJobFileBytes = 16u << 20;

// Protobuf's JSON syntax errors carry no position; nlohmann's SAX parser (iterative, so deep
// nesting cannot exhaust the stack) finds where the text stops being JSON.
class SyntaxErrorFinder : public nlohmann::json_sax<nlohmann::json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& error) override {
    position_ = position;
    const std::string what = error.what();
    const size_t rule = what.find("syntax error");
    message_ = rule == std::string::npos ? what : what.substr(rule);
    return false;
  }

  // "<line>:<column>: <what is wrong>" when `text` is not JSON.
  std::optional<std::string> Find(std::string_view text) {
    try {
      nlohmann::json::sax_parse(text.begin(), text.end(), this);
    } catch (const std::exception&) {
      return std::nullopt;  // Only a position is lost: protobuf's message still stands.
    }
    if (message_.empty()) return std::nullopt;
    // position_ counts the bytes read, the offending one included.
    const size_t end = std::min(text.size(), position_ > 0 ? position_ - 1 : 0);
    size_t line = 1;
    size_t line_start = 0;
    for (size_t i = 0; i < end; ++i) {
      if (text[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    }
    return absl::StrCat(line, ":", end - line_start + 1, ": JSON ", message_);
  }

 private:
  std::size_t position_ = 0;
  std::string message_;
};

absl::StatusOr<zerotrain::JobSpec> ParseJson(std::string_view json, absl::string_view source_name,
                                             bool from_yaml) {
  zerotrain::JobSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &spec, options);
  if (!status.ok()) {
    if (!from_yaml) {
      if (std::optional<std::string> syntax = SyntaxErrorFinder().Find(json)) {
        return absl::InvalidArgumentError(absl::StrCat(source_name, ":", *syntax));
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, from_yaml ? ": job file rejected by the JSON mapping: " : ": ",
                     std::string(status.message().data(), status.message().size())));
  }
  return spec;
}

bool IsBlank(std::string_view text) {
  for (char c : text) {
    if (!absl::ascii_isspace(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<zerotrain::JobSpec> ParseJobText(std::string_view text, JobFormat format,
                                                std::string_view source) {
  // This Abseil build's string_view is its own type, not std::string_view.
  const absl::string_view source_name(source.data(), source.size());
  if (format == JobFormat::kJson) {
    // Protobuf's own message for empty input ("Unexpected end of string") does not say which.
    if (IsBlank(text)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source_name, ": the job file is empty (expected a JSON object)"));
    }
    return ParseJson(text, source_name, /*from_yaml=*/false);
  }
  ZT_ASSIGN_OR_RETURN(std::string json,
                      job_internal::YamlToJson(text, *zerotrain::JobSpec::descriptor(), source));
  return ParseJson(json, source_name, /*from_yaml=*/true);
}

absl::StatusOr<zerotrain::JobSpec> LoadJobFile(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string extension = absl::AsciiStrToLower(fs::path(path).extension().string());
  JobFormat format;
  if (extension == ".yaml" || extension == ".yml") {
    format = JobFormat::kYaml;
  } else if (extension == ".json") {
    format = JobFormat::kJson;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": a job file must end in .yaml, .yml or .json"));
  }
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (status.type() == fs::file_type::not_found) {
    return absl::NotFoundError(absl::StrCat(path, ": job file does not exist"));
  }
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot stat: ", ec.message()));
  }
  if (status.type() != fs::file_type::regular) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": job file is not a regular file"));
  }
  const std::uintmax_t size = fs::file_size(path, ec);
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot stat: ", ec.message()));
  }
  if (size > kMaxJobFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": job file is ", size, " bytes; a job file is at most ", kMaxJobFileBytes));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": cannot open job file: ", std::strerror(errno)));
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": read error"));
  }
  return ParseJobText(text, format, path);
}

}  // namespace zt
