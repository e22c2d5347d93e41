// `zt prepare --tokenizer SPEC --out SHARD [--val-out SHARD] INPUT...`: text files to token
// shards (docs/formats.md).
#include <cstdio>

#include "cli/commands.h"
#include "worker/data/prepare.h"
#include "worker/data/tokenizer.h"

namespace zt::cli {

absl::Status RunPrepare(const PrepareFlags& flags) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> loaded = LoadTokenizer(flags.tokenizer);
  if (!loaded.ok()) return loaded.status();
  const Tokenizer& tokenizer = **loaded;
  PrepareStats stats;
  const bool jsonl = flags.format == "jsonl";
  const SplitOutputs split = {.train_path = flags.out,
                              .val_path = flags.val_out,
                              .val_fraction = flags.val_fraction};
  absl::Status written;
  if (jsonl) {
    written = flags.val_out.empty() ? PrepareJsonlShard(tokenizer, flags.inputs, flags.out, &stats)
                                    : PrepareJsonlSplit(tokenizer, flags.inputs, split, &stats);
  } else {
    written = flags.val_out.empty() ? PrepareShard(tokenizer, flags.inputs, flags.out, &stats)
                                    : PrepareSplit(tokenizer, flags.inputs, split, &stats);
  }
  if (!written.ok()) return written;
  std::fprintf(stderr, "zt prepare: %lld files, %lld bytes -> %lld tokens (vocab %d)",
               static_cast<long long>(stats.files), static_cast<long long>(stats.bytes_read),
               static_cast<long long>(stats.tokens), tokenizer.vocab_size());
  if (jsonl) std::fprintf(stderr, ", %lld documents", static_cast<long long>(stats.documents));
  if (!flags.val_out.empty()) {
    std::fprintf(stderr, ", %lld of them in %s", static_cast<long long>(stats.val_tokens),
                 flags.val_out.c_str());
  }
  std::fprintf(stderr, "\n");
  return absl::OkStatus();
}

}  // namespace zt::cli
