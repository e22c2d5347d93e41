// Helpers shared by the data-layer tests: a scratch directory, whole-file byte access for
// corrupting shards, and a tiny hand-written byte-level BPE written in both file formats.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace zt::testing {

// A fresh directory under the test temp dir, removed with everything in it on destruction.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = ::testing::TempDir() + "zt_data_XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed: " << pattern;
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const { return (path_ / name).string(); }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

inline std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// GPT-2's bytes_to_unicode(), written as in openai/gpt-2 encoder.py: the printable bytes keep
// their code point, the rest get 256, 257, ... in byte order. Returns each byte's UTF-8.
inline std::vector<std::string> Gpt2ByteSymbols() {
  std::vector<int> bs;
  for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
  std::vector<int> cp(256, -1);
  for (int b : bs) cp[b] = b;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    if (cp[b] < 0) cp[b] = 256 + n++;
  }
  std::vector<std::string> symbols(256);
  for (int b = 0; b < 256; ++b) {
    const int c = cp[b];
    std::string& s = symbols[b];
    if (c < 0x80) {
      s.push_back(static_cast<char>(c));
    } else {
      s.push_back(static_cast<char>(0xC0 | (c >> 6)));
      s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return symbols;
}

// The symbol string of a byte string ("he" -> "he", " t" -> "Ġt").
inline std::string Sym(const std::string& bytes) {
  static const std::vector<std::string> symbols = Gpt2ByteSymbols();
  std::string out;
  for (unsigned char c : bytes) out += symbols[c];
  return out;
}

// A byte-level BPE small enough to apply by hand. Ids 0..255 are the bytes themselves (id =
// byte value), then one id per merge in rank order, then "<|endoftext|>":
//   rank 0  "h" "e"    -> 256 "he"        rank 7  "e" "l"    -> 263 "el"
//   rank 1  "l" "l"    -> 257 "ll"        rank 8  "o" "Ġ"    -> 264 "oĠ"
//   rank 2  "he" "ll"  -> 258 "hell"      rank 9  "Ġ" "Ġ"    -> 265 "ĠĠ"
//   rank 3  "Ġ" "t"    -> 259 "Ġt"        rank 10 "Ã" "©"    -> 266 "é" (bytes C3 A9)
//   rank 4  "Ġt" "he"  -> 260 "Ġthe"      rank 11 "'" "s"    -> 267 "'s"
//   rank 5  "o" "r"    -> 261 "or"        rank 12 "4" "!"    -> 268 "4!"
//   rank 6  "Ġ" "w"    -> 262 "Ġw"        rank 13 bytes 80 E3 -> 269 (across two U+3000)
//   rank 14 "a" "é"    -> 270 "aé"        id 271 "<|endoftext|>"
// Ranks 8, 9, 12 and 13 join characters that the pre-tokenizer puts in different pieces,
// so they must never apply across a piece boundary; rank 14 applies only when the
// pre-tokenizer sees é as a letter (UTF-8 mode).
struct TinyBpe {
  static constexpr int kEndOfText = 271;
  static constexpr int kVocabSize = 272;

  // Merges as byte strings; the files hold their byte-level symbols.
  static std::vector<std::pair<std::string, std::string>> Merges() {
    return {{"h", "e"},       {"l", "l"}, {"he", "ll"}, {" ", "t"},       {" t", "he"},
            {"o", "r"},       {" ", "w"}, {"e", "l"},   {"o", " "},       {" ", " "},
            {"\xC3", "\xA9"}, {"'", "s"}, {"4", "!"},   {"\x80", "\xE3"}, {"a", "\xC3\xA9"}};
  }

  static nlohmann::json Vocab(bool with_end_of_text) {
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) vocab[Sym(std::string(1, static_cast<char>(b)))] = b;
    const auto merges = Merges();
    for (size_t i = 0; i < merges.size(); ++i) {
      vocab[Sym(merges[i].first + merges[i].second)] = 256 + static_cast<int>(i);
    }
    if (with_end_of_text) vocab["<|endoftext|>"] = kEndOfText;
    return vocab;
  }

  // GPT-2's layout: vocab.json and merges.txt with a "#version" first line.
  static void WriteVocabAndMerges(const std::string& vocab_path, const std::string& merges_path) {
    std::ofstream(vocab_path) << Vocab(/*with_end_of_text=*/true).dump();
    std::ofstream merges(merges_path);
    merges << "#version: 0.2\n";
    for (const auto& [a, b] : Merges()) merges << Sym(a) << " " << Sym(b) << "\n";
  }

  // Hugging Face's layout. "<|endoftext|>" appears only in added_tokens, which must still
  // count towards the vocabulary size. `pair_merges` picks the ["a", "b"] form of merges
  // (newer files) over "a b" strings.
  static void WriteTokenizerJson(const std::string& path, bool pair_merges) {
    nlohmann::json merges = nlohmann::json::array();
    for (const auto& [a, b] : Merges()) {
      if (pair_merges) {
        merges.push_back({Sym(a), Sym(b)});
      } else {
        merges.push_back(Sym(a) + " " + Sym(b));
      }
    }
    nlohmann::json j = {
        {"version", "1.0"},
        {"added_tokens", {{{"id", kEndOfText}, {"content", "<|endoftext|>"}, {"special", true}}}},
        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
        {"decoder", {{"type", "ByteLevel"}}},
        {"model",
         {{"type", "BPE"}, {"vocab", Vocab(/*with_end_of_text=*/false)}, {"merges", merges}}},
    };
    std::ofstream(path) << j.dump(2);
  }
};

}  // namespace zt::testing
