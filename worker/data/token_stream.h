// TokenStream: the shards of one job field (e.g. `data.train`) read as one token sequence.
//
// The shards are concatenated in the order given; reads wrap around at the end, so the
// stream behaves as an endless repetition of the data (epochs follow each other without a
// seam). Immutable after Open and safe to read from many threads. Movable; a Sampler keeps
// a pointer to it, so move it before handing it out, not after.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/data/token_shard.h"

namespace zt {

class TokenStream {
 public:
  // Opens every shard in `paths`. `field_label` names the job field the list came from
  // ("data.train"); errors name the element ("data.train[1]: ...") and keep the shard's
  // error code. InvalidArgument when the list is empty or all shards together hold no tokens.
  static absl::StatusOr<TokenStream> Open(const std::vector<std::string>& paths,
                                          std::string_view field_label);

  TokenStream(TokenStream&&) = default;
  TokenStream& operator=(TokenStream&&) = default;

  // Total tokens over all shards (> 0).
  int64_t size() const { return offsets_.back(); }
  // Copies n tokens starting at `start` (taken modulo size(), negative allowed) into out,
  // wrapping from the last shard's end to the first shard's start as often as needed.
  void Read(int64_t start, int64_t n, int32_t* out) const;
  int32_t max_token() const;
  const std::string& field_label() const { return field_label_; }
  int num_shards() const { return static_cast<int>(shards_.size()); }
  const TokenShard& shard(int i) const { return *shards_[i]; }

  // InvalidArgument naming the first shard with an id >= vocab_size, e.g.
  // "data.train[0] 'x.bin': token id 300 >= model.vocab_size 256".
  absl::Status CheckVocab(int32_t vocab_size,
                          std::string_view vocab_field = "model.vocab_size") const;

 private:
  TokenStream() = default;

  std::string field_label_;
  std::vector<std::unique_ptr<TokenShard>> shards_;
  // offsets_[i] is the stream index of shard i's first token; offsets_.back() is size().
  std::vector<int64_t> offsets_;
};

}  // namespace zt
