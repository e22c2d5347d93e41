// Tokenizer: text <-> token ids, and the loader that picks one from a job's spec string.
//
// Two kinds: ByteTokenizer (one id per byte, vocab 256) and BpeTokenizer (GPT-2-style
// byte-level BPE, worker/data/bpe_tokenizer.h). Both are lossless: Decode(Encode(s)) == s
// for every byte string s, valid UTF-8 or not. Implementations are safe to call from several
// threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace zt {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual std::vector<int32_t> Encode(std::string_view text) const = 0;
  // Ids outside the vocabulary decode to U+FFFD, so a corrupt id is visible, not fatal.
  virtual std::string Decode(absl::Span<const int32_t> tokens) const = 0;
  // One more than the largest id the tokenizer can produce or decode.
  virtual int32_t vocab_size() const = 0;
  // The document separator's id ("<|endoftext|>"), when the vocabulary has one.
  virtual std::optional<int32_t> end_of_text() const { return std::nullopt; }
};

// One token per byte: id = the byte's value.
class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> Encode(std::string_view text) const override;
  std::string Decode(absl::Span<const int32_t> tokens) const override;
  int32_t vocab_size() const override { return 256; }
};

// `spec` is one of:
//   "bytes"                       ByteTokenizer;
//   a Hugging Face tokenizer.json a byte-level BPE (any file name; recognized by its
//                                 "model" object);
//   a GPT-2 vocab.json            with merges.txt beside it;
//   a directory                   holding tokenizer.json, or else vocab.json + merges.txt.
// Errors name the file: NotFound for a missing path or missing merges.txt, InvalidArgument
// for content that is not a byte-level BPE or is malformed (with the entry at fault).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(std::string_view spec);

}  // namespace zt
