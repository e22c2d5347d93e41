// `zt prepare`: text files -> token shards.
//
// Each input is read whole and tokenized on its own; the files' tokens are concatenated in
// the order given. With a tokenizer whose vocabulary has "<|endoftext|>" (GPT-2's BPE) its
// id separates consecutive files, so the model sees document boundaries; with "bytes" the
// files are joined with nothing between them. Tokens are held in memory until written
// (4 bytes a token), which suits corpora up to a few GB.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/data/tokenizer.h"

namespace zt {

struct PrepareStats {
  int64_t files = 0;
  // Documents written (jsonl only), over all shards.
  int64_t documents = 0;
  int64_t bytes_read = 0;
  // Written over all shards, separators included.
  int64_t tokens = 0;
  // Of those, the ones in the validation shard (PrepareSplit only).
  int64_t val_tokens = 0;
};

// Tokenizes `inputs` into one shard at `out_path`. Errors: InvalidArgument for an empty
// input list; an input's read error (NotFound for a missing file) naming the file; the
// shard writer's errors. `stats` may be null.
absl::Status PrepareShard(const Tokenizer& tokenizer, const std::vector<std::string>& inputs,
                          const std::string& out_path, PrepareStats* stats);

struct SplitOutputs {
  std::string train_path;
  std::string val_path;
  // The last floor(val_fraction * N) of the N tokens go to val_path, the rest to
  // train_path; the cut may fall inside a document. Must be in (0, 1).
  double val_fraction = 0.0;
};

// Like PrepareShard, but writes a train and a validation shard. InvalidArgument (naming
// val_fraction) when it is outside (0, 1) or leaves either shard empty.
absl::Status PrepareSplit(const Tokenizer& tokenizer, const std::vector<std::string>& inputs,
                          const SplitOutputs& outputs, PrepareStats* stats);

// `zt prepare --format jsonl`: each line of each input is one JSON object, one document:
// {"prompt": "...", "completion": "..."} (only the completion's tokens carry loss) or
// {"text": "..."} (every token does). Lines of only whitespace are skipped. With a tokenizer
// that has "<|endoftext|>" its id ends every completion (and every text), counted, so the
// model learns where an answer stops. Writes the token shard at `out_path` and its document
// index beside it (worker/data/document_index.h). Errors name "file:line" and the rule: a
// line that is not JSON, not an object, with neither `text` nor both `prompt` and
// `completion` (or with `text` beside them), a field that is not a string, an empty text or
// completion; InvalidArgument for an input list with no documents.
absl::Status PrepareJsonlShard(const Tokenizer& tokenizer, const std::vector<std::string>& inputs,
                               const std::string& out_path, PrepareStats* stats);

// PrepareJsonlShard into a train and a validation shard: the last floor(val_fraction × D) of
// the D documents go to the validation shard (whole documents: the cut never splits one).
// InvalidArgument (naming val_fraction) when it is outside (0, 1) or leaves either empty.
absl::Status PrepareJsonlSplit(const Tokenizer& tokenizer, const std::vector<std::string>& inputs,
                               const SplitOutputs& outputs, PrepareStats* stats);

}  // namespace zt
