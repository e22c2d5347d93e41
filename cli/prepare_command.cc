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
  const absl::Status written = flags.val_out.empty()
                                   ? PrepareShard(tokenizer, flags.inputs, flags.out, &stats)
                                   : PrepareSplit(tokenizer, flags.inputs,
                                                  {.train_path = flags.out,
                                                   .val_path = flags.val_out,
                                                   .val_fraction = flags.val_fraction},
                                                  &stats);
  if (!written.ok()) return written;
  std::fprintf(stderr, "zt prepare: %lld files, %lld bytes -> %lld tokens (vocab %d)",
               static_cast<long long>(stats.files), static_cast<long long>(stats.bytes_read),
               static_cast<long long>(stats.tokens), tokenizer.vocab_size());
  if (!flags.val_out.empty()) {
    std::fprintf(stderr, ", %lld of them in %s", static_cast<long long>(stats.val_tokens),
                 flags.val_out.c_str());
  }
  std::fprintf(stderr, "\n");
  return absl::OkStatus();
}

}  // namespace zt::cli
