#include "worker/job/yaml_to_json.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace zt::job_internal {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using nlohmann::json;

// A garbage file can hold thousands of mistakes; the first few say what to fix.
constexpr size_t kMaxErrors = 20;
// Values echoed in messages are cut so a megabyte of junk does not become the message.
constexpr size_t kMaxQuotedChars = 60;

// Quotes a value for a message, escaping control and non-ASCII bytes so the message stays
// printable whatever the file held.
std::string Quote(absl::string_view text) {
  std::string out = "'";
  for (size_t i = 0; i < text.size() && i < kMaxQuotedChars; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    }
  }
  if (text.size() > kMaxQuotedChars) out += "...";
  out += "'";
  return out;
}

std::string DescribeNode(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return Quote(node.Scalar());
    default:
      return "null";
  }
}

bool IsValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int extra = 0;
    uint32_t code = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      extra = 1;
      code = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      extra = 2;
      code = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      extra = 3;
      code = c & 0x07;
    } else {
      return false;
    }
    if (i + extra >= s.size()) return false;
    for (int k = 1; k <= extra; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      code = (code << 6) | (cc & 0x3f);
    }
    // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8.
    static constexpr uint32_t kMinCode[] = {0, 0x80, 0x800, 0x10000};
    if (code < kMinCode[extra] || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) {
      return false;
    }
    i += extra + 1;
  }
  return true;
}

// YAML 1.2 core schema spellings of the JSON mapping's special float strings.
std::optional<std::string> YamlSpecialFloat(absl::string_view s) {
  if (s == ".nan" || s == ".NaN" || s == ".NAN") return "NaN";
  absl::string_view body = s;
  bool negative = false;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    negative = body[0] == '-';
    body.remove_prefix(1);
  }
  if (body == ".inf" || body == ".Inf" || body == ".INF") {
    return negative ? "-Infinity" : "Infinity";
  }
  return std::nullopt;
}

// Walks one YAML document and the message Descriptor together, collecting every error.
class Converter {
 public:
  explicit Converter(absl::string_view source_name) : source_name_(source_name) {}

  const std::vector<std::string>& errors() const { return errors_; }
  size_t dropped_errors() const { return dropped_errors_; }

  // `node` must be a mapping (the caller checks, so the message can name the message type).
  json ConvertMessage(const YAML::Node& node, const Descriptor& descriptor,
                      const std::string& path) {
    json out = json::object();
    // Field number -> the key it was given as, to catch `n_kv_head` and `nKvHead` together.
    std::vector<std::pair<int, std::string>> seen;
    for (const auto& entry : node) {
      const YAML::Node& key = entry.first;
      const YAML::Node& value = entry.second;
      if (!key.IsScalar()) {
        AddError(key, path.empty() ? "(top level)" : path,
                 absl::StrCat("a key must be a field name, got ", DescribeNode(key)));
        continue;
      }
      const std::string& name = key.Scalar();
      // A junk key is quoted and cut like any echoed value.
      const bool plain =
          name.size() <= kMaxQuotedChars &&
          std::all_of(name.begin(), name.end(), [](char c) { return c > 0x20 && c < 0x7f; });
      const std::string shown = plain ? name : Quote(name);
      const std::string field_path = path.empty() ? shown : absl::StrCat(path, ".", shown);
      const FieldDescriptor* field = FindField(descriptor, name);
      if (field == nullptr) {
        AddError(key, field_path, UnknownFieldMessage(descriptor, name));
        continue;
      }
      const std::string proto_path =
          path.empty() ? field->name() : absl::StrCat(path, ".", field->name());
      auto previous = std::find_if(seen.begin(), seen.end(),
                                   [&](const auto& s) { return s.first == field->number(); });
      if (previous != seen.end()) {
        AddError(key, proto_path,
                 absl::StrCat("given more than once (as ", Quote(previous->second), " and ",
                              Quote(name), ")"));
        continue;
      }
      seen.emplace_back(field->number(), name);
      // JSON null leaves a field at its default; a YAML key with no value means the same.
      if (value.IsNull()) continue;
      std::optional<json> converted = ConvertField(value, *field, proto_path);
      if (converted.has_value()) out[field->name()] = std::move(*converted);
    }
    return out;
  }

  void AddError(const YAML::Node& node, absl::string_view path, absl::string_view message) {
    if (errors_.size() >= kMaxErrors) {
      ++dropped_errors_;
      return;
    }
    const YAML::Mark mark = node.Mark();
    std::string location(source_name_);
    if (!mark.is_null()) absl::StrAppend(&location, ":", mark.line + 1, ":", mark.column + 1);
    errors_.push_back(absl::StrCat(location, ": ", path, ": ", message));
  }

 private:
  static const FieldDescriptor* FindField(const Descriptor& descriptor, const std::string& name) {
    if (const FieldDescriptor* f = descriptor.FindFieldByName(name)) return f;
    for (int i = 0; i < descriptor.field_count(); ++i) {
      if (descriptor.field(i)->json_name() == name) return descriptor.field(i);
    }
    return nullptr;
  }

  static size_t EditDistance(absl::string_view a, absl::string_view b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diagonal = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        const size_t above = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
        diagonal = above;
      }
    }
    return row[b.size()];
  }

  static std::string UnknownFieldMessage(const Descriptor& descriptor, absl::string_view name) {
    std::vector<std::string> known;
    std::string suggestion;
    // Two edits catch a swapped pair or a missing letter without suggesting unrelated names.
    size_t best = 3;
    const absl::string_view probe = name.substr(0, 64);
    for (int i = 0; i < descriptor.field_count(); ++i) {
      const std::string& field_name = descriptor.field(i)->name();
      known.push_back(field_name);
      const size_t d = EditDistance(probe, field_name);
      if (d < best) {
        best = d;
        suggestion = field_name;
      }
    }
    std::string message =
        absl::StrCat("unknown field (known fields: ", absl::StrJoin(known, ", "), ")");
    if (!suggestion.empty()) absl::StrAppend(&message, "; did you mean ", suggestion, "?");
    return message;
  }

  std::optional<json> ConvertField(const YAML::Node& node, const FieldDescriptor& field,
                                   const std::string& path) {
    if (field.is_map()) return ConvertMap(node, field, path);
    if (!field.is_repeated()) return ConvertSingle(node, field, path);
    if (!node.IsSequence()) {
      // A lone value for a repeated field is the common `train: data.bin`.
      std::optional<json> one = ConvertSingle(node, field, path);
      if (!one.has_value()) return std::nullopt;
      return json::array({std::move(*one)});
    }
    json list = json::array();
    bool ok = true;
    for (size_t i = 0; i < node.size(); ++i) {
      const YAML::Node element = node[i];
      const std::string element_path = absl::StrCat(path, "[", i, "]");
      if (element.IsNull()) {
        AddError(element, element_path, "a list element cannot be null");
        ok = false;
        continue;
      }
      std::optional<json> converted = ConvertSingle(element, field, element_path);
      if (converted.has_value()) {
        list.push_back(std::move(*converted));
      } else {
        ok = false;
      }
    }
    if (!ok) return std::nullopt;
    return list;
  }

  std::optional<json> ConvertMap(const YAML::Node& node, const FieldDescriptor& field,
                                 const std::string& path) {
    if (!node.IsMap()) {
      AddError(node, path, absl::StrCat("expected a mapping, got ", DescribeNode(node)));
      return std::nullopt;
    }
    const FieldDescriptor& key_field = *field.message_type()->map_key();
    const FieldDescriptor& value_field = *field.message_type()->map_value();
    json out = json::object();
    bool ok = true;
    for (const auto& entry : node) {
      const std::string entry_path =
          absl::StrCat(path, "[", entry.first.IsScalar() ? entry.first.Scalar() : "?", "]");
      std::optional<json> key = ConvertSingle(entry.first, key_field, entry_path);
      std::optional<json> value = entry.second.IsNull()
                                      ? std::optional<json>(json())
                                      : ConvertSingle(entry.second, value_field, entry_path);
      if (!key.has_value() || !value.has_value()) {
        ok = false;
        continue;
      }
      // JSON object keys are strings whatever the key type; protobuf parses them back.
      out[key->is_string() ? key->get<std::string>() : key->dump()] = std::move(*value);
    }
    if (!ok) return std::nullopt;
    return out;
  }

  std::optional<json> ConvertSingle(const YAML::Node& node, const FieldDescriptor& field,
                                    const std::string& path) {
    if (field.type() == FieldDescriptor::TYPE_MESSAGE ||
        field.type() == FieldDescriptor::TYPE_GROUP) {
      const Descriptor& type = *field.message_type();
      if (!node.IsMap()) {
        AddError(node, path,
                 absl::StrCat("expected a mapping of ", type.name(), " fields, got ",
                              DescribeNode(node)));
        return std::nullopt;
      }
      return ConvertMessage(node, type, path);
    }
    if (!node.IsScalar()) {
      AddError(node, path,
               absl::StrCat("expected ", ExpectedScalar(field), ", got ", DescribeNode(node)));
      return std::nullopt;
    }
    const std::string& text = node.Scalar();
    switch (field.cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        return ConvertSigned(node, path, std::numeric_limits<int32_t>::min(),
                             std::numeric_limits<int32_t>::max(), "int32", /*as_string=*/false);
      case FieldDescriptor::CPPTYPE_INT64:
        // The JSON mapping writes 64-bit integers as strings so no double rounds them.
        return ConvertSigned(node, path, std::numeric_limits<int64_t>::min(),
                             std::numeric_limits<int64_t>::max(), "int64", /*as_string=*/true);
      case FieldDescriptor::CPPTYPE_UINT32:
        return ConvertUnsigned(node, path, std::numeric_limits<uint32_t>::max(), "uint32",
                               /*as_string=*/false);
      case FieldDescriptor::CPPTYPE_UINT64:
        return ConvertUnsigned(node, path, std::numeric_limits<uint64_t>::max(), "uint64",
                               /*as_string=*/true);
      case FieldDescriptor::CPPTYPE_FLOAT:
        return ConvertFloat(node, path, std::numeric_limits<float>::max(), "float");
      case FieldDescriptor::CPPTYPE_DOUBLE:
        return ConvertFloat(node, path, std::numeric_limits<double>::max(), "double");
      case FieldDescriptor::CPPTYPE_BOOL:
        if (text == "true" || text == "True" || text == "TRUE") return json(true);
        if (text == "false" || text == "False" || text == "FALSE") return json(false);
        AddError(node, path, absl::StrCat(Quote(text), " is not a boolean (true or false)"));
        return std::nullopt;
      case FieldDescriptor::CPPTYPE_ENUM:
        return ConvertEnum(node, *field.enum_type(), path);
      case FieldDescriptor::CPPTYPE_STRING:
        if (!IsValidUtf8(text)) {
          AddError(node, path, absl::StrCat(Quote(text), " is not valid UTF-8"));
          return std::nullopt;
        }
        return json(text);
      default:
        AddError(node, path, "field type is not supported in job files");
        return std::nullopt;
    }
  }

  static std::string ExpectedScalar(const FieldDescriptor& field) {
    switch (field.cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
      case FieldDescriptor::CPPTYPE_INT64:
      case FieldDescriptor::CPPTYPE_UINT32:
      case FieldDescriptor::CPPTYPE_UINT64:
        return "an integer";
      case FieldDescriptor::CPPTYPE_FLOAT:
      case FieldDescriptor::CPPTYPE_DOUBLE:
        return "a number";
      case FieldDescriptor::CPPTYPE_BOOL:
        return "true or false";
      case FieldDescriptor::CPPTYPE_ENUM:
        return absl::StrCat("one of ", EnumNames(*field.enum_type()));
      default:
        return "a string";
    }
  }

  // The values a user may write: the *_UNSPECIFIED placeholder means "not given".
  static bool IsPlaceholder(const EnumValueDescriptor& value) {
    return value.number() == 0 && absl::EndsWith(value.name(), "_UNSPECIFIED");
  }

  static std::string EnumNames(const EnumDescriptor& type) {
    std::vector<std::string> names;
    for (int i = 0; i < type.value_count(); ++i) {
      if (!IsPlaceholder(*type.value(i))) names.push_back(type.value(i)->name());
    }
    return absl::StrJoin(names, ", ");
  }

  std::optional<json> ConvertEnum(const YAML::Node& node, const EnumDescriptor& type,
                                  const std::string& path) {
    const std::string& text = node.Scalar();
    const EnumValueDescriptor* value = type.FindValueByName(text);
    if (value != nullptr && !IsPlaceholder(*value)) return json(value->name());
    std::string message = absl::StrCat(Quote(text), " is not one of ", EnumNames(type));
    const EnumValueDescriptor* upper = type.FindValueByName(absl::AsciiStrToUpper(text));
    if (value == nullptr && upper != nullptr && !IsPlaceholder(*upper)) {
      absl::StrAppend(&message, " (names are case-sensitive: ", upper->name(), ")");
    }
    AddError(node, path, message);
    return std::nullopt;
  }

  // Integers are decimal: YAML 1.1's octal/sexagesimal forms would silently change values.
  static absl::string_view IntegerDigits(absl::string_view text, bool* negative) {
    *negative = false;
    if (!text.empty() && (text[0] == '+' || text[0] == '-')) {
      *negative = text[0] == '-';
      text.remove_prefix(1);
    }
    if (text.empty() ||
        !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return {};
    }
    return text;
  }

  std::optional<json> ConvertSigned(const YAML::Node& node, const std::string& path, int64_t min,
                                    int64_t max, absl::string_view type_name, bool as_string) {
    const std::string& text = node.Scalar();
    bool negative = false;
    const absl::string_view digits = IntegerDigits(text, &negative);
    if (digits.empty()) {
      AddError(node, path, absl::StrCat(Quote(text), " is not an integer"));
      return std::nullopt;
    }
    uint64_t magnitude = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), magnitude);
    const uint64_t limit =
        negative ? static_cast<uint64_t>(-(min + 1)) + 1 : static_cast<uint64_t>(max);
    if (ec != std::errc() || magnitude > limit) {
      AddError(
          node, path,
          absl::StrCat(Quote(text), " is out of range for ", type_name, " (", min, "..", max, ")"));
      return std::nullopt;
    }
    // Negating magnitude - 1 keeps the most negative value from overflowing.
    const int64_t value = !negative || magnitude == 0 ? static_cast<int64_t>(magnitude)
                                                      : -static_cast<int64_t>(magnitude - 1) - 1;
    return as_string ? json(std::to_string(value)) : json(value);
  }

  std::optional<json> ConvertUnsigned(const YAML::Node& node, const std::string& path, uint64_t max,
                                      absl::string_view type_name, bool as_string) {
    const std::string& text = node.Scalar();
    bool negative = false;
    const absl::string_view digits = IntegerDigits(text, &negative);
    if (digits.empty()) {
      AddError(node, path, absl::StrCat(Quote(text), " is not an integer"));
      return std::nullopt;
    }
    uint64_t value = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (ec != std::errc() || value > max || (negative && value != 0)) {
      AddError(node, path,
               absl::StrCat(Quote(text), " is out of range for ", type_name, " (0..", max, ")"));
      return std::nullopt;
    }
    return as_string ? json(std::to_string(value)) : json(value);
  }

  std::optional<json> ConvertFloat(const YAML::Node& node, const std::string& path, double max,
                                   absl::string_view type_name) {
    const std::string& text = node.Scalar();
    if (std::optional<std::string> special = YamlSpecialFloat(text)) return json(*special);
    absl::string_view body = text;
    if (!body.empty() && body[0] == '+') body.remove_prefix(1);
    // from_chars also reads "inf" and "nan", which YAML spells .inf and .nan.
    const bool starts_like_number =
        !body.empty() && (std::isdigit(static_cast<unsigned char>(body[0])) || body[0] == '.' ||
                          (body[0] == '-' && body.size() > 1 &&
                           (std::isdigit(static_cast<unsigned char>(body[1])) || body[1] == '.')));
    double value = 0;
    if (starts_like_number) {
      const auto [end, ec] = std::from_chars(body.data(), body.data() + body.size(), value);
      if (ec == std::errc::result_out_of_range) {
        AddError(node, path, absl::StrCat(Quote(text), " is out of range for ", type_name));
        return std::nullopt;
      }
      if (ec == std::errc() && end == body.data() + body.size() && std::isfinite(value)) {
        if (std::fabs(value) > max) {
          AddError(node, path, absl::StrCat(Quote(text), " is out of range for ", type_name));
          return std::nullopt;
        }
        return json(value);
      }
    }
    AddError(node, path, absl::StrCat(Quote(text), " is not a number"));
    return std::nullopt;
  }

  absl::string_view source_name_;
  std::vector<std::string> errors_;
  size_t dropped_errors_ = 0;
};

// Counts documents without building them (their events are dropped).
class DocumentCounter : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    if (++documents_ == 2) second_ = mark;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

  int documents() const { return documents_; }
  const YAML::Mark& second() const { return second_; }

 private:
  int documents_ = 0;
  YAML::Mark second_ = YAML::Mark::null_mark();
};

std::string MarkPrefix(absl::string_view source_name, const YAML::Mark& mark) {
  if (mark.is_null()) return std::string(source_name);
  return absl::StrCat(source_name, ":", mark.line + 1, ":", mark.column + 1);
}

}  // namespace

absl::StatusOr<std::string> YamlToJson(std::string_view yaml_text, const Descriptor& descriptor,
                                       std::string_view source) {
  // This Abseil build's string_view is its own type, not std::string_view.
  const absl::string_view source_name(source.data(), source.size());
  // yaml-cpp reports both syntax errors and misuse by exceptions; none may leave this library.
  try {
    // Not YAML::LoadAll: yaml-cpp 0.7 never ends its loop on some inputs (a file holding only
    // "," yields empty documents forever, jbeder/yaml-cpp#1319). Load takes the first document;
    // a parser stopped after two documents tells whether there is a second.
    const std::string text(yaml_text);
    const YAML::Node first = YAML::Load(text);
    if (first.IsNull()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source_name, ": the job file is empty (expected a mapping of ",
                       descriptor.name(), " fields)"));
    }
    std::istringstream stream(text);
    YAML::Parser parser(stream);
    DocumentCounter counter;
    while (counter.documents() < 2 && parser.HandleNextDocument(counter)) {
    }
    if (counter.documents() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(MarkPrefix(source_name, counter.second()),
                                                     ": a job file holds one YAML document, found "
                                                     "more than one"));
    }
    const YAML::Node& root = first;
    if (!root.IsMap()) {
      return absl::InvalidArgumentError(absl::StrCat(MarkPrefix(source_name, root.Mark()),
                                                     ": expected a mapping of ", descriptor.name(),
                                                     " fields, got ", DescribeNode(root)));
    }
    Converter converter(source_name);
    json out = converter.ConvertMessage(root, descriptor, "");
    if (!converter.errors().empty()) {
      std::string message = absl::StrJoin(converter.errors(), "\n");
      if (converter.dropped_errors() > 0) {
        absl::StrAppend(&message, "\n", source_name, ": ... and ", converter.dropped_errors(),
                        " more errors");
      }
      return absl::InvalidArgumentError(message);
    }
    return out.dump();
  } catch (const YAML::ParserException& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(MarkPrefix(source_name, e.mark), ": YAML syntax error: ", e.msg));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(MarkPrefix(source_name, e.mark), ": YAML error: ", e.msg));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ": cannot read the job file: ", e.what()));
  }
}

}  // namespace zt::job_internal
