// `zt prepare --format jsonl`: instruction data (prompt/completion or text lines) to a token
// shard and its document index.
#include <cmath>
#include "absl/strings/string_view.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/types/span.h"
#include "kernels/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/data/document_index.h"
#include "worker/data/prepare.h"
#include "worker/data/read_file.h"
#include "worker/data/token_shard.h"

namespace zt {
namespace {

struct Documents {
  std::vector<int32_t> tokens;
  DocumentIndex index;
};

absl::Status LineError(const std::string& file, int64_t line, absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat(file, ":", line, ": ", rule));
}

// The string field `name` of `object`, or an error naming the line when it is not a string.
absl::StatusOr<std::string> StringField(const nlohmann::json& object, const char* name,
                                        const std::string& file, int64_t line) {
  const nlohmann::json& v = object.at(name);
  if (!v.is_string()) {
    return LineError(file, line, absl::StrCat("field '", name, "' must be a string, not ",
                                              v.type_name()));
  }
  return v.get<std::string>();
}

absl::Status AddLine(const Tokenizer& tokenizer, absl::string_view text, const std::string& file,
                     int64_t line, Documents& out) {
  nlohmann::json object = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (object.is_discarded()) return LineError(file, line, "not valid JSON");
  if (!object.is_object()) {
    return LineError(file, line, absl::StrCat("a line must be a JSON object, not ",
                                              object.type_name()));
  }
  const bool has_text = object.contains("text");
  const bool has_prompt = object.contains("prompt");
  const bool has_completion = object.contains("completion");
  std::vector<int32_t> prompt, completion;
  if (has_text && (has_prompt || has_completion)) {
    return LineError(file, line,
                     "has 'text' beside 'prompt'/'completion': a line is one or the other");
  }
  if (has_text) {
    ZT_ASSIGN_OR_RETURN(const std::string t, StringField(object, "text", file, line));
    if (t.empty()) return LineError(file, line, "empty document: 'text' is \"\"");
    completion = tokenizer.Encode(t);
  } else if (has_prompt && has_completion) {
    ZT_ASSIGN_OR_RETURN(const std::string p, StringField(object, "prompt", file, line));
    ZT_ASSIGN_OR_RETURN(const std::string c, StringField(object, "completion", file, line));
    if (c.empty()) {
      return LineError(file, line, "empty document: 'completion' is \"\" (nothing to learn)");
    }
    prompt = tokenizer.Encode(p);
    completion = tokenizer.Encode(c);
  } else {
    return LineError(file, line,
                     "needs a 'text' field or both 'prompt' and 'completion' (string fields)");
  }
  if (const std::optional<int32_t> eot = tokenizer.end_of_text()) completion.push_back(*eot);
  const size_t length = prompt.size() + completion.size();
  if (length > UINT32_MAX) return LineError(file, line, "document longer than 2^32 tokens");
  out.index.documents.push_back({.length = static_cast<uint32_t>(length),
                                 .prompt_length = static_cast<uint32_t>(prompt.size())});
  out.tokens.insert(out.tokens.end(), prompt.begin(), prompt.end());
  out.tokens.insert(out.tokens.end(), completion.begin(), completion.end());
  return absl::OkStatus();
}

absl::StatusOr<Documents> TokenizeJsonl(const Tokenizer& tokenizer,
                                        const std::vector<std::string>& inputs,
                                        PrepareStats& stats) {
  if (inputs.empty()) {
    return absl::InvalidArgumentError("prepare: the list of input jsonl files is empty");
  }
  Documents out;
  for (const std::string& file : inputs) {
    ZT_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(file, "input jsonl"));
    int64_t line = 0;
    for (absl::string_view l : absl::StrSplit(text, '\n')) {
      ++line;
      if (absl::StripAsciiWhitespace(l).empty()) continue;
      ZT_RETURN_IF_ERROR(AddLine(tokenizer, l, file, line, out));
    }
    stats.files += 1;
    stats.bytes_read += static_cast<int64_t>(text.size());
  }
  if (out.index.documents.empty()) {
    return absl::InvalidArgumentError("prepare: the jsonl inputs hold no documents");
  }
  return out;
}

absl::Status WriteDocuments(const Tokenizer& tokenizer, absl::Span<const int32_t> tokens,
                            const DocumentIndex& index, const std::string& path) {
  // The index goes second: a shard whose index is missing reads as plain text, never the
  // other way round.
  ZT_RETURN_IF_ERROR(WriteTokenShard(path, tokens, tokenizer.vocab_size()));
  return WriteDocumentIndex(path + kDocumentIndexSuffix, index);
}

}  // namespace

absl::Status PrepareJsonlShard(const Tokenizer& tokenizer, const std::vector<std::string>& inputs,
                               const std::string& out_path, PrepareStats* stats) {
  PrepareStats local;
  ZT_ASSIGN_OR_RETURN(const Documents docs, TokenizeJsonl(tokenizer, inputs, local));
  ZT_RETURN_IF_ERROR(WriteDocuments(tokenizer, docs.tokens, docs.index, out_path));
  local.tokens = static_cast<int64_t>(docs.tokens.size());
  local.documents = static_cast<int64_t>(docs.index.documents.size());
  if (stats != nullptr) *stats = local;
  return absl::OkStatus();
}

absl::Status PrepareJsonlSplit(const Tokenizer& tokenizer, const std::vector<std::string>& inputs,
                               const SplitOutputs& outputs, PrepareStats* stats) {
  if (!(outputs.val_fraction > 0.0 && outputs.val_fraction < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("prepare: val_fraction ", outputs.val_fraction, " must be > 0 and < 1"));
  }
  PrepareStats local;
  ZT_ASSIGN_OR_RETURN(const Documents docs, TokenizeJsonl(tokenizer, inputs, local));
  const auto total = static_cast<int64_t>(docs.index.documents.size());
  const auto val = static_cast<int64_t>(std::floor(outputs.val_fraction * total));
  if (val < 1 || val > total - 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prepare: val_fraction ", outputs.val_fraction, " of ", total, " documents gives ", val,
        " validation and ", total - val, " training documents; both shards need at least one"));
  }
  DocumentIndex train, validation;
  train.documents.assign(docs.index.documents.begin(), docs.index.documents.end() - val);
  validation.documents.assign(docs.index.documents.end() - val, docs.index.documents.end());
  const absl::Span<const int32_t> all(docs.tokens);
  const int64_t cut = train.tokens();
  ZT_RETURN_IF_ERROR(WriteDocuments(tokenizer, all.subspan(0, cut), train, outputs.train_path));
  ZT_RETURN_IF_ERROR(WriteDocuments(tokenizer, all.subspan(cut), validation, outputs.val_path));
  local.tokens = static_cast<int64_t>(docs.tokens.size());
  local.val_tokens = static_cast<int64_t>(docs.tokens.size()) - cut;
  local.documents = total;
  if (stats != nullptr) *stats = local;
  return absl::OkStatus();
}

}  // namespace zt
