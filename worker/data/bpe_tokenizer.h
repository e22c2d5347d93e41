// BpeTokenizer: GPT-2-style byte-level BPE.
//
// Encode: split the text with GPT-2's pre-tokenizer regex (PCRE2, UTF-8 + Unicode
// properties); for each piece, start from one symbol per byte (GPT-2's byte-to-unicode
// alphabet, looked up in the vocabulary) and repeatedly merge the adjacent pair with the
// lowest merge rank, leftmost first, until no ranked pair remains. Pieces are cached, since
// natural text repeats its words. Bytes that are not valid UTF-8 never match the regex; each
// such run becomes a piece of its own, so every byte string round-trips.
//
// Special tokens ("<|endoftext|>") are never produced from text: the string is encoded as
// ordinary characters, as tiktoken does unless told otherwise; callers insert the id.
//
// Thread-safe: Encode holds an internal lock for its whole call (the word cache and the
// regex's match buffers); Decode takes no lock.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "worker/data/tokenizer.h"

namespace zt {

class BpeTokenizer final : public Tokenizer {
 public:
  // A Hugging Face tokenizer.json whose model is "BPE" and whose pre-tokenizer is (or
  // contains) "ByteLevel". model.merges may hold "a b" strings or ["a", "b"] pairs.
  // added_tokens count towards vocab_size and decode to their content.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromTokenizerJson(const std::string& path);
  // GPT-2's vocab.json (token -> id) and merges.txt (one "a b" pair a line, most frequent
  // first; a first line starting with "#version" is skipped).
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromVocabAndMerges(
      const std::string& vocab_path, const std::string& merges_path);

  ~BpeTokenizer() override;

  std::vector<int32_t> Encode(std::string_view text) const override;
  std::string Decode(absl::Span<const int32_t> tokens) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(id_to_bytes_.size()); }
  std::optional<int32_t> end_of_text() const override { return end_of_text_; }

  int num_merges() const { return static_cast<int>(merges_.size()); }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;  // the id of the two symbols' concatenation
  };
  struct Regex;  // PCRE2 handles, owned

  BpeTokenizer();
  // Shared by both loaders. `where` names the file in errors; merge_label(i) names merge i
  // ("line 7", "model.merges[5]"), built only when an error needs it.
  absl::Status Build(const std::vector<std::pair<std::string, int64_t>>& vocab,
                     const std::vector<std::pair<std::string, std::string>>& merges,
                     const std::function<std::string(size_t)>& merge_label,
                     const std::vector<std::pair<std::string, int64_t>>& added,
                     const std::string& where);
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;
  void MergeWord(std::string_view word, std::vector<int32_t>* out) const;

  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  int32_t byte_id_[256] = {};
  absl::flat_hash_map<uint64_t, Merge> merges_;
  // Decoded bytes of each id; ids absent from the vocabulary are missing entries.
  std::vector<std::string> id_to_bytes_;
  std::vector<bool> id_present_;
  std::optional<int32_t> end_of_text_;
  std::unique_ptr<Regex> regex_;

  mutable std::mutex mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_;  // guarded by mu_
};

}  // namespace zt
