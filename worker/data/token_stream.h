// TokenStream: the shards of one job field (e.g. `data.train`) read as one token sequence.
//
// The shards are concatenated in the order given; reads wrap around at the end, so the
// stream behaves as an endless repetition of the data (epochs follow each other without a
// seam).
//
// Shards are opened lazily and a bounded number at a time: Open reads each shard's header
// (and closes the file again) to learn its size, and Read maps a shard when it first needs
// one of its tokens, keeping at most kMaxMappedShards mapped (the least recently used one is
// unmapped first). A corpus of 20,000 shards therefore needs neither 20,000 descriptors nor
// 20,000 mappings. The tokens read are the same as with every shard mapped.
//
// Thread-safe: Read may be called from many threads (the set of mapped shards is locked; a
// reader keeps the shard it reads mapped until it is done with it). Movable; a Sampler keeps
// a pointer to it, so move it before handing it out, not after.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/data/token_shard.h"

namespace zt {

// Shards mapped at once by one stream. Sequential reading touches one or two at a time; a
// shuffled epoch jumps between shards, and 16 keeps recently used ones without approaching
// the open-file or map-count limits with a training and a validation stream per rank.
inline constexpr int kMaxMappedShards = 16;

class TokenStream {
 public:
  // Reads the header of every shard in `paths` (one file open at a time). `field_label` names
  // the job field the list came from ("data.train"); errors name the element
  // ("data.train[1]: ...") and keep the shard's error code. InvalidArgument when the list is
  // empty or all shards together hold no tokens.
  static absl::StatusOr<TokenStream> Open(const std::vector<std::string>& paths,
                                          std::string_view field_label);

  TokenStream(TokenStream&& other) noexcept;
  TokenStream& operator=(TokenStream&& other) noexcept;

  // Total tokens over all shards (> 0).
  int64_t size() const { return offsets_.back(); }
  // Copies n tokens starting at `start` (taken modulo size(), negative allowed) into out,
  // wrapping from the last shard's end to the first shard's start as often as needed.
  // Errors, naming the element: mapping a shard failed (it was removed, or changed since Open:
  // DataLoss when its size no longer matches the header Open read).
  absl::Status Read(int64_t start, int64_t n, int32_t* out) const;
  int32_t max_token() const;
  const std::string& field_label() const { return field_label_; }
  int num_shards() const { return static_cast<int>(paths_.size()); }
  const std::string& shard_path(int i) const { return paths_[i]; }
  const TokenShardHeader& shard_header(int i) const { return headers_[i]; }
  // Shards mapped now (at most kMaxMappedShards, plus any that readers still hold).
  int mapped_shards() const;

  // InvalidArgument naming the first shard with an id >= vocab_size, e.g.
  // "data.train[0] 'x.bin': token id 300 >= model.vocab_size 256".
  absl::Status CheckVocab(int32_t vocab_size,
                          std::string_view vocab_field = "model.vocab_size") const;

 private:
  TokenStream() = default;
  // Shard i mapped, from the cache or freshly (evicting the least recently used).
  absl::StatusOr<std::shared_ptr<const TokenShard>> Shard(size_t i) const;

  std::string field_label_;
  std::vector<std::string> paths_;
  std::vector<TokenShardHeader> headers_;
  // offsets_[i] is the stream index of shard i's first token; offsets_.back() is size().
  std::vector<int64_t> offsets_;

  // Guards mapped_: the mapped shards, most recently used first.
  mutable std::unique_ptr<std::mutex> mu_ = std::make_unique<std::mutex>();
  mutable std::list<std::pair<size_t, std::shared_ptr<const TokenShard>>> mapped_;
};

}  // namespace zt
