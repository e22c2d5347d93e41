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
  stream.paths_ = paths;
  stream.offsets_.push_back(0);
  for (size_t i = 0; i < paths.size(); ++i) {
    absl::StatusOr<TokenShardHeader> header = ReadTokenShardHeader(paths[i]);
    if (!header.ok()) {
      return absl::Status(header.status().code(), absl::StrCat(std::string(field_label), "[", i,
                                                               "]: ", header.status().message()));
    }
    stream.offsets_.push_back(stream.offsets_.back() + header->count);
    stream.headers_.push_back(*header);
  }
  if (stream.size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(field_label), ": the ", paths.size(),
                                                   " token shard(s) hold no tokens"));
  }
  return stream;
}

TokenStream::TokenStream(TokenStream&& other) noexcept { *this = std::move(other); }

TokenStream& TokenStream::operator=(TokenStream&& other) noexcept {
  if (this == &other) return *this;
  field_label_ = std::move(other.field_label_);
  paths_ = std::move(other.paths_);
  headers_ = std::move(other.headers_);
  offsets_ = std::move(other.offsets_);
  // A stream is moved before it is handed out (header comment), so nobody reads either side.
  mapped_ = std::move(other.mapped_);
  return *this;
}

absl::StatusOr<std::shared_ptr<const TokenShard>> TokenStream::Shard(size_t i) const {
  std::lock_guard<std::mutex> lock(*mu_);
  for (auto it = mapped_.begin(); it != mapped_.end(); ++it) {
    if (it->first != i) continue;
    mapped_.splice(mapped_.begin(), mapped_, it);
    return mapped_.front().second;
  }
  // Mapped under the lock: two readers of one unmapped shard map it once, and the number
  // mapped never passes the bound while a mapping is in flight.
  absl::StatusOr<std::unique_ptr<TokenShard>> opened = TokenShard::Open(paths_[i]);
  if (!opened.ok()) {
    return absl::Status(opened.status().code(),
                        absl::StrCat(field_label_, "[", i, "]: ", opened.status().message()));
  }
  if ((*opened)->size() != headers_[i].count || (*opened)->token_width() != headers_[i].width) {
    return absl::DataLossError(absl::StrCat(
        field_label_, "[", i, "] '", paths_[i], "' changed while the job ran: it held ",
        headers_[i].count, " tokens when the job started and holds ", (*opened)->size(), " now"));
  }
  if (mapped_.size() >= static_cast<size_t>(kMaxMappedShards)) mapped_.pop_back();
  mapped_.emplace_front(i, std::shared_ptr<const TokenShard>(*std::move(opened)));
  return mapped_.front().second;
}

int TokenStream::mapped_shards() const {
  std::lock_guard<std::mutex> lock(*mu_);
  return static_cast<int>(mapped_.size());
}

absl::Status TokenStream::Read(int64_t start, int64_t n, int32_t* out) const {
  const int64_t total = size();
  int64_t pos = start % total;
  if (pos < 0) pos += total;
  while (n > 0) {
    // The shard holding pos: the last one whose first index is <= pos, which skips empty
    // shards (they share their first index with the next one).
    const size_t s = std::upper_bound(offsets_.begin(), offsets_.end(), pos) - offsets_.begin() - 1;
    const int64_t take = std::min(n, offsets_[s + 1] - pos);
    absl::StatusOr<std::shared_ptr<const TokenShard>> shard = Shard(s);
    if (!shard.ok()) return shard.status();
    (*shard)->Read(pos - offsets_[s], take, out);
    out += take;
    n -= take;
    pos += take;
    if (pos == total) pos = 0;
  }
  return absl::OkStatus();
}

int32_t TokenStream::max_token() const {
  int32_t m = 0;
  for (const TokenShardHeader& header : headers_) {
    if (header.count > 0) m = std::max(m, header.max_token);
  }
  return m;
}

absl::Status TokenStream::CheckVocab(int32_t vocab_size, std::string_view vocab_field) const {
  for (size_t i = 0; i < headers_.size(); ++i) {
    absl::Status status = CheckShardVocab(paths_[i], headers_[i], vocab_size,
                                          absl::StrCat(field_label_, "[", i, "]"), vocab_field);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

}  // namespace zt
