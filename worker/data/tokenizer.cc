#include "worker/data/tokenizer.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/data/bpe_tokenizer.h"
#include "worker/data/read_file.h"

namespace zt {
namespace fs = std::filesystem;

std::vector<int32_t> ByteTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::Decode(absl::Span<const int32_t> tokens) const {
  std::string text;
  text.reserve(tokens.size());
  for (int32_t t : tokens) {
    if (t >= 0 && t < 256) {
      text.push_back(static_cast<char>(t));
    } else {
      text += "\xEF\xBF\xBD";
    }
  }
  return text;
}

namespace {

// A tokenizer.json is an object with a "model" object; a vocab.json maps tokens to ids.
absl::StatusOr<bool> IsTokenizerJson(const std::string& path) {
  ZT_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, "tokenizer"));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer '", path, "': not valid JSON"));
  }
  return j.is_object() && j.contains("model") && j["model"].is_object();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Upcast(
    absl::StatusOr<std::unique_ptr<BpeTokenizer>> tok) {
  if (!tok.ok()) return tok.status();
  return std::unique_ptr<Tokenizer>(*std::move(tok));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(std::string_view spec) {
  if (spec == "bytes") return std::unique_ptr<Tokenizer>(new ByteTokenizer());
  const fs::path path(spec);
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) {
    return absl::NotFoundError(
        absl::StrCat("tokenizer '", std::string(spec),
                     "': no such file or directory (expected \"bytes\", a "
                     "tokenizer.json, or a directory or vocab.json with merges.txt beside it)"));
  }
  if (fs::is_directory(st)) {
    if (fs::exists(path / "tokenizer.json", ec)) {
      return Upcast(BpeTokenizer::FromTokenizerJson((path / "tokenizer.json").string()));
    }
    if (fs::exists(path / "vocab.json", ec) && fs::exists(path / "merges.txt", ec)) {
      return Upcast(BpeTokenizer::FromVocabAndMerges((path / "vocab.json").string(),
                                                     (path / "merges.txt").string()));
    }
    return absl::NotFoundError(absl::StrCat("tokenizer directory '", std::string(spec),
                                            "' holds neither tokenizer.json nor vocab.json "
                                            "and merges.txt"));
  }
  ZT_ASSIGN_OR_RETURN(bool is_tokenizer_json, IsTokenizerJson(path.string()));
  if (is_tokenizer_json) return Upcast(BpeTokenizer::FromTokenizerJson(path.string()));
  const fs::path merges = path.parent_path() / "merges.txt";
  if (!fs::exists(merges, ec)) {
    return absl::NotFoundError(
        absl::StrCat("tokenizer '", std::string(spec),
                     "' is not a tokenizer.json (no \"model\" object), so it is read "
                     "as a vocab.json, but '",
                     merges.string(), "' does not exist beside it"));
  }
  return Upcast(BpeTokenizer::FromVocabAndMerges(path.string(), merges.string()));
}

}  // namespace zt
