// Token shards: the on-disk form of tokenized training text (format in docs/formats.md).
//
// A shard is a 64-byte little-endian header ("ZTTOKENS", version, token width, count, the
// tokenizer's vocab size, the largest id present) followed by the tokens as u16 or u32. The
// writer is atomic (temporary file, fsync, rename); the reader maps the file read-only, so
// opening a multi-gigabyte shard costs nothing until tokens are touched.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace zt {

// The format's constants; docs/formats.md "Token shards" is their byte-by-byte description.
inline constexpr char kTokenShardMagic[8] = {'Z', 'T', 'T', 'O', 'K', 'E', 'N', 'S'};
inline constexpr uint32_t kTokenShardVersion = 1;
inline constexpr int64_t kTokenShardHeaderBytes = 64;
// Vocabularies up to this size store ids as u16; larger ones as u32.
inline constexpr int64_t kTokenShardMaxU16Vocab = 65536;

// Writes `tokens` as a shard at `path`: the bytes go to `path`.tmp, are fsynced, then renamed
// over `path` (and the directory is fsynced), so a reader never sees a half-written shard.
// `vocab_size` is the tokenizer's vocabulary size, 0 when unknown; it picks the token width
// (2 bytes when 0 < vocab_size <= 65536, or when unknown and every id fits in 16 bits).
// Errors: InvalidArgument for a negative id or an id >= a known vocab_size (naming its
// position), and the operating system's error (naming the file) when writing fails.
absl::Status WriteTokenShard(const std::string& path, absl::Span<const int32_t> tokens,
                             uint32_t vocab_size);

// What a shard's header says, checked against its file's size.
struct TokenShardHeader {
  int width = 0;  // bytes per token: 2 or 4
  int64_t count = 0;
  uint32_t vocab_size = 0;  // the writer's; 0 when it was unknown
  int32_t max_token = 0;    // the largest id present (0 for an empty shard)
};

// Reads and checks the header of the shard at `path` without mapping its tokens; the file is
// closed on return, so checking 100,000 shards holds one descriptor at a time. Errors as
// TokenShard::Open's.
absl::StatusOr<TokenShardHeader> ReadTokenShardHeader(const std::string& path);

// Fails with InvalidArgument when an id in the shard at `path` (its header) does not fit a
// model whose vocabulary has `vocab_size` entries. The labels name the job fields in the
// message: "data.train[0] 'x.bin': token id 300 >= model.vocab_size 256".
absl::Status CheckShardVocab(const std::string& path, const TokenShardHeader& header,
                             int32_t vocab_size, std::string_view shard_field,
                             std::string_view vocab_field = "model.vocab_size");

// A read-only, memory-mapped token shard. Immutable after Open, so it is safe to read from
// any number of threads. Owns its mapping; the file descriptor is closed once the file is
// mapped (the mapping does not need it).
class TokenShard {
 public:
  // Maps the shard at `path` and checks its header against the file. Errors, each naming
  // the file: NotFound (no such file), InvalidArgument (not a token shard: bad magic; a
  // version or token width this build does not read), DataLoss (the file is shorter or
  // longer than header + count x width, with both sizes; a header whose largest id
  // contradicts its own vocab size).
  static absl::StatusOr<std::unique_ptr<TokenShard>> Open(const std::string& path);

  ~TokenShard();
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return count_; }
  // The token at index i, 0 <= i < size(); not bounds-checked.
  int32_t token(int64_t i) const;
  // Copies tokens [start, start + n) to out; the range must lie inside the shard.
  void Read(int64_t start, int64_t n, int32_t* out) const;
  // The largest id present (0 for an empty shard), as recorded in the header.
  int32_t max_token() const { return max_token_; }
  // The writer's vocab size; 0 when it was unknown.
  uint32_t vocab_size() const { return vocab_size_; }
  int token_width() const { return width_; }

  // CheckShardVocab of this shard.
  absl::Status CheckVocab(int32_t vocab_size, std::string_view shard_field,
                          std::string_view vocab_field = "model.vocab_size") const;

 private:
  TokenShard() = default;

  std::string path_;
  int fd_ = -1;
  void* map_ = nullptr;
  int64_t map_bytes_ = 0;
  const unsigned char* tokens_ = nullptr;
  int width_ = 0;
  int64_t count_ = 0;
  uint32_t vocab_size_ = 0;
  int32_t max_token_ = 0;
};

}  // namespace zt
