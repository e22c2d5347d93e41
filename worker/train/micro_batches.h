// MicroBatches: one job field's shards (data.train or data.val) as the step loop's
// micro-batches.
//
// Plain token shards go through Sampler (worker/data/sampler.h): windows of the token stream,
// every target counted, exactly as before documents existed. Shards with a document index
// (`zt prepare --format jsonl`) go through DocumentSampler (worker/data/document_sampler.h):
// whole documents, packed (data.packing) or one a row padded, with prompt tokens, padding and
// each document's last position ignored (target -1). A packed batch also carries its document
// starts and the positions that restart at each document (DocumentPositions), in host memory
// (the trainer copies them up with the tokens: Trainer::UploadBatch).
//
// Not thread-safe: Fill writes the object's own document buffers.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "kernels/tensor.h"
#include "proto/job.pb.h"
#include "worker/data/document_sampler.h"
#include "worker/data/sampler.h"
#include "worker/data/token_stream.h"

namespace zt {

class MicroBatches {
 public:
  struct Options {
    int B = 1;
    int T = 1;
    bool shuffle = false;
    uint64_t seed = 0;
    int32_t vocab_size = 0;  // tokens are checked against it
  };
  // Opens `paths` (the field `label`, "data.train") as data.packing and data.overlong of
  // `data` say. Errors: the stream's and the samplers' (each naming the field), and
  // InvalidArgument when data.packing is set and the shards have no document index.
  static absl::StatusOr<std::unique_ptr<MicroBatches>> Open(const std::vector<std::string>& paths,
                                                            const std::string& label,
                                                            const zerotrain::DataConfig& data,
                                                            const Options& options);

  // Writes micro-batch k's tokens and targets ((B, T) i32 each) and, when packed, its document
  // starts and positions (doc_starts(), positions()). Returns how many targets count (are
  // ≥ 0): B·T for plain shards.
  absl::StatusOr<int64_t> Fill(int64_t k, int32_t* tokens, int32_t* targets);
  // What Fill(k) returns, without reading the data: B·T for plain shards, the document plan's
  // count otherwise (DocumentSampler::CountedTargets).
  absl::StatusOr<int64_t> CountedTargets(int64_t k) const;

  // Whether rows hold several documents each (data.packing on document shards).
  bool packed() const { return packed_; }
  // Whether the shards carry a document index.
  bool documents() const { return documents_ != nullptr; }
  // (B, S) and (B, T) i32 host views of the last Fill's document starts and positions; empty
  // tensors unless packed().
  Tensor doc_starts() const;
  Tensor positions() const;

 private:
  MicroBatches() = default;

  std::optional<TokenStream> stream_;
  std::optional<Sampler> plain_;
  std::unique_ptr<DocumentSampler> documents_;
  bool packed_ = false;
  int B_ = 1, T_ = 1;
  std::vector<int32_t> doc_starts_, positions_;
};

}  // namespace zt
