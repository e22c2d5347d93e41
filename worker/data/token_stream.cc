#include "worker/data/token_stream.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace zt {

absl::StatusOr<TokenStream> TokenStream::Open(const std::vector<std::string>& paths,
                                              std::string_view field_label) {
  if (paths.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(field_label), ": the list of token shards is empty; name at least one"));
  }
  TokenStream stream;
  stream.field_label_ = std::string(field_label);
  stream.offsets_.push_back(0);
  for (size_t i = 0; i < paths.size(); ++i) {
    absl::StatusOr<std::unique_ptr<TokenShard>> shard = TokenShard::Open(paths[i]);
    if (!shard.ok()) {
      return absl::Status(shard.status().code(), absl::StrCat(std::string(field_label), "[", i,
                                                              "]: ", shard.status().message()));
    }
    stream.offsets_.push_back(stream.offsets_.back() + (*shard)->size());
    stream.shards_.push_back(*std::move(shard));
  }
  if (stream.size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(field_label), ": the ", paths.size(),
                                                   " token shard(s) hold no tokens"));
  }
  return stream;
}

void TokenStream::Read(int64_t start, int64_t n, int32_t* out) const {
  const int64_t total = size();
  int64_t pos = start % total;
  if (pos < 0) pos += total;
  while (n > 0) {
    // The shard holding pos: the last one whose first index is <= pos, which skips empty
    // shards (they share their first index with the next one).
    const size_t s = std::upper_bound(offsets_.begin(), offsets_.end(), pos) - offsets_.begin() - 1;
    const int64_t take = std::min(n, offsets_[s + 1] - pos);
    shards_[s]->Read(pos - offsets_[s], take, out);
    out += take;
    n -= take;
    pos += take;
    if (pos == total) pos = 0;
  }
}

int32_t TokenStream::max_token() const {
  int32_t m = 0;
  for (const auto& shard : shards_) {
    if (shard->size() > 0) m = std::max(m, shard->max_token());
  }
  return m;
}

absl::Status TokenStream::CheckVocab(int32_t vocab_size, std::string_view vocab_field) const {
  for (size_t i = 0; i < shards_.size(); ++i) {
    absl::Status status =
        shards_[i]->CheckVocab(vocab_size, absl::StrCat(field_label_, "[", i, "]"), vocab_field);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

}  // namespace zt
