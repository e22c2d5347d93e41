// DocumentSampler: micro-batches made of whole documents (shards with a document index,
// worker/data/document_index.h), packed several to a row or one to a row with padding.
//
// B = rows per micro-batch, T = tokens per row, S = documents per row at most (padding at a
// row's end counts as one more). A document of L ≤ T tokens occupies L positions of a row:
// its tokens are the inputs and target i is token i+1 of the same document when that token
// is a completion token, else -1 (the cross-entropy's ignore value, kernels/cross_entropy.h);
// the last position predicts nothing, so no target ever crosses a document boundary.
// Padding positions hold token 0 and target -1.
//
// The rows are planned once, at construction, from the documents in stream order: packed,
// each document goes whole into the oldest of the 64 most recently opened rows that has room
// for it, or opens a new row (first fit over a window, so a row's tail pads only when no
// document soon after fits it); unpacked, one document a row. Micro-batch k takes rows k·B … k·B+B−1 of the endless sequence of epochs,
// each epoch the plan's rows in order, or with shuffle in ShuffledOrder(R, EpochSeed(seed, e))
// (worker/data/sampler.h). Like Sampler, the batch is a pure function of k: a resumed run
// continues at its saved step with nothing else to carry.
//
// Thread-safe: Fill may be called concurrently (the permutation cache is locked).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/data/document_index.h"
#include "worker/data/token_stream.h"

namespace zt {

// What a document longer than T becomes.
enum class Overlong {
  kRefuse,    // InvalidArgument naming the shard, the document and both lengths
  kTruncate,  // its first T tokens
};

struct DocumentSamplerOptions {
  int B = 1;
  int T = 1;
  bool pack = true;
  bool shuffle = false;
  uint64_t seed = 0;
  Overlong overlong = Overlong::kRefuse;
  // How errors name the T field and the overlong rule ("data.seq_len", "data.overlong").
  const char* seq_len_field = "data.seq_len";
};

// The document indexes of every shard of `stream`, in order, or nullopt when none of them has
// one (plain token shards). InvalidArgument naming the shards when some have an index and
// others do not (a stream is documents or plain text, not both); ReadDocumentIndex's errors.
absl::StatusOr<std::optional<std::vector<DocumentIndex>>> ReadStreamDocuments(
    const TokenStream& stream);

class DocumentSampler {
 public:
  // `stream` must outlive the sampler; `indexes` are ReadStreamDocuments' (one per shard).
  // InvalidArgument for B or T < 1, or (Overlong::kRefuse) a document longer than T.
  static absl::StatusOr<std::unique_ptr<DocumentSampler>> Create(
      const TokenStream* stream, const std::vector<DocumentIndex>& indexes,
      const DocumentSamplerOptions& options);

  // Writes micro-batch k (k ≥ 0): inputs and targets (B, T) i32 row-major, and when
  // doc_starts is not null the (B, S) document starts of kernels/packing.h (the padding at a
  // row's end is a document of its own; unused entries are T). InvalidArgument for k < 0;
  // the stream's errors.
  absl::Status Fill(int64_t k, int32_t* inputs, int32_t* targets, int32_t* doc_starts) const;
  // How many of micro-batch k's targets Fill writes as counted (≥ 0), from the plan alone: no
  // token is read. The step loop divides the loss by the step's total (token-level mean over
  // every micro-batch and rank, the larger batch's loss). InvalidArgument for k < 0.
  absl::StatusOr<int64_t> CountedTargets(int64_t k) const;

  int B() const { return options_.B; }
  int T() const { return options_.T; }
  // S: the most documents (padding included) any planned row holds.
  int max_documents_per_row() const { return max_docs_; }
  // Rows in one epoch, and the tokens of documents (not padding) they hold.
  int64_t rows() const { return static_cast<int64_t>(row_begin_.size()) - 1; }
  int64_t document_tokens_per_epoch() const { return document_tokens_; }

 private:
  struct Piece {
    int64_t start = 0;  // stream index of the document's first token
    uint32_t length = 0;
    uint32_t prompt_length = 0;
  };
  DocumentSampler(const TokenStream* stream, const DocumentSamplerOptions& options)
      : stream_(stream), options_(options) {}
  int64_t RowOf(int64_t global_row) const;
  absl::Status FillRow(int64_t row, int32_t* inputs, int32_t* targets, int32_t* doc_starts) const;

  const TokenStream* stream_;
  DocumentSamplerOptions options_;
  std::vector<Piece> pieces_;
  std::vector<int64_t> row_begin_;  // row r is pieces_[row_begin_[r], row_begin_[r+1])
  int max_docs_ = 1;
  int64_t document_tokens_ = 0;

  mutable std::mutex mu_;
  struct CachedPermutation {
    int64_t epoch = -1;
    std::shared_ptr<const std::vector<int64_t>> order;
  };
  mutable CachedPermutation cache_[2];  // guarded by mu_
  mutable int next_slot_ = 0;           // guarded by mu_
};

}  // namespace zt
