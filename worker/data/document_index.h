// Document index: the side file that keeps a token shard's document boundaries and loss mask.
//
// `zt prepare --format jsonl` writes `<shard>.docs` beside `<shard>` (docs/formats.md,
// "Document index"). The token shard itself is unchanged (format version 1), so every reader
// of shards reads these ones too and shards without an index read as before: one endless
// stream of tokens, every target counted.
//
// A document is `length` consecutive tokens of the shard; the documents tile the shard in
// order. Its first `prompt_length` tokens are the prompt: a target that is a prompt token
// carries no loss. The next-token targets inside document d are d[1..length), so the
// completion's tokens d[prompt_length..length) are the counted targets (all but d[0] when
// prompt_length is 0, as for `text` lines).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zt {

inline constexpr char kDocumentIndexMagic[8] = {'Z', 'T', 'D', 'O', 'C', 'S', '\0', '\0'};
inline constexpr uint32_t kDocumentIndexVersion = 1;
inline constexpr int64_t kDocumentIndexHeaderBytes = 32;
// The suffix that names a shard's index: "train.bin" -> "train.bin.docs".
inline constexpr char kDocumentIndexSuffix[] = ".docs";

struct DocumentSpan {
  uint32_t length = 0;         // tokens, ≥ 1
  uint32_t prompt_length = 0;  // ≤ length
};

struct DocumentIndex {
  std::vector<DocumentSpan> documents;
  int64_t tokens() const;
};

// Writes `index` as `path` (normally shard path + kDocumentIndexSuffix), through a temporary
// file renamed over it. InvalidArgument for an empty document or a prompt longer than its
// document (naming its number); the operating system's error naming the file.
absl::Status WriteDocumentIndex(const std::string& path, const DocumentIndex& index);

// The index of the shard at `shard_path`, or nullopt when it has none (an older shard or one
// made from text files). Errors, naming the index file: InvalidArgument for a bad magic or a
// version this build does not read; DataLoss for a size that disagrees with the header, a
// document of length 0, a prompt longer than its document, or documents whose lengths do not
// add up to `shard_tokens` (the shard's count).
absl::StatusOr<std::optional<DocumentIndex>> ReadDocumentIndex(const std::string& shard_path,
                                                               int64_t shard_tokens);

}  // namespace zt
