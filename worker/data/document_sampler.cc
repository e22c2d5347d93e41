#include "worker/data/document_sampler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "worker/data/sampler.h"

namespace zt {

absl::StatusOr<std::optional<std::vector<DocumentIndex>>> ReadStreamDocuments(
    const TokenStream& stream) {
  std::vector<DocumentIndex> indexes;
  int with = -1, without = -1;
  for (int i = 0; i < stream.num_shards(); ++i) {
    ZT_ASSIGN_OR_RETURN(std::optional<DocumentIndex> index,
                        ReadDocumentIndex(stream.shard_path(i), stream.shard_header(i).count));
    if (index.has_value()) {
      if (with < 0) with = i;
      indexes.push_back(std::move(*index));
    } else if (without < 0) {
      without = i;
    }
  }
  if (with < 0) return std::optional<std::vector<DocumentIndex>>();
  if (without >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(stream.field_label(), "[", with, "] '", stream.shard_path(with),
                     "' has a document index (zt prepare --format jsonl) and ",
                     stream.field_label(), "[", without, "] '", stream.shard_path(without),
                     "' has none: a field's shards are all documents or all plain text"));
  }
  return std::optional<std::vector<DocumentIndex>>(std::move(indexes));
}

absl::StatusOr<std::unique_ptr<DocumentSampler>> DocumentSampler::Create(
    const TokenStream* stream, const std::vector<DocumentIndex>& indexes,
    const DocumentSamplerOptions& options) {
  const int64_t T = options.T;
  if (options.B < 1 || T < 1) {
    return absl::InvalidArgumentError(absl::StrCat(stream->field_label(), ": batch ", options.B,
                                                   " x sequence ", T, " must both be >= 1"));
  }
  std::unique_ptr<DocumentSampler> s(new DocumentSampler(stream, options));
  int64_t shard_start = 0;
  for (size_t i = 0; i < indexes.size(); ++i) {
    int64_t start = shard_start;
    for (size_t d = 0; d < indexes[i].documents.size(); ++d) {
      const DocumentSpan& span = indexes[i].documents[d];
      Piece p{.start = start, .length = span.length, .prompt_length = span.prompt_length};
      start += span.length;
      if (p.length > T) {
        if (options.overlong == Overlong::kRefuse) {
          return absl::InvalidArgumentError(absl::StrCat(
              stream->field_label(), "[", i, "] '", stream->shard_path(static_cast<int>(i)),
              "': document ", d, " has ", span.length, " tokens > ", options.seq_len_field, " ", T,
              " (data.overlong REFUSE; TRUNCATE keeps its first ", T, " tokens)"));
        }
        p.length = static_cast<uint32_t>(T);
        p.prompt_length = std::min(p.prompt_length, p.length);
      }
      s->pieces_.push_back(p);
      s->document_tokens_ += p.length;
    }
    shard_start += stream->shard_header(static_cast<int>(i)).count;
  }
  // Rows: one document each, or packed first fit over a window of the kOpenRows most recently
  // opened rows (a document goes to the oldest open row with room; when none has room a new
  // row opens and, past the window, the oldest closes). In-order packing alone leaves a row's
  // tail empty whenever the next document is too long for it; the window fills those tails
  // with later short documents, in a fixed, deterministic order.
  constexpr size_t kOpenRows = 64;
  std::vector<std::vector<int64_t>> rows;  // piece indices per row
  std::vector<int64_t> room;               // free tokens per row
  size_t first_open = 0;
  for (size_t i = 0; i < s->pieces_.size(); ++i) {
    const int64_t len = s->pieces_[i].length;
    size_t r = rows.size();
    if (options.pack) {
      for (size_t c = first_open; c < rows.size(); ++c) {
        if (room[c] >= len) {
          r = c;
          break;
        }
      }
    }
    if (r == rows.size()) {
      rows.emplace_back();
      room.push_back(T);
      if (rows.size() - first_open > kOpenRows) ++first_open;
    }
    rows[r].push_back(static_cast<int64_t>(i));
    room[r] -= len;
  }
  std::vector<Piece> ordered;
  ordered.reserve(s->pieces_.size());
  for (const std::vector<int64_t>& row : rows) {
    s->row_begin_.push_back(static_cast<int64_t>(ordered.size()));
    for (int64_t i : row) ordered.push_back(s->pieces_[i]);
  }
  s->row_begin_.push_back(static_cast<int64_t>(ordered.size()));
  s->pieces_ = std::move(ordered);
  for (int64_t r = 0; r < s->rows(); ++r) {
    int64_t tokens = 0;
    for (int64_t i = s->row_begin_[r]; i < s->row_begin_[r + 1]; ++i)
      tokens += s->pieces_[i].length;
    const int64_t docs = s->row_begin_[r + 1] - s->row_begin_[r] + (tokens < T ? 1 : 0);
    s->max_docs_ = std::max<int>(s->max_docs_, static_cast<int>(docs));
  }
  return s;
}

int64_t DocumentSampler::RowOf(int64_t global_row) const {
  const int64_t R = rows();
  const int64_t epoch = global_row / R, within = global_row % R;
  if (!options_.shuffle) return within;
  std::shared_ptr<const std::vector<int64_t>> order;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const CachedPermutation& c : cache_) {
      if (c.epoch == epoch) order = c.order;
    }
    if (order == nullptr) {
      order = std::make_shared<const std::vector<int64_t>>(
          ShuffledOrder(R, EpochSeed(options_.seed, epoch)));
      cache_[next_slot_] = {.epoch = epoch, .order = order};
      next_slot_ = 1 - next_slot_;
    }
  }
  return (*order)[static_cast<size_t>(within)];
}

absl::Status DocumentSampler::FillRow(int64_t row, int32_t* inputs, int32_t* targets,
                                      int32_t* doc_starts) const {
  const int T = options_.T;
  int pos = 0, s = 0;
  for (int64_t i = row_begin_[row]; i < row_begin_[row + 1]; ++i) {
    const Piece& p = pieces_[i];
    const int len = static_cast<int>(p.length);
    ZT_RETURN_IF_ERROR(stream_->Read(p.start, len, inputs + pos));
    if (doc_starts != nullptr) doc_starts[s] = pos;
    ++s;
    for (int j = 0; j < len; ++j) {
      // Target j is token j+1 of this document, counted only when it is a completion token.
      const bool counted = j + 1 < len && j + 1 >= static_cast<int>(p.prompt_length);
      targets[pos + j] = counted ? inputs[pos + j + 1] : -1;
    }
    pos += len;
  }
  if (pos < T) {
    if (doc_starts != nullptr) doc_starts[s] = pos;
    ++s;
    std::fill(inputs + pos, inputs + T, 0);
    std::fill(targets + pos, targets + T, -1);
  }
  if (doc_starts != nullptr) std::fill(doc_starts + s, doc_starts + max_docs_, T);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> DocumentSampler::CountedTargets(int64_t k) const {
  if (k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("micro-batch index ", k, " must be >= 0"));
  }
  int64_t counted = 0;
  for (int64_t b = 0; b < options_.B; ++b) {
    const int64_t row = RowOf(k * options_.B + b);
    for (int64_t i = row_begin_[row]; i < row_begin_[row + 1]; ++i) {
      // FillRow counts target j when j + 1 < length and j + 1 >= prompt_length: positions
      // max(prompt_length, 1) - 1 … length - 2.
      const int64_t length = pieces_[i].length;
      counted += std::max<int64_t>(0, length - std::max<int64_t>(pieces_[i].prompt_length, 1));
    }
  }
  return counted;
}

absl::Status DocumentSampler::Fill(int64_t k, int32_t* inputs, int32_t* targets,
                                   int32_t* doc_starts) const {
  if (k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("micro-batch index ", k, " must be >= 0"));
  }
  const int64_t T = options_.T;
  for (int64_t b = 0; b < options_.B; ++b) {
    ZT_RETURN_IF_ERROR(FillRow(RowOf(k * options_.B + b), inputs + b * T, targets + b * T,
                               doc_starts == nullptr ? nullptr : doc_starts + b * max_docs_));
  }
  return absl::OkStatus();
}

}  // namespace zt
