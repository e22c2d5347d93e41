#include "worker/data/prepare.h"

#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/status_macros.h"
#include "worker/data/document_index.h"
#include "worker/data/read_file.h"
#include "worker/data/token_shard.h"

namespace zt {
namespace {

absl::StatusOr<std::vector<int32_t>> TokenizeFiles(const Tokenizer& tokenizer,
                                                   const std::vector<std::string>& inputs,
                                                   PrepareStats* stats) {
  if (inputs.empty()) {
    return absl::InvalidArgumentError("prepare: the list of input text files is empty");
  }
  const std::optional<int32_t> separator = tokenizer.end_of_text();
  std::vector<int32_t> tokens;
  for (size_t i = 0; i < inputs.size(); ++i) {
    ZT_ASSIGN_OR_RETURN(std::string text, ReadFileToString(inputs[i], "input text"));
    if (i > 0 && separator.has_value()) tokens.push_back(*separator);
    const std::vector<int32_t> ids = tokenizer.Encode(text);
    if (tokens.empty()) {
      // Files after the first are usually about as long; reserving for all of them at this
      // rate avoids repeated regrowth of a vector that can reach gigabytes.
      tokens.reserve(ids.size() * inputs.size() + inputs.size());
    }
    tokens.insert(tokens.end(), ids.begin(), ids.end());
    stats->files += 1;
    stats->bytes_read += static_cast<int64_t>(text.size());
  }
  return tokens;
}

// A text shard written over a jsonl one must not keep the old document index beside it.
void RemoveStaleIndex(const std::string& shard_path) {
  std::error_code ignored;  // absent is the usual case
  std::filesystem::remove(shard_path + kDocumentIndexSuffix, ignored);
}

}  // namespace

absl::Status PrepareShard(const Tokenizer& tokenizer, const std::vector<std::string>& inputs,
                          const std::string& out_path, PrepareStats* stats) {
  PrepareStats local;
  ZT_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, TokenizeFiles(tokenizer, inputs, &local));
  ZT_RETURN_IF_ERROR(WriteTokenShard(out_path, tokens, tokenizer.vocab_size()));
  RemoveStaleIndex(out_path);
  local.tokens = static_cast<int64_t>(tokens.size());
  if (stats != nullptr) *stats = local;
  return absl::OkStatus();
}

absl::Status PrepareSplit(const Tokenizer& tokenizer, const std::vector<std::string>& inputs,
                          const SplitOutputs& outputs, PrepareStats* stats) {
  if (!(outputs.val_fraction > 0.0 && outputs.val_fraction < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("prepare: val_fraction ", outputs.val_fraction, " must be > 0 and < 1"));
  }
  PrepareStats local;
  ZT_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, TokenizeFiles(tokenizer, inputs, &local));
  const auto total = static_cast<int64_t>(tokens.size());
  const auto val = static_cast<int64_t>(std::floor(outputs.val_fraction * total));
  if (val < 1 || val > total - 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prepare: val_fraction ", outputs.val_fraction, " of ", total, " tokens gives ", val,
        " validation and ", total - val, " training tokens; both shards need at least one"));
  }
  const absl::Span<const int32_t> all(tokens);
  ZT_RETURN_IF_ERROR(
      WriteTokenShard(outputs.train_path, all.subspan(0, total - val), tokenizer.vocab_size()));
  ZT_RETURN_IF_ERROR(
      WriteTokenShard(outputs.val_path, all.subspan(total - val), tokenizer.vocab_size()));
  RemoveStaleIndex(outputs.train_path);
  RemoveStaleIndex(outputs.val_path);
  local.tokens = total;
  local.val_tokens = val;
  if (stats != nullptr) *stats = local;
  return absl::OkStatus();
}

}  // namespace zt
