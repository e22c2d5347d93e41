#include "worker/train/micro_batches.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/packing.h"
#include "kernels/status_macros.h"

namespace zt {

absl::StatusOr<std::unique_ptr<MicroBatches>> MicroBatches::Open(
    const std::vector<std::string>& paths, const std::string& label,
    const zerotrain::DataConfig& data, const Options& options) {
  std::unique_ptr<MicroBatches> m(new MicroBatches());
  m->B_ = options.B;
  m->T_ = options.T;
  ZT_ASSIGN_OR_RETURN(TokenStream stream, TokenStream::Open(paths, label));
  ZT_RETURN_IF_ERROR(stream.CheckVocab(options.vocab_size));
  m->stream_.emplace(std::move(stream));
  ZT_ASSIGN_OR_RETURN(std::optional<std::vector<DocumentIndex>> indexes,
                      ReadStreamDocuments(*m->stream_));
  if (!indexes.has_value()) {
    if (data.packing()) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.packing: ", label, "[0] '", m->stream_->shard_path(0),
                       "' has no document index (", m->stream_->shard_path(0),
                       ".docs); packing needs shards written by `zt prepare --format jsonl`"));
    }
    m->plain_.emplace(&*m->stream_, options.B, options.T, options.shuffle, options.seed);
    ZT_RETURN_IF_ERROR(m->plain_->Check());
    return m;
  }
  m->packed_ = data.packing();
  ZT_ASSIGN_OR_RETURN(
      m->documents_,
      DocumentSampler::Create(
          &*m->stream_, *indexes,
          {.B = options.B,
           .T = options.T,
           .pack = data.packing(),
           .shuffle = options.shuffle,
           .seed = options.seed,
           .overlong = data.overlong() == zerotrain::DataConfig::TRUNCATE ? Overlong::kTruncate
                                                                          : Overlong::kRefuse}));
  if (m->packed_) {
    m->doc_starts_.assign(static_cast<size_t>(options.B) * m->documents_->max_documents_per_row(),
                          0);
    m->positions_.assign(static_cast<size_t>(options.B) * options.T, 0);
  }
  return m;
}

absl::StatusOr<int64_t> MicroBatches::Fill(int64_t k, int32_t* tokens, int32_t* targets) {
  if (plain_.has_value()) {
    ZT_RETURN_IF_ERROR(plain_->Fill(k, tokens, targets));
    return int64_t{B_} * T_;
  }
  ZT_RETURN_IF_ERROR(documents_->Fill(k, tokens, targets, packed_ ? doc_starts_.data() : nullptr));
  if (packed_) {
    ZT_RETURN_IF_ERROR(
        DocumentPositions(CpuContext(1), {.doc_starts = doc_starts(), .positions = positions()}));
  }
  return std::count_if(targets, targets + int64_t{B_} * T_, [](int32_t t) { return t >= 0; });
}

absl::StatusOr<int64_t> MicroBatches::CountedTargets(int64_t k) const {
  if (plain_.has_value()) return int64_t{B_} * T_;
  return documents_->CountedTargets(k);
}

Tensor MicroBatches::doc_starts() const {
  if (!packed_) return Tensor();
  return Tensor(const_cast<int32_t*>(doc_starts_.data()), DType::kI32,
                {B_, documents_->max_documents_per_row()});
}

Tensor MicroBatches::positions() const {
  if (!packed_) return Tensor();
  return Tensor(const_cast<int32_t*>(positions_.data()), DType::kI32, {B_, T_});
}

}  // namespace zt
